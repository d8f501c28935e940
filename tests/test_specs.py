"""Spec parameters are read as their Config declares them: a value of the wrong type is one SpecError
naming the parameter, the value and what it takes (in every registry, in the commands and when a spec
is read back from a checkpoint), never a silent misreading and never a traceback."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from conftest import make_host

import tokenreduce as tr
from tokenreduce.cli import main
from tokenreduce.core.registry import REGISTRIES, NoParams, Registry, check_params, config_spec
from tokenreduce.models import CheckpointError, build_model, load_model, save_checkpoint
from tokenreduce.models.stems import canonical_stem
from tokenreduce.models.transforms import canonical_transform
from tokenreduce.tasks import build_task


@pytest.mark.parametrize("spec,match", [
    ("evit(keep=0.5, locs=(1,), fuse='False')", "fuse='False' is invalid; fuse takes True or False"),
    ("tome(r=2, prop_attn='no')", "prop_attn='no' is invalid; prop_attn takes True or False"),
    ("tome(r=2, prop_attn=1)", "prop_attn=1 is invalid"),
    ("topk(keep=0.5, locs='13')", "locs='13' is invalid; locs takes a tuple of ints (a string is not a tuple"),
    ("topk(keep=0.5, locs='1, 3')", "locs='1, 3' is invalid; locs takes a tuple of ints"),
    ("topk(keep=0.5, locs=(1, 2.0))", "locs=(1, 2.0) is invalid; locs takes a tuple of ints"),
    ("tome(r=2, r=3)", "parameter 'r' is given more than once"),
    ("tome(r=1.5)", "r=1.5 is invalid; r takes an int or a tuple of ints"),
    ("tome(r=None)", "r=None is invalid; r takes an int or a tuple of ints"),
    ("tome(r=True)", "r=True is invalid"),  # a bool is not an int
    ("random(keep=0.5, locs=(1,), seed=0.5)", "seed=0.5 is invalid; seed takes an int"),
    ("evit(keep='0.5', locs=(1,))", "keep='0.5' is invalid; keep takes a number"),
    ("cropr(r=2, classes=10, score='Logits')", "score='Logits' is invalid; score takes 'logits' or 'softmax'"),
    ("llf(at=-2.0)", "at=-2.0 is invalid; at takes an int"),
    ("topk(keep=0.5, locs='13') + llf()", "locs='13' is invalid"),  # a stage of a composite
])
def test_a_wrongly_typed_parameter_is_refused(spec, match):
    model = make_host("deit")
    with pytest.raises(tr.SpecError, match=re.escape(match)):
        tr.apply(model, spec)
    assert not hasattr(model, "_tokenreduce_patch")


def test_values_are_stored_as_declared():
    """An int where a float is declared is that float; a list is a tuple; one spec, one canonical form."""
    model = tr.apply(make_host("deit"), "evit(keep=1, locs=[1, 2])")
    assert tr.get_info(model).spec == "evit(keep=1.0, locs=(1, 2), fuse=True, counts=None)"
    assert check_params("method tome", tr.get_method("tome").Config, {"r": [2, 0]}) == {"r": (2, 0)}


def test_other_registries_check_their_parameters_too():
    with pytest.raises(tr.SpecError, match="bits=32.0 is invalid; bits takes an int"):
        build_task("hash(bits=32.0)")
    assert build_task("hash(ks=5)").spec().endswith("ks=(5,))")  # ks declares an int or a tuple of ints
    with pytest.raises(tr.SpecError, match="background='yes' is invalid; background takes True or False"):
        build_task("segment(background='yes')")
    with pytest.raises(tr.SpecError, match="norm=None is invalid; norm takes 'bn' or 'none'"):
        canonical_stem("conv(norm=None)")
    with pytest.raises(tr.SpecError, match="init=1 is invalid"):
        canonical_transform("tie_qk(init=1)")


def _entries() -> list[tuple[str, str]]:
    import tokenreduce.models  # noqa: F401
    import tokenreduce.probes  # noqa: F401  (registers every built-in entry)
    import tokenreduce.studies  # noqa: F401
    import tokenreduce.tasks  # noqa: F401

    return [(r.kind, name) for r in REGISTRIES for name in r.names()]


@pytest.mark.parametrize("kind,name", _entries())
def test_every_registered_config_parses_its_defaults_and_round_trips(kind, name):
    registry = next(r for r in REGISTRIES if r.kind == kind and name in r.names())
    config = registry.config(name)
    defaults = {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}
    assert check_params(f"{kind} {name}", config, defaults) == defaults, "a default its annotation refuses"
    try:
        spec = registry.canonical(name)
    except tr.SpecError:  # a Config that needs a parameter: its smoke form (experiments) spells one out
        smoke = getattr(registry.get(name), "smoke", None)
        assert smoke, f"{kind} {name}: the bare name is refused and there is no smoke form to try"
        spec = registry.canonical(tr.core.registry.format_spec(name, smoke))
    _, _, cfg = registry.resolve(spec)
    assert registry.canonical(spec) == spec and config_spec(name, cfg) == spec


CKPT_MODEL = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32,
                                                         "depth": 2, "num_heads": 2, "in_chans": 1, "num_classes": 10}}


@pytest.mark.parametrize("spec,match", [("tome(r=1.5)", "r=1.5 is invalid"),
                                        ("evit(keep=0.5, locs=(0,), fuse='False')", "fuse='False' is invalid")])
def test_a_spec_read_back_from_a_checkpoint_is_checked_too(tmp_path: Path, spec, match):
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, build_model(CKPT_MODEL), meta={"model": CKPT_MODEL, "spec": spec})
    with pytest.raises(CheckpointError, match=match):
        load_model(path)


def _one_line_error(capsys, argv: list[str], match: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"tokenreduce {argv[0]}: error: ") and match in err, err


@pytest.mark.parametrize("argv", [
    ["inspect", "--model", "test_vit", "--img-size", "64", "--spec", "tome(r=1.5)"],
    ["train", "--model", "test_vit", "--img-size", "64", "--spec", "tome(r=1.5)", "--epochs", "1"],
])
def test_commands_exit_2_with_one_line(capsys, tmp_path, argv):
    _one_line_error(capsys, [*argv, *(["--out", str(tmp_path / "run")] if argv[0] == "train" else [])],
                    "r=1.5 is invalid; r takes an int or a tuple of ints")
    assert not (tmp_path / "run").exists()


def test_format_spec_round_trips_any_literal():
    """The spec grammar alone (no registry): numbers, tuples, a list (read back as a tuple), None,
    strings with quotes, booleans."""
    params = {"keep": 0.5, "locs": (1, 2), "extra": [1, 2], "flag": None, "s": "a'b", "on": True}
    assert tr.parse_spec(tr.core.registry.format_spec("any", params)) == ("any", {**params, "extra": (1, 2)})


def test_a_registry_given_for_a_while_is_read_by_name_and_never_listed():
    """``Registry.reading``: while inside, a lookup by name (get, config, resolve) finds the given registry's
    entries too (the tests' own studies and experiments); ``names`` lists the registry's own only."""
    home, given = Registry("widget"), Registry("widget")
    home.register("built_in")(len)
    given.register("own")(max)
    with home.reading(given):
        assert (home.get("own"), home.config("own"), home.resolve("own")[:2]) == (max, NoParams, ("own", max))
        assert home.get("built_in") is len and home.names() == ["built_in"]
    with pytest.raises(tr.SpecError, match="unknown widget 'own'; valid widgets: built_in"):
        home.get("own")
