"""bench: analytic MACs against torch.utils.flop_counter, the speed harness's bookkeeping, reports.

No assertion here is about absolute speed or speed ratios: the machine is shared and noisy.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import timm
import torch
from conftest import TINY, make_host, supplied
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.adapters.timm_vit import check_host
from tokenreduce.bench import (
    Case,
    count_macs,
    flop_counter_macs,
    format_table,
    matched_random,
    measure_speed,
    provenance,
    write_json,
)
from tokenreduce.bench.speed import paired_ratio
from tokenreduce.core.method import format_spec, matched_spec
from tokenreduce.core.schedule import Schedule


def spec_of(name: str, params: dict) -> str:
    return format_spec(name, params)


def method_specs() -> list[str]:
    """Per registered method: its zero-reduction spec and its example spec (tiny 4-block model)."""
    specs = []
    for name in tr.list_methods():
        cls = tr.get_method(name)
        specs += [spec_of(name, cls.zero), spec_of(name, cls.example)]
    return specs


def assert_close(analytic: int, measured: int, tol: float = 0.01) -> None:
    assert abs(analytic - measured) <= tol * measured, f"analytic {analytic} vs flop_counter {measured}"


@pytest.mark.parametrize("host", ["deit", "distilled", "registers", "avgpool", "siglip"])
def test_unpatched_macs_match_flop_counter(host):
    model = make_host(host)
    report = count_macs(model)
    assert report.total == flop_counter_macs(model)  # no side products: exact
    assert report.spec is None and report.scoring == 0
    assert report.tokens_per_block == [64 + model.num_prefix_tokens] * 4


@pytest.mark.parametrize("spec", method_specs())
def test_patched_macs_match_flop_counter(spec):
    model = tr.apply(make_host("deit"), spec)
    report = count_macs(model)
    with supplied(model):
        assert_close(report.total, flop_counter_macs(model))
    info = tr.get_info(model)
    assert report.tokens_per_block == info.schedule.tokens_per_block(info.host.num_prefix)
    assert report.tokens_per_block == info.tokens_per_block  # the real counts of the forward just run
    assert report.spec == info.spec


@pytest.mark.parametrize("spec", ["tome(r=8)", "topk(keep=0.5, locs=(1, 2), score='received')"])
def test_an_attention_pool_head_is_counted_over_the_tokens_it_pools(spec):
    """SigLIP's 'map' head projects keys and values of every final token: fewer tokens, fewer MACs there,
    as torch.utils.flop_counter measures (and the mean attention received is priced as computed)."""
    model = tr.apply(make_host("siglip"), spec)
    report = count_macs(model)
    assert report.total == flop_counter_macs(model)
    assert report.head < count_macs(make_host("siglip")).head


@pytest.mark.parametrize("where", ["attn", "block"])
def test_where_decides_the_mlp_tokens(where):
    model = tr.apply(make_host("deit"), f"topk(keep=0.5, locs=(1,), where={where!r})")
    b = count_macs(model).blocks[1]
    assert (b.tokens_in, b.tokens_out) == (65, 33)
    assert b.tokens_mlp == (33 if where == "attn" else 65)
    assert b.mlp == b.tokens_mlp * 2 * 64 * 256


def test_block_formulas():
    """qkv N D 3D, attention 2 N^2 D, proj N D D, MLP N D hidden 2, stem, head."""
    report = count_macs(make_host("deit"))
    n, d, hidden = 65, 64, 256
    b = report.blocks[0]
    assert (b.qkv, b.attn, b.proj, b.mlp) == (n * d * 3 * d, 2 * n * n * d, n * d * d, n * d * hidden * 2)
    assert report.stem == 64 * 3 * 4 * 4 * d
    assert report.head == d * 10


def test_scoring_side_products_are_counted():
    base = count_macs(make_host("deit")).blocks
    model = tr.apply(make_host("deit"), "tome(r=8)")
    blocks = count_macs(model).blocks
    m = 64
    assert blocks[0].scoring == (m + 1) // 2 * (m // 2) * 32  # ToMe matching, head_dim 32
    tr.apply(model, "random(counts=(56, 48, 40, 32), locs=(0, 1, 2, 3))")
    assert all(b.scoring == 0 for b in count_macs(model).blocks)
    tr.apply(model, "evit(keep=0.5, locs=(1,))")
    evit = count_macs(model).blocks[1]
    assert evit.scoring == 65 * 64  # the CLS row; the fused token is a weighted sum, not a MAC
    tr.apply(model, "ctp(counts=(32,), locs=(1,))")
    assert count_macs(model).blocks[1].scoring == 65 * 64  # the CLS row; head norms are norms, not MACs
    tr.apply(model, "dynamicvit(keep=0.5, locs=(1,))")
    assert count_macs(model).blocks[1].scoring == 64 * (64 * 64 + 64 * 32 + 32 * 16 + 16 * 2)  # its predictor
    assert base[1].scoring == 0


def test_published_deit_small_macs():
    """DeiT-S: 4.6 G unpatched, EViT 0.7 3.0 G, ToMe r=13 2.7 G, CTP 2.5 G (docs/methods.md, section "Conventions")."""
    model = timm.create_model("deit_small_patch16_224").eval()
    g = {}
    for spec in [None, "evit(keep=0.7, locs=(3, 6, 9))", "tome(r=13)", "ctp()"]:
        if spec:
            tr.apply(model, spec)
        g[spec] = count_macs(model).total / 1e9
    assert g[None] == pytest.approx(4.6, abs=0.05)
    assert g["evit(keep=0.7, locs=(3, 6, 9))"] == pytest.approx(3.0, abs=0.05)
    assert g["tome(r=13)"] == pytest.approx(2.7, abs=0.05)
    assert g["ctp()"] == pytest.approx(2.5, abs=0.05)


def test_patched_macs_reject_other_image_size():
    model = tr.apply(make_host("deit"), "tome(r=8)")
    with pytest.raises(tr.TokenReduceError, match="patches"):
        count_macs(model, img_size=64)


@pytest.mark.parametrize("spec", ["evit(keep=0.5, locs=(1, 2))", "tome(r=8)", "ctp()"])
def test_matched_random_has_the_same_token_counts(spec):
    model = make_host("deit")
    rnd = matched_random(model, spec)
    assert not hasattr(model, "_tokenreduce_patch")  # left untouched
    tr.apply(model, spec)
    want = tr.get_info(model).schedule
    tr.apply(model, rnd)
    got = tr.get_info(model).schedule
    assert (got.counts, got.where) == (want.counts, want.where)


def test_matched_spec_needs_a_schedule_a_pruner_can_replay():
    shrink = Schedule(64, (64, 48, 48, 32), (1, 3), "block")
    assert tr.build_reducer(matched_spec(shrink)).bind(check_host(make_host("deit"))) == shrink
    with pytest.raises(tr.SpecError, match="replays"):
        matched_spec(Schedule(64, (64, 32, 64, 64), (1, 2), "attn"))  # grows back: no pruner replays it


def test_measure_speed_bookkeeping():
    model = make_host("deit").train()
    threads = torch.get_num_threads()
    lines = []
    results = measure_speed(
        model, [Case("tome", "tome(r=8)"), Case("zero", "tome(r=0)")], batch=2, warmup=1, repeats=2,
        min_run_s=0.0, threads=1, progress=lines.append,
    )
    assert [r.label for r in results] == ["unpatched", "tome", "zero"]
    assert results[0].speedup == 1.0 and results[0].latency_speedup == 1.0
    for r in results:
        assert len(r.img_per_s_runs) == len(r.latency_ms_runs) == 2
        assert r.img_per_s > 0 and r.latency_ms > 0 and r.img_per_s_iqr >= 0
        assert r.speedup > 0 and r.latency_speedup > 0
    assert len(lines) == 3
    assert not hasattr(model, "_tokenreduce_patch") and model.training
    assert torch.get_num_threads() == threads


def test_measure_speed_rejects_bad_input():
    model = tr.apply(make_host("deit"), "tome(r=8)")
    with pytest.raises(tr.TokenReduceError, match="unpatched"):
        measure_speed(model, [Case("x", "tome(r=8)")])
    with pytest.raises(tr.SpecError, match="beyond"):
        measure_speed(make_host("deit"), [Case("x", "evit(locs=(9,))")], repeats=1)
    with pytest.raises(tr.TokenReduceError, match="share one input"):
        other = VisionTransformer(**{**TINY, "img_size": 64}).eval()
        measure_speed(make_host("deit"), [Case("x", None, model=other)], repeats=1)


def test_a_case_with_its_own_model_is_timed_on_it_and_is_not_the_baseline():
    model, own = make_host("deit"), make_host("deit").train()
    results = measure_speed(model, [Case("own", None, model=own), Case("tome", "tome(r=8)", model=own)], batch=2,
                            warmup=0, repeats=1, min_run_s=0.0, threads=1)
    assert [r.label for r in results] == ["unpatched", "own", "tome"] and own.training
    assert not hasattr(own, "_tokenreduce_patch")


def test_paired_ratio_is_the_median_of_same_round_ratios():
    assert paired_ratio([2.0, 30.0, 4.0], [1.0, 10.0, 1.0]) == 3.0


def test_report_table_json_provenance(tmp_path):
    table = format_table([{"a": "x", "b": 1.5}, {"a": "yy", "b": None}], [("a", "A"), ("b", "B")])
    assert table.splitlines()[0].split() == ["A", "B"] and "-" in table.splitlines()[-1]
    prov = provenance(argv=["tokenreduce", "bench"], threads=1, batch_sizes=[4, 1], seed=0)
    for key in ("command", "git", "torch", "timm", "python", "platform", "cpu", "threads", "dtype",
                "batch_sizes", "seed"):
        assert key in prov
    path = write_json(tmp_path / "sub" / "r.json", {"provenance": prov})
    assert json.loads(path.read_text())["provenance"]["command"] == "tokenreduce bench"
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left


@pytest.mark.parametrize("host", ["distilled", "registers"])
@pytest.mark.parametrize("spec", ["tome(r=8)", "evit(keep=0.5, locs=(1, 2))"])
def test_patched_macs_on_several_prefix_tokens(host, spec):
    model = tr.apply(make_host(host), spec)
    assert_close(count_macs(model).total, flop_counter_macs(model))


# ----------------------------------------------------------------------------- no method knowledge


def named_methods(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for every method name a string of ``source`` spells (docstrings and f-string parts
    included): the whole string, a spec ``name(``, or a quoted reference (``name``, 'name', `name`).
    English words that happen to be method names ("a random subset") do not count."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in names:
                quoted = rf"(?<![\w.]){re.escape(name)}\(|[`'\"]{re.escape(name)}[`'\"]"
                if node.value.strip() == name or re.search(quoted, node.value):
                    found.append((node.lineno, name))
    return found


def test_bench_knows_no_method_by_name():
    """bench/ reads what methods declare (costs, families, learned); it never spells a method's name."""
    names = set(tr.list_methods())
    bench = Path(tr.__file__).parent / "bench"
    bad = [f"bench/{path.name}:{line} spells {name!r}" for path in sorted(bench.glob("*.py"))
           for line, name in named_methods(path.read_text(), names)]
    assert not bad, "\n".join(bad)
    # the check itself sees specs, bare names and quoted references, not English words
    hits = named_methods('"""a ``tome`` note, a random subset."""\nx = f"topk(keep={1})"\ny = "evit"\n', names)
    assert sorted(n for _, n in hits) == ["evit", "tome", "topk"]

