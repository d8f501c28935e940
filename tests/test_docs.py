"""The project documents itself: no pointer leaves the repository, docs/methods.md and its pages cover every
method, the CLI reference renders every flag of the real parser, and the README stays a front door.

Scanned: the text files of the repository (``git ls-files`` where git is available, else a walk) under
src/, tests/, docs/, results/ and README.md. A pointer outside is a path into the team's private
notes folder, a bare notes file name, or an issue number. The patterns are assembled from pieces
so that this file does not match them itself (it is scanned like every other).
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

import tokenreduce as tr
from tokenreduce.cli import build_parser
from tokenreduce.commands.reference import cli_markdown, subcommands

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs/methods.md"
SCANNED = ("README.md", "pyproject.toml", "src", "tests", "docs", "results")
TEXT = {".py", ".md", ".sh", ".json", ".txt", ".toml", ".csv", ".log", ".cfg", ".yaml", ".yml", ".rst"}
SKIP_DIRS = {"__pycache__", ".venv", ".pytest_cache", ".ruff_cache"}

_NOTES = "sha" + "red"
_ISSUE = "iss" + "ue"
#: (what it is, pattern): each a pointer to something a reader of the repository cannot open.
FORBIDDEN = [
    ("the private notes folder", re.compile(r"\.\./" + _NOTES + r"\b")),
    ("a private notes file", re.compile(_NOTES + r"/(?:methods|DESIGN)\.md")),
    ("a notes file outside docs/", re.compile(r"(?<![\w/])" + "meth" + r"ods\.md")),
    ("the design notes", re.compile(r"\b" + "DES" + r"IGN\.md")),
    ("an issue number", re.compile(r"\b" + _ISSUE + r"s?\s*#?\s*\d+", re.IGNORECASE)),
]
#: A pointer into the methods page: the page's path, a comma, the word section and a quoted heading text.
SECTION_REF = re.compile(r"docs/methods\.md, section [\"']([^\"']+)[\"']")


def text_files() -> list[Path]:
    """The repository's text files in SCANNED: those git does not ignore if git knows the tree, else all on disk."""
    try:
        cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SCANNED]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
    if not paths:  # no git (e.g. a copied tree): walk it
        for top in SCANNED:
            p = ROOT / top
            paths += [p] if p.is_file() else [f for f in p.rglob("*") if not SKIP_DIRS & set(f.parts)]
    return sorted(p for p in paths if p.is_file() and (p.suffix in TEXT or p.name == "README.md"))


def headings() -> list[str]:
    assert DOC.is_file(), "docs/methods.md is missing"
    return [line for line in DOC.read_text().splitlines() if line.startswith("#")]


def test_the_patterns_catch_what_they_should_and_not_themselves():
    bad = ["see ../" + _NOTES + "/x", _NOTES + "/methods.md", "(meth" + "ods.md, Sec. 4)",
           "DES" + "IGN.md", "(" + _ISSUE + " 7)", _ISSUE.capitalize() + " 11", _ISSUE + " #3"]
    good = ["docs/methods.md", "a shared VM", "shared by every image", "the tissue 3", "issues with speed"]
    for s in bad:
        assert any(p.search(s) for _, p in FORBIDDEN), s
    for s in good:
        assert not any(p.search(s) for _, p in FORBIDDEN), s
    assert not any(p.search(Path(__file__).read_text()) for _, p in FORBIDDEN)


def test_no_pointer_leaves_the_repository():
    files = text_files()
    assert ROOT / "README.md" in files and Path(__file__).resolve() in files
    hits = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            hits += [f"{path.relative_to(ROOT)}:{n}: {what}: {m.group(0)!r}"
                     for what, p in FORBIDDEN for m in p.finditer(line)]
    assert not hits, "pointers outside the repository (point at docs/methods.md instead):\n" + "\n".join(hits)


@pytest.mark.parametrize("paper", ["EET", "ImagePiece", "Token Cropr", "BSPF", "Baselines"])
def test_the_methods_page_has_a_section_per_paper(paper):
    assert any(paper in h for h in headings()), f"docs/methods.md has no section on {paper}"


@pytest.mark.parametrize("method", tr.list_methods())
def test_the_methods_page_has_a_section_per_registered_method(method):
    spelled = re.compile(r"`" + re.escape(method) + r"(\(.*?\))?`")
    assert any(spelled.search(h) for h in headings()), f"no heading of docs/methods.md names `{method}`"


def test_section_pointers_name_existing_sections():
    refs = [(path, m.group(1)) for path in text_files() for m in SECTION_REF.finditer(path.read_text(errors="replace"))]
    assert refs, "no file points into docs/methods.md by section"
    missing = [f"{path.relative_to(ROOT)}: {name!r}" for path, name in refs if not any(name in h for h in headings())]
    assert not missing, "pointers to sections docs/methods.md does not have:\n" + "\n".join(missing)


def test_relative_links_of_the_methods_page_resolve():
    links = re.findall(r"\]\(([^)\s]+)\)", DOC.read_text())
    local = [t.split("#")[0] for t in links if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert local
    broken = [t for t in local if not (DOC.parent / t).exists()]
    assert not broken, f"docs/methods.md links to files that do not exist: {broken}"


def test_every_registered_method_has_a_page_or_a_section_of_one():
    pages = {p.stem: p.read_text() for p in (ROOT / "docs/methods").glob("*.md")}
    stage_of = {"llf": "cropr"}  # a stage documented with the method it was published with
    missing = [m for m in tr.list_methods()
               if not any(h.startswith("#") and f"`{m}(" in h
                          for h in pages.get(stage_of.get(m, m), "").splitlines())]
    assert not missing, f"no docs/methods/<name>.md page (with a heading naming the spec) for: {missing}"
    nav = (ROOT / "mkdocs.yml").read_text()
    assert not [n for n in pages if f"methods/{n}.md" not in nav], "a method page missing from mkdocs.yml's nav"


# ----------------------------------------------------------------------------- the generated CLI reference


def _walk(parser: argparse.ArgumentParser, prog: str = "tokenreduce"):
    """(command path, parser) for the parser and every subcommand below it, depth first."""
    yield prog, parser
    for name, sub in subcommands(parser).items():
        yield from _walk(sub, f"{prog} {name}")


def _section(md: str, prog: str) -> str:
    """The part of the reference under the heading of ``prog``, up to the next subcommand heading."""
    m = re.search(r"^#+ `" + re.escape(prog) + r"`\n(.*?)(?=^#+ `tokenreduce |\Z)", md, re.S | re.M)
    assert m, f"the CLI reference has no section for {prog!r}"
    return m.group(1)


def test_the_cli_reference_renders_every_subcommand_and_every_option():
    parser = build_parser()
    md = cli_markdown(parser)
    commands = list(_walk(parser))
    assert len(commands) > 5, "the walk found no subcommands"
    missing = []
    for prog, p in commands[1:]:
        text = _section(md, prog)
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            missing += [f"{prog}: {n}" for n in names if f"`{n}" not in text]
            if action.help and action.help != argparse.SUPPRESS and action.option_strings:
                first = " ".join(action.help.split()).split("%(")[0][:40].replace("|", "\\|")
                missing += [f"{prog}: help of {action.option_strings[0]}"] if first not in text else []
    assert not missing, "flags the CLI reference does not render:\n" + "\n".join(missing)


def test_the_cli_reference_fails_on_a_flag_it_does_not_render():
    parser = build_parser()
    sub = subcommands(parser)["bench"]
    sub.add_argument("--a-flag-added-later", metavar="X", help="new")
    assert "`--a-flag-added-later X`" in _section(cli_markdown(parser), "tokenreduce bench")


def test_the_cli_page_and_the_results_page_are_generated_not_copied():
    hooks = (ROOT / "docs/hooks.py").read_text()
    cli, results = (ROOT / "docs/cli.md").read_text(), (ROOT / "docs/results.md").read_text()
    assert "<!-- cli-reference -->" in cli and "<!-- cli-reference -->" in hooks
    assert "<!-- report -->" in results and "REPORT.md" in hooks
    assert "--batch-size" not in cli, "docs/cli.md holds a copy of the reference: it is generated at build time"
    assert "docs/hooks.py" in (ROOT / "mkdocs.yml").read_text()


# ----------------------------------------------------------------------------- the README


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "README.md is longer than 250 lines: move the detail to docs/"
    assert "pip install -q -e '.[test]' && pytest -q" in readme
    assert "pip install -q -e . && tokenreduce demo" in readme
    ci = (ROOT / ".ci/run").read_text()
    assert "pip install -q -e '.[test]' && pytest -q" in ci, "CI no longer runs the README's test command"
    start, end = "<!-- report:headline -->", "<!-- /report:headline -->"
    assert start in readme and end in readme and readme.index(start) < readme.index(end)
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"[a-z]+:|#", t)]
    broken = [t for t in links if not (ROOT / t).exists()]
    assert not broken, f"README.md links to files that do not exist: {broken}"


def test_pip_alone_installs_and_the_wheel_carries_what_the_package_reads():
    """The README's two set-up commands need neither apt nor root (the data step is optional, explained
    beside them); the wheel's metadata (version, licence, readme) and package data name files that exist,
    every shipped reference among them; CI builds the wheel and runs its command from a fresh venv."""
    tomllib = pytest.importorskip("tomllib")
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set up"):readme.index("## Use it")]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, re.S)
    assert len(commands) == 2 and commands[0].endswith("tokenreduce demo") and commands[1].endswith("pytest -q")
    assert not any(w in c for c in commands for w in ("apt", "sudo")), "a set-up command needs apt or root"
    assert "dataset-fashion-mnist" in setup and "TOKENREDUCE_DATA" in setup  # the optional data step, explained
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    meta = project["project"]
    assert meta["version"] and meta["license"] == "Apache-2.0" and (ROOT / meta["readme"]).is_file()
    assert all((ROOT / f).is_file() for f in meta["license-files"])
    patterns = project["tool"]["setuptools"]["package-data"]["tokenreduce"]
    package = ROOT / "src/tokenreduce"
    shipped = [p.relative_to(package).as_posix() for p in (package / "references").iterdir() if p.is_file()]
    assert shipped and all(any(Path(f).match(pat) for pat in patterns) for f in shipped)
    ci = (ROOT / ".ci/run").read_text()
    assert "python -m build --wheel" in ci and "pip\" install -q dist/tokenreduce-*.whl" in ci
    assert all(f"venv/bin/tokenreduce {c}" in ci for c in ("--help", "list", "bench"))
