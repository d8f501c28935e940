"""The layers of the architecture (README, "Architecture"), read from the source with ``ast`` (nothing is
imported but tokenreduce):

    cli/commands -> bench/train/study/studies/probes/visualize -> tasks/data/models -> adapters -> methods -> core

A module never imports (absolutely or relatively, at the top or inside a function) a package of a
higher layer; ``core`` imports no timm; and no registered method's name is spelled as a string
outside ``methods/`` (the knowledge lives with the method: bench, tasks and commands read the
declarations of ``Reducer`` and address methods only through spec strings they are given).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tokenreduce

SRC = Path(tokenreduce.__file__).resolve().parent
#: Layer of each top-level part of the package (file or sub-package); higher = further from core.
#: ``api`` is the adapter's public face, ``visualize`` draws with it like bench does, the package
#: ``__init__`` re-exports core, methods and api; ``models`` holds precision.py (device and amp), which
#: bench, train and the commands all use.
LAYERS = {
    "core": 0, "methods": 1, "adapters": 2, "api": 2, "__init__": 2,
    "tasks": 3, "data": 3, "models": 3,
    "bench": 4, "train": 4, "study": 4, "studies": 4, "probes": 4, "visualize": 4,
    "commands": 5, "cli": 5,
}
#: Above all: these never import train/, bench/, commands/ or the cli.
LOW = ("core", "methods", "data", "adapters", "models", "tasks")
HIGH = ("train", "bench", "commands", "cli")


def modules() -> list[tuple[str, Path, ast.Module]]:
    """(dotted name, path, syntax tree) of every module of the package."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(("tokenreduce", *parts[:-1])) if parts[-1] == "__init__" else ".".join(("tokenreduce", *parts))
        out.append((name, path, ast.parse(path.read_text(), filename=str(path))))
    return out


def part(module: str) -> str | None:
    """The top-level part of the package that ``module`` belongs to ('core', 'api', ...), None outside it."""
    bits = module.split(".")
    if bits[0] != "tokenreduce":
        return None
    return bits[1] if len(bits) > 1 else "__init__"


def imported(name: str, path: Path, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the module ``name``, wherever it stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _source(package, node)
            # `from .. import train` imports the sub-package itself
            out += [(node.lineno, f"{target}.{a.name}") if _is_module(f"{target}.{a.name}") else (node.lineno, target)
                    for a in node.names]
    return out


def _source(package: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in ``package`` reads from."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


#: The adapter's own patch record and its attribute: besides every ``_``-prefixed name, what only
#: adapters/ reads. The rest of the package talks to a host through adapters/hosts.py's public
#: interface (is_patched, reducer_of, info, patched, reapply, capture) and tokenreduce.api.
ADAPTER_PRIVATE = frozenset({"get_patch", "ATTR", "Patch"})


def _underscored(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def _adapter_private(attr: str) -> bool:
    return _underscored(attr) or attr in ADAPTER_PRIVATE


def privates(name: str, path: Path, tree: ast.Module, within: str = "tokenreduce",
             private=_underscored) -> list[tuple[int, str]]:
    """(line, what) where the module ``name`` imports a ``private`` name from a module under ``within``
    (``from .classify import _capture``) or reads one off such a module it imported (``tables._split``,
    ``tokenreduce.adapters.hosts.get_patch``). A private *module* (``from . import _dist``) is its
    package's to share."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    bound, out = set(), []  # local names bound to a module under `within`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _source(package, node)
            for a in node.names:
                full = f"{source}.{a.name}"
                if _is_module(full):
                    if full.startswith(within):
                        bound.add(a.asname or a.name)
                elif source.startswith(within) and private(a.name):
                    out.append((node.lineno, f"imports {a.name} from {source}"))
        elif isinstance(node, ast.Import):
            bound.update(a.asname for a in node.names if a.asname and a.name.startswith(within))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = ast.unparse(node.value)
            if owner in bound or owner.startswith(f"{within}."):
                out.append((node.lineno, f"reads {owner}.{node.attr}"))
    return out


def adapter_privates(name: str, path: Path, tree: ast.Module) -> list[tuple[int, str]]:
    """:func:`privates` of ``tokenreduce.adapters.*``, whose patch record (:data:`ADAPTER_PRIVATE`) is
    private too."""
    return privates(name, path, tree, within="tokenreduce.adapters", private=_adapter_private)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module -> modules it imports): its strongly connected components of
    more than one module (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                out.append(sorted(component))

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return sorted(out)


def spelled(tree: ast.Module, names: set[str]) -> list[ast.Constant]:
    """String constants of ``tree`` equal to one of ``names`` (docstrings and f-string parts included)."""
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def _is_module(dotted: str) -> bool:
    bits = dotted.split(".")
    if bits[0] != "tokenreduce":
        return False
    rel = SRC.joinpath(*bits[1:])
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


MODULES = modules()


def import_graph() -> dict[str, set[str]]:
    """Module -> the tokenreduce modules it imports, at its top or inside a function (a registry's
    ``importlib.import_module`` load is no import statement, and no edge)."""
    names = {name for name, _, _ in MODULES}
    return {name: {t for _, t in imported(name, path, tree) if t in names and t != name}
            for name, path, tree in MODULES}


def climbs(name: str, path: Path, tree: ast.Module) -> list[str]:
    """Each import of the module ``name`` into a higher layer than its own, as a message."""
    mine = LAYERS.get(part(name), 99)
    return [f"{path.relative_to(SRC)}:{line} ({part(name)}, layer {mine}) imports {target} "
            f"({part(target)}, layer {LAYERS[part(target)]})"
            for line, target in imported(name, path, tree)
            if part(target) is not None and LAYERS.get(part(target), -1) > mine]


def test_every_part_of_the_package_has_a_layer():
    parts = {part(name) for name, _, _ in MODULES}
    assert parts <= set(LAYERS), f"give these a layer in LAYERS: {sorted(parts - set(LAYERS))}"


def test_no_lower_layer_imports_train_bench_commands_or_cli():
    bad = [f"{path.relative_to(SRC)}:{line} imports {target}"
           for name, path, tree in MODULES if part(name) in LOW
           for line, target in imported(name, path, tree) if part(target) in HIGH]
    assert not bad, "\n".join(bad)


def test_no_module_imports_a_higher_layer():
    bad = [message for name, path, tree in MODULES for message in climbs(name, path, tree)]
    assert not bad, "\n".join(bad)


def test_precision_sits_below_bench_and_train():
    """Where and in what precision a model runs (``--device``, ``--amp``: models/precision.py) is a utility of
    bench, train, visualize and the commands; it lives a layer below them all, so that reaching up from it into
    train (train.dist's device check, once) is a climb :func:`climbs` refuses."""
    homes = [(name, path) for name, path, _ in MODULES if name.rpartition(".")[2] == "precision"]
    assert [name for name, _ in homes] == ["tokenreduce.models.precision"]
    assert LAYERS["models"] < min(LAYERS[p] for p in ("bench", "train", "visualize", "commands"))
    name, path = homes[0]
    assert climbs(name, path, ast.parse("def f():\n    from ..train.dist import setup\n")) == [
        "models/precision.py:2 (models, layer 3) imports tokenreduce.train.dist (train, layer 4)"]


def test_the_study_engine_never_imports_the_declarations():
    """study/ (the engine) runs what studies/ (the declarations) declares and learns it from the Study it is
    handed; only the registry loads the declarations, by ``importlib`` (no import statement), so the engine never
    depends on one paper's module, at its top or inside a function."""
    bad = [f"{path.relative_to(SRC)}:{line} imports {target}"
           for name, path, tree in MODULES if part(name) == "study"
           for line, target in imported(name, path, tree) if part(target) == "studies"]
    assert not bad, "\n".join(bad)
    # the check sees a function-level import
    study = next((name, path) for name, path, _ in MODULES if name == "tokenreduce.study.page")
    assert imported(*study, ast.parse("def f():\n    from ..studies.beds import LENGTH\n")) == [
        (2, "tokenreduce.studies.beds")]


def test_core_imports_no_timm():
    bad = [f"{path.relative_to(SRC)}:{line} imports {target}"
           for name, path, tree in MODULES if part(name) == "core"
           for line, target in imported(name, path, tree) if target.split(".")[0] == "timm"]
    assert not bad, "\n".join(bad)


def test_no_module_outside_adapters_reads_an_adapter_private_name():
    bad = [f"{path.relative_to(SRC)}:{line} {what}"
           for name, path, tree in MODULES if part(name) != "adapters"
           for line, what in adapter_privates(name, path, tree)]
    assert not bad, "use the public host interface (adapters/hosts.py, tokenreduce.api):\n" + "\n".join(bad)


def test_no_module_reads_another_modules_private_name():
    bad = [f"{path.relative_to(SRC)}:{line} {what}" for name, path, tree in MODULES
           for line, what in privates(name, path, tree)]
    assert not bad, "make the name public (with a docstring) or use the module's public one:\n" + "\n".join(bad)


def unhinted(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of each public function of ``tree`` (module level, or a method of a public class) with
    a parameter (other than self / cls) or a return without a type hint."""
    out = []
    for node in tree.body:
        owner = node.name + "." if isinstance(node, ast.ClassDef) and not node.name.startswith("_") else ""
        found = [node] if isinstance(node, ast.FunctionDef) else node.body if owner else []
        for f in found:
            if not isinstance(f, ast.FunctionDef) or f.name.startswith("_"):
                continue
            args = [a for a in (*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs) if a.arg not in ("self", "cls")]
            if f.returns is None or any(a.annotation is None for a in args):
                out.append((f.lineno, owner + f.name))
    return out


def test_public_functions_have_type_hints():
    bad = [f"{path.relative_to(SRC)}:{line} {what}" for _, path, tree in MODULES for line, what in unhinted(tree)]
    assert not bad, "\n".join(bad)
    assert unhinted(ast.parse("def f(x) -> int: ...\nclass A:\n    def g(self) -> None: ...\n    def h(self, y): ...\n"
                              "def _p(z): ...\n")) == [(1, "f"), (4, "A.h")]


def test_no_import_circle():
    """No import circle anywhere in the package, counting the imports inside functions (a late import
    hides a circle, it does not remove it): a module that needs another's service at run time gets it
    passed in or by registration (``importlib.import_module`` of a registry's entry is no import)."""
    graph = import_graph()
    assert len(graph) > 100
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


#: Where a study names things in its own namespace: its name, its arms' keys and display labels, and the arm labels its
#: expectations, measures and probes refer to. Such a label may equal a method's name ("bspf", the arm
#: that runs bspf's spec); the study reaches the method only through spec strings.
STUDY_LABELS = {"arm", "baseline", "reference", "finetuned", "reads"}


def study_labels(tree: ast.Module) -> set[int]:
    """ids of the string constants of ``tree`` that are study or arm labels (:data:`STUDY_LABELS`)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_study":
            out |= {id(a) for a in node.args}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Arm" and node.args:
            out.add(id(node.args[0]))  # the arm's display label
        elif isinstance(node, ast.keyword) and node.arg in STUDY_LABELS:
            out |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "").strip("_").lower() == "arms"
                                                  for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            out |= {id(k) for k in node.value.keys}
    return out


def test_no_method_name_is_spelled_outside_methods():
    names = set(tokenreduce.list_methods())
    assert names, "no method is registered"
    bad = [f"{path.relative_to(SRC)}:{node.lineno} spells {node.value!r}"
           for name, path, tree in MODULES if part(name) != "methods"
           and not name.startswith("tokenreduce.studies.")  # declarations: arms named as they test
           for labels in [study_labels(tree) if part(name) in ("study", "probes") else set()]
           for node in spelled(tree, names) if id(node) not in labels]
    assert not bad, "\n".join(bad)


def test_study_labels_are_exempt_and_nothing_else():
    tree = ast.parse('register_study("bspf")\narms = {"bspf": Arm(spec="x")}\nExpect(arm="bspf")\nf("bspf")\n')
    assert [n.lineno for n in spelled(tree, {"bspf"}) if id(n) not in study_labels(tree)] == [4]


@pytest.mark.parametrize(("source", "module", "expected"), [
    ("from ..train.loop import fit", "tokenreduce.data.transforms", "tokenreduce.train.loop"),
    ("from .. import bench", "tokenreduce.core.ops", "tokenreduce.bench"),
    ("from .. import apply", "tokenreduce.core.ops", "tokenreduce"),
    ("def f():\n    import tokenreduce.commands.eval", "tokenreduce.core.ops", "tokenreduce.commands.eval"),
    ("from .state import TokenState", "tokenreduce.core.ops", "tokenreduce.core.state"),
])
def test_imports_are_resolved(source, module, expected):
    """The checker itself: relative, package-level and function-local imports all resolve."""
    path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
    assert [t for _, t in imported(module, path, ast.parse(source))] == [expected]


def test_the_checks_catch_a_violation():
    tree = ast.parse("import random\nx = 'random'\ndef f():\n    from ...bench import macs\n")
    name, path = "tokenreduce.methods.sub.x", SRC / "methods" / "sub" / "x.py"
    assert [t for _, t in imported(name, path, tree)] == ["random", "tokenreduce.bench.macs"]
    # the string is seen, the stdlib import of the same name is not
    assert [(n.lineno, n.value) for n in spelled(tree, {"random", "macs"})] == [(2, "random")]


@pytest.mark.parametrize(("check", "module", "source", "expected"), [
    (adapter_privates, "tokenreduce.bench.x",
     "from ..adapters.timm_vit import get_patch, check_host\nfrom ..adapters import timm_vit as tv, hosts\n"
     "import tokenreduce.adapters.common\nx = tv._ATTR\ny = hosts.is_patched\n"
     "def f():\n    from ..adapters.common import ATTR\n    return tokenreduce.adapters.common.Patch\n",
     [(1, "imports get_patch from tokenreduce.adapters.timm_vit"), (4, "reads tv._ATTR"),
      (7, "imports ATTR from tokenreduce.adapters.common"), (8, "reads tokenreduce.adapters.common.Patch")]),
    (privates, "tokenreduce.tasks.x",  # a private module (_dist) is its package's to share; torch's are not ours
     "from .classify import _capture, capture\nfrom . import _dist\nfrom ..study import tables\n"
     "import tokenreduce.core.ops\nx = tables._split\ny = _dist.rank\nz = tokenreduce.core.ops._cache\n"
     "w = torch._dynamo\n",
     [(1, "imports _capture from tokenreduce.tasks.classify"), (5, "reads tables._split"),
      (7, "reads tokenreduce.core.ops._cache")]),
])
def test_the_private_name_checks_catch_each_form(check, module, source, expected):
    path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
    assert sorted(check(module, path, ast.parse(source))) == expected


def test_the_circle_check_finds_every_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert circles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    tree = ast.parse("from .common import attach\ndef f():\n    from .hosts import remove\n")
    name, path = "tokenreduce.adapters.hf_vit", SRC / "adapters" / "hf_vit.py"
    assert [t for _, t in imported(name, path, tree)] == ["tokenreduce.adapters.common", "tokenreduce.adapters.hosts"]


def walk(start: str, graph: dict[str, set[str]]) -> set[str]:
    """The modules importing ``start`` can load: every module its imports reach, at the top of a module or
    inside a function, with the packages above each (importing a.b.c imports a and a.b)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        bits = module.split(".")
        todo += [".".join(bits[:i]) for i in range(1, len(bits))] + sorted(graph.get(module, ()))
    return seen


def room(module: str) -> str:
    """The room a module stands in: its package, or itself for a package or a module at the top of the
    package (``tokenreduce.api``, ``tokenreduce.visualize``)."""
    bits = module.split(".")
    package = SRC.joinpath(*bits[1:], "__init__.py").is_file()
    return module if package or len(bits) <= 2 else ".".join(bits[:-1])


def side_hops(modules: set[str], graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(from part, to part) of each import among ``modules`` between two top-level parts where the second is
    not in a strictly lower layer (sideways within a layer, or up)."""
    return {(part(a), part(b)) for a in modules for b in graph.get(a, ()) if part(a) != part(b)
            and LAYERS.get(part(b), 99) >= LAYERS.get(part(a), 99)}


#: The most rooms and side hops each command's walk may take. train, eval and demo as before the
#: ``--device`` work (which added a room, the top-level precision module, and three hops through it);
#: study as measured on the new floor (study/, studies/ and probes/ as three parts).
WALK_CEILINGS = {"train": (11, 6), "eval": (11, 6), "demo": (12, 7), "study": (13, 11)}


@pytest.mark.parametrize("command", sorted(WALK_CEILINGS))
def test_a_commands_walk_stays_short(command):
    """How much of the house one command needs, read from the source: no longer than before the device work.

    The walk of ``tokenreduce.commands.<command>`` is every tokenreduce module its imports reach, at the top
    of a module or inside a function, with the packages above each (:func:`walk`). A *room* is the package a
    walked module stands in, or the module itself at the top of the package (:func:`room`): ``core``,
    ``bench``, ``api``, ... A *side hop* is a pair of top-level parts (a, b) with a walked module of a
    importing one of b where b is not in a strictly lower layer of :data:`LAYERS` (:func:`side_hops`): a
    step across the house rather than down it. Neither may exceed the command's :data:`WALK_CEILINGS`."""
    graph = import_graph()
    modules = walk(f"tokenreduce.commands.{command}", graph)
    rooms, hops = {room(m) for m in modules}, side_hops(modules, graph)
    most_rooms, most_hops = WALK_CEILINGS[command]
    assert len(rooms) <= most_rooms, f"{command} enters {len(rooms)} rooms (at most {most_rooms}): {sorted(rooms)}"
    assert len(hops) <= most_hops, f"{command} takes {len(hops)} side hops (at most {most_hops}): {sorted(hops)}"


def test_the_walk_measure():
    graph = {"tokenreduce.commands.x": {"tokenreduce.bench.a"}, "tokenreduce.bench.a": {"tokenreduce.train.b"},
             "tokenreduce.train.b": {"tokenreduce.core.ops"}}
    modules = walk("tokenreduce.commands.x", graph)
    assert modules == {"tokenreduce", "tokenreduce.commands", "tokenreduce.commands.x", "tokenreduce.bench",
                       "tokenreduce.bench.a", "tokenreduce.train", "tokenreduce.train.b", "tokenreduce.core",
                       "tokenreduce.core.ops"}
    assert {room(m) for m in modules} == {"tokenreduce", "tokenreduce.commands", "tokenreduce.bench",
                                          "tokenreduce.train", "tokenreduce.core"}
    assert room("tokenreduce.api") == "tokenreduce.api" and room("tokenreduce.models.precision") == "tokenreduce.models"
    assert side_hops(modules, graph) == {("bench", "train")}
