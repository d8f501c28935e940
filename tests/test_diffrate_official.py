"""``diffrate`` is the published deployed path: the official prune-then-merge, its reading of the kept
numbers, its similarity-weighted attention mass, and the published schedules.

The reference below is written from the description of the official code (docs/methods/diffrate.md;
github.com/OpenGVLab/DiffRate, the eval branch of DiffRateBlock.forward and DiffRateAttention in
DiffRate/patch/deit.py, get_merge_func in DiffRate/merge.py): one image at a time, every block sorting
its tokens by class-token attention as the official code does, with Python lists and loops, sharing
nothing with ``core/ops.py`` but timm's own sub-modules.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_host
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.adapters.timm_vit import check_host
from tokenreduce.methods.diffrate import SCHEDULES, DiffRate


def _merge_one_image(t: torch.Tensor, mass: torch.Tensor, kept: int, p: int,
                     weighted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ranked most attended first (prefix first), t (N, C), mass (N,): the tokens from rank ``kept`` on
    go into their most cosine-similar token among the first ``kept`` (prefix tokens receive nothing): a plain
    mean of the tokens, their masses added times that cosine (``weighted``; else added as they are)."""
    unit = [row / row.norm() for row in t]
    rows = [t[k].clone() for k in range(kept)]
    count = [1] * kept
    new_mass = [mass[k].clone() for k in range(kept)]
    for s in range(kept, t.shape[0]):
        sims = [float(unit[s] @ unit[k]) if k >= p else -float("inf") for k in range(kept)]
        j = max(range(kept), key=lambda k: sims[k])
        rows[j] = rows[j] + t[s]
        count[j] += 1
        new_mass[j] = new_mass[j] + mass[s] * (sims[j] if weighted else 1.0)
    return torch.stack([r / c for r, c in zip(rows, count, strict=True)]), torch.stack(new_mass)


def reference_diffrate(model: torch.nn.Module, images: torch.Tensor, prune: list[int], merge: list[int],
                       similarity_mass: bool = True) -> tuple[torch.Tensor, list[int]]:
    """Logits of DiffRate on a timm ViT, image by image, with the official kept numbers ``prune`` and
    ``merge`` (tokens kept after pruning / merging per block, prefix tokens included); and the tokens
    leaving each block. ``similarity_mass=False``: merged tokens add their masses unweighted, ToMe's sizes (a
    control showing that the similarity weighting is seen)."""
    p = model.num_prefix_tokens
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    logits, counts = [], []
    for t in tokens:  # (N, C)
        mass = torch.ones(t.shape[0], dtype=t.dtype)
        counts = []
        for blk, n_prune, n_merge in zip(model.blocks, prune, merge, strict=True):
            attn = blk.attn
            n, heads = t.shape[0], attn.num_heads
            q, k, v = attn.qkv(blk.norm1(t)).reshape(n, 3, heads, -1).permute(1, 2, 0, 3)  # (H, N, d) each
            q, k = attn.q_norm(q), attn.k_norm(k)
            probs = ((q @ k.transpose(-2, -1)) * attn.scale + mass.log()).softmax(-1)  # (H, N, N)
            o = (probs @ v).transpose(0, 1).reshape(n, -1)
            t = t + blk.ls1(attn.proj(o))
            cls_row = probs[:, 0].mean(0)  # (N,) head mean of the class token's row
            ranked = list(range(p)) + sorted(range(p, n), key=lambda i: -float(cls_row[i]))
            t, mass = t[ranked], mass[ranked]  # every block sorts, most attended first
            t, mass = t[:n_prune], mass[:n_prune]  # prune: a slice (a no-op where n_prune >= the tokens)
            if n_merge < n_prune and n_merge < t.shape[0]:
                t, mass = _merge_one_image(t, mass, n_merge, p, weighted=similarity_mass)
            t = t + blk.ls2(blk.mlp(blk.norm2(t)))
            counts.append(t.shape[0])
        logits.append(model.forward_head(model.norm(t)[None])[0])
    return torch.stack(logits), counts


def _official(prune_patches: list[int], merge_patches: list[int], p: int) -> tuple[list[int], list[int]]:
    return [c + p for c in prune_patches], [c + p for c in merge_patches]


SCHEDULE_CASES = {
    # prune then merge in every block
    "both": ([60, 50, 40, 30], [52, 44, 36, 20]),
    # a merge number above the pruned count (no merge at block 1), counts that rise again (blocks 2, 3)
    "official-quirks": ([60, 50, 56, 30], [52, 52, 36, 40]),
    "prune-only": ([60, 50, 40, 30], [64, 64, 64, 64]),
    "merge-only": ([64, 64, 64, 64], [52, 44, 36, 20]),
}


@pytest.mark.parametrize("host", ["deit", "distilled", "registers"])
@pytest.mark.parametrize("case", list(SCHEDULE_CASES))
def test_diffrate_equals_the_reference_in_float64(host: str, case: str) -> None:
    model = make_host(host).double()
    p = model.num_prefix_tokens
    prune, merge = SCHEDULE_CASES[case]
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, counts = reference_diffrate(model, images, *_official(prune, merge, p))
        tr.apply(model, f"diffrate(prune={tuple(prune)}, merge={tuple(merge)})")
        got = model(images)
    assert tr.get_info(model).tokens_per_block == counts
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.allclose(want, tr.remove(model)(images), atol=1e-3)  # tokens were reduced: the check can fail


def test_the_similarity_weighted_mass_is_what_the_reference_checks() -> None:
    """Merged tokens' attention mass is m_k + sum m_s cos(s, k), not a patch count: a reference that does not
    weight it gives other logits, so the equality above tests the weighting."""
    model = make_host("deit").double()
    prune, merge = SCHEDULE_CASES["both"]
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, _ = reference_diffrate(model, images, *_official(prune, merge, 1))
        other, _ = reference_diffrate(model, images, *_official(prune, merge, 1), similarity_mass=False)
        tr.apply(model, f"diffrate(prune={tuple(prune)}, merge={tuple(merge)})", trace=True)
        got = model(images)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (got - other).abs().max() > 1e-4
    info = tr.get_info(model)  # the TokenState's sizes still count patches
    torch.testing.assert_close(info.sizes, info.snapshots[max(info.snapshots)].sum(-1))


# ----------------------------------------------------------------------------- the published schedules


def _vit(depth: int, img_size: int) -> torch.nn.Module:
    """A narrow timm ViT of a published schedule's shape (patch 4: img_size 56 -> 196 patches, 64 -> 256)."""
    torch.manual_seed(0)
    return VisionTransformer(img_size=img_size, patch_size=4, embed_dim=16, depth=depth, num_heads=1,
                             num_classes=10, mlp_ratio=1.0).eval()


def _official_tokens(prune: tuple[int, ...], merge: tuple[int, ...]) -> list[int]:
    """Tokens leaving each block as the official code runs the lists: slice to P, merge down to M where M < P."""
    out, n = [], prune[0]
    for a, b in zip(prune, merge, strict=True):
        n = min(n, a)
        if b < a:
            n = min(n, b)
        out.append(n)
    return out


def test_the_default_is_deit_s_at_2_9_gmacs() -> None:
    model = tr.apply(_vit(12, 56), "diffrate()")
    assert tr.get_info(model).schedule.tokens_per_block(1) == [197, 194, 176, 156, 141, 133, 121, 107, 88, 64, 56, 3]
    with torch.no_grad():
        model(torch.randn(2, 3, 56, 56))
    assert tr.get_info(model).tokens_per_block == [197, 194, 176, 156, 141, 133, 121, 107, 88, 64, 56, 3]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_a_published_schedule_gives_its_kept_counts_per_block(name: str) -> None:
    prune, merge = SCHEDULES[name]
    depth, patches = len(prune), prune[0] - 1
    model = tr.apply(_vit(depth, 4 * int(patches**0.5)), f"diffrate(schedule={name!r})")
    want = _official_tokens(prune, merge)
    assert tr.get_info(model).schedule.tokens_per_block(1) == want
    if depth == 12:  # a forward of each 12-block one (the deeper ones: the schedule alone)
        with torch.no_grad():
            model(torch.randn(1, 3, 56, 56))
        assert tr.get_info(model).tokens_per_block == want


def test_published_numbers_as_the_official_file_has_them() -> None:
    assert len(SCHEDULES) == 28 and SCHEDULES["deit_s-2.9"] == ((197, 196, 190, 168, 150, 139, 129, 117, 99, 78, 58, 3),
                                                               (197, 194, 176, 156, 141, 133, 121, 107, 88, 64, 56, 3))
    assert SCHEDULES["mae_h-103.4"][0][:3] == (257, 256, 255) and len(SCHEDULES["mae_l-42.3"][1]) == 24


def test_the_budget_family_is_the_schedules_of_the_hosts_shape() -> None:
    """Mildest first by the official FLOPs count, exact in order on a ViT with DeiT's MLP ratio 4 (bench/budgets.py
    sorts the members by their counted MACs in any case)."""
    from tokenreduce.bench import count_macs

    torch.manual_seed(0)
    model = VisionTransformer(img_size=56, patch_size=4, embed_dim=64, depth=12, num_heads=2, num_classes=10).eval()
    family = DiffRate.budget_family(check_host(model))
    assert {tr.parse_spec(s)[1]["schedule"] for s in family} == {
        n for n in SCHEDULES if n.split("-")[0] in ("deit_t", "deit_s", "deit_b", "mae_b")}
    speedups = []
    base = count_macs(model).total
    for spec in family:
        tr.apply(model, spec)
        speedups.append(base / count_macs(model).total)
        tr.remove(model)
    assert speedups == sorted(speedups), "mildest first"
    assert DiffRate.budget_family(check_host(make_host("deit"))) == []  # no published schedule of that shape


@pytest.mark.parametrize(("spec", "words"), [
    ("diffrate(schedule='deit_s-2.8')", ["unknown schedule 'deit_s-2.8'", "deit_s-2.9", "mae_h-124.5"]),
    ("diffrate(schedule='deit_s-2.9', prune=(64, 64, 64, 64))", ["not both"]),
])
def test_bad_specs_name_the_valid_choices(spec: str, words: list[str]) -> None:
    with pytest.raises(tr.SpecError) as e:
        tr.build_reducer(spec)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize(("spec", "words"), [
    ("diffrate()", ["'deit_s-2.9' (the default) was searched for 12 blocks of 196 patches", "4 blocks of 64",
                    "for it: none", "prune=/merge="]),
    ("diffrate(schedule='mae_l-31.0')", ["24 blocks of 196", "deit_t-0.6"]),
    ("diffrate(prune=(60, 50))", ["prune has 2 entries", "one per block (4)"]),
    ("diffrate(merge=(65, 60, 50, 40))", ["merge=(65, 60, 50, 40) has 65", "[1, 64]", "subtract 1"]),
    ("diffrate(prune=(60, 0, 50, 40))", ["has 0", "[1, 64]"]),
])
def test_a_schedule_that_does_not_fit_the_model_is_a_clear_error(spec: str, words: list[str]) -> None:
    with pytest.raises(tr.SpecError) as e:
        tr.apply(make_host("deit"), spec)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_published_schedule_on_a_model_of_its_shape_names_the_ones_that_fit() -> None:
    with pytest.raises(tr.SpecError) as e:
        tr.apply(_vit(12, 56), "diffrate(schedule='mae_h-83.7')")
    assert "32 blocks of 256" in str(e.value) and "for it: deit_t-0.6, " in str(e.value)
