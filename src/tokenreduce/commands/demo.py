"""``tokenreduce demo``: the built-in default run, from a fresh clone, on the CPU.

1. the reference model of the test bed (``--testbed``, :data:`TESTBEDS`): on the scenes the
   ``scenes-vit`` checkpoint shipped with the package; on Fashion-MNIST the cached ``fmnist-vit``
   checkpoint, else a short version of its recipe trained into the cache (a checkpoint: an
   interrupted demo resumes it, a second demo reuses it);
2. every registered training-free method (learned ones are skipped, with a note) at the specs a speed
   model expects closest to the test bed's targets (1.5x and 2x on the scenes, also 2.5x on
   Fashion-MNIST), random over 3 seeds. The picks do not hang on single timings: per method, speed-up =
   MACs ratio ** b, b calibrated once per run from paired rounds of a few specs chosen by MACs alone,
   as a median that rounds slowed by other work do not move (bench/budgets.py, rule 'measured');
3. top-1, MACs, img/s, latency and speed-ups of all of them in one interleaved run (bench/evaluation.py):
   a pick measured there outside the band of its target (settings.BAND, 0.25x: half the gap between
   targets) is flagged in the table ("on target": NO, and a line naming it) and drawn apart in
   pareto.png, not compared as an equal; a published schedule searched for another model says which;
4. the table on stdout with the standard error of a top-1 on that many images; results.json,
   results.csv, pareto.png and per-method visualisations of a few test images in ``--out``.
   Progress goes to stderr.

``--quick`` is a seconds-long smoke run of the same pipeline on the chosen test bed: a tiny model trained
briefly (:data:`QUICK_TRAIN`), few test images, budgets and timings (:data:`QUICK`). Its numbers mean nothing.

Threads: all the cores torch uses by default (``torch.get_num_threads()``: the physical cores, or
OMP_NUM_THREADS when set), ``--threads`` overrides. The load average is not consulted: it is a
one-minute trailing mean, still high on a fresh machine from the install that just finished, so it
says nothing about the cores free now (it once made a newcomer's first demo run on 1 thread).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bench.settings import BAND, SPEED
from ..bench.settings import QUICK as SPEED_QUICK
from ..core.errors import TokenReduceError
from . import checks, vocab


@dataclass(frozen=True)
class Testbed:
    """What the demo runs on: the reference recipe (its shipped or cached checkpoint), the dataset,
    a short stand-in trained when no reference exists (None: the reference must exist), the tiny
    ``--quick`` model, how many test images the full demo evaluates and its target speed-ups."""

    recipe: str
    data: str
    quick_model: dict[str, Any]
    subset: int | None
    short: dict[str, Any] | None = None
    budgets: str = "1.5,2,2.5"


def _tiny(img_size: int) -> dict[str, Any]:
    return {"name": "vit_tiny_patch16_224",
            "kwargs": {"img_size": img_size, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32,
                       "depth": 4, "num_heads": 2, "mlp_ratio": 2.0}}


#: ``--testbed``: the scene test bed (a 12-block, 196-patch reference shipped with the package: nothing
#: to train; 1000 test scenes and two targets: a standard error of 1.5 points on top-1, less on the
#: differences between rows, which share the images), or the 28x28 Fashion-MNIST one (its reference from
#: the cache, else a short stand-in trained now, about 75% top-1).
TESTBEDS = {
    "scenes": Testbed("scenes-vit", "fmnist_scenes", _tiny(56), subset=1000, budgets="1.5,2"),
    "fmnist": Testbed("fmnist-vit", "fashion_mnist", _tiny(28), subset=None,
                      short={"epochs": 2, "subset": 30000, "eval_subset": 2000, "batch_size": 64,
                             "warmup_epochs": 0.1}),
}
DEFAULT_TESTBED = "scenes"
QUICK_TRAIN = {"epochs": 1, "batch_size": 64, "lr": 2e-3, "warmup_epochs": 0.2, "subset": 512, "eval_subset": 200}
FULL = {"short_subset": 5000, "seeds": "0,1,2", "rule": "measured",
        "images": 3,
        "speed": {**SPEED, "repeats": 7}}
QUICK = {"subset": 200, "short_subset": 200, "budgets": "1.5,2", "seeds": "0,1", "rule": "macs", "images": 2,
         "speed": {**SPEED_QUICK, "batch": 8, "repeats": 2}}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="the built-in default: every training-free method at 1.5x/2x on the scene test bed",
        description="Evaluate every registered training-free method at the specs closest to 1.5x and 2x speed-up on "
        "the scene test bed's reference (a 12-block, 196-patch ViT shipped with the package; --testbed fmnist: the "
        "28x28 Fashion-MNIST one, cached or a short version trained now): table, results.json/csv, pareto.png and "
        "visualisations. Specs are picked by a speed model per method (speed-up = MACs ratio ** b, b calibrated by "
        "paired timing rounds, robust to other work on the machine); all picks are then timed in one interleaved "
        f"run, and a pick measured more than {BAND:g}x from its target is flagged, not compared as an equal.",
    )
    vocab.add_out_dir(p, default="runs/demo")
    p.add_argument("--testbed", choices=sorted(TESTBEDS), default=DEFAULT_TESTBED,
                   help="test bed: 'scenes' (one garment on clutter, 56x56, a 12-block 196-patch reference shipped "
                   "with the package) or 'fmnist' (28x28 Fashion-MNIST, 49 patches, 6 blocks) (default: %(default)s)")
    vocab.renamed(p, "--data", "--testbed", "demo runs on a built-in test bed, not a dataset")
    vocab.add_quick(p, f"a tiny model trained on {QUICK_TRAIN['subset']} images, {QUICK['subset']} test images, "
                    f"{len(QUICK['budgets'].split(','))} budgets, short timings")
    vocab.add_threads(p)
    vocab.add_device(p, note="a reference trained now trains there too")
    vocab.add_amp(p)
    scenes, fmnist = TESTBEDS["scenes"], TESTBEDS["fmnist"]
    p.add_argument("--subset", type=int, help=f"test images (default: a fixed {scenes.subset} scenes; on fmnist all "
                   f"10000 with the cached reference, a fixed {FULL['short_subset']} with the short one; "
                   f"{QUICK['subset']} with --quick)")
    vocab.add_budgets(p, f"default {scenes.budgets} on the scenes, {fmnist.budgets} on fmnist; "
                      f"quick {QUICK['budgets']}")
    vocab.add_seeds(p, default=None, note=f"default {FULL['seeds']}; quick {QUICK['seeds']}")
    p.set_defaults(func=run)


def default_threads() -> int:
    """The demo's thread count without --threads: ``torch.get_num_threads()``, torch's own default
    (one per physical core, hyper-threads left out since they slow matrix kernels down; or what
    OMP_NUM_THREADS / torch.set_num_threads set). ``os.cpu_count()`` would count logical CPUs and
    ignore both the CPU affinity and OMP_NUM_THREADS."""
    import torch

    return torch.get_num_threads()


def _train(cfg_fields: dict[str, Any], note: str) -> Path:
    from ..bench.evaluation import log
    from ..train.loop import TrainConfig, train

    log(note)
    metrics = train(TrainConfig.from_dict({**cfg_fields, "resume": True}))
    return Path(metrics["checkpoint"])


def reference(quick: bool, threads: int, bed: Testbed, device: str | None = None) -> tuple[Path, str, bool]:
    """(checkpoint, how it was obtained, whether it is the full reference)."""
    from ..train.recipes import cache_dir, default_out, get_recipe, reference_checkpoint

    if quick:
        out = cache_dir() / f"demo-quick-{bed.data}"
        cfg = {**QUICK_TRAIN, "model": bed.quick_model, "data": bed.data, "out": str(out), "threads": threads,
               "device": device, "download": True, "quiet": True}
        note = f"quick mode: a tiny ViT trained on {QUICK_TRAIN['subset']} {bed.data} images into {out} (seconds)"
        return _train(cfg, note), "tiny model (quick)", False
    try:
        return reference_checkpoint(bed.recipe), f"reference {bed.recipe}", True
    except TokenReduceError:
        if bed.short is None:
            raise
    out = cache_dir() / f"{bed.recipe}-short"
    short = bed.short
    cfg = {**get_recipe(bed.recipe), **short, "out": str(out), "threads": threads, "device": device,
           "download": True}
    note = (f"no trained reference model at {default_out(bed.recipe)}/model.safetensors, so the demo trains a "
            f"short version of it now: {short['epochs']} epochs on {short['subset']} training images (4-5 "
            f"minutes on 2 cores) into {out}; an interrupted run resumes there and later demos reuse it. The full "
            f"reference (higher accuracy, about an hour on 2 cores): tokenreduce train --recipe {bed.recipe}")
    return _train(cfg, note), f"short {bed.recipe} ({short['epochs']} epochs on {short['subset']} images)", False


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench import evaluation as ev
    from ..bench.budgets import check_targets
    from ..bench.report import provenance
    from ..visualize import draw

    t0 = time.perf_counter()
    mode = QUICK if args.quick else FULL
    bed = TESTBEDS[args.testbed]
    targets = check_targets(ev.parse_list(args.budgets or mode.get("budgets", bed.budgets), "--budgets"))
    seeds = ev.parse_list(args.seeds or mode["seeds"], "--seeds", int)
    if not seeds:
        raise TokenReduceError("give at least one seed")
    checks.threads(args.threads)
    args.device = checks.device(args.device)
    out = checks.writable_dir(args.out)
    if args.threads is None:
        args.threads = default_threads()
        ev.log(f"using {args.threads} threads (torch's default; --threads N overrides)")
    torch.set_num_threads(args.threads)
    speed = {**mode["speed"], "threads": args.threads}

    ckpt, origin, full = reference(args.quick, args.threads, bed, args.device)
    t_ref = time.perf_counter() - t0
    ev.log(f"reference: {ckpt} ({origin}), ready after {t_ref:.0f} s")
    n_test = args.subset or (mode.get("subset", bed.subset) if full else mode["short_subset"])
    # the demo: the evaluation entry with its own defaults (every training-free method at the budgets)
    res = ev.evaluate(ev.EvalRequest(ckpt, targets=targets, rule=mode["rule"], seeds=seeds, speed=speed,
                                     download=True, subset=n_test, device=args.device, amp=args.amp))
    ref, data, data_info = res.ref, res.data, res.data.info
    wall = time.perf_counter() - t0
    print(f"tokenreduce demo: {origin}, {data_info['name']} ({data_info['which']}), batch {speed['batch']} "
          f"(latency: batch 1), {ev.threads_text(args.threads)}, stochastic methods over seeds {seeds}")
    rows = res.rows
    print(ev.table(rows))
    if rows and rows[0]["metric"] == "top1":
        print(f"standard error of a top-1 near the unpatched {rows[0]['value']:.1f}% on {data_info['n']} images: "
              f"{ev.binomial_se(rows[0]['value'], data_info['n']):.1f} points (one row; two rows differ by less "
              "noise than that, since they score the same images)")
    for name, why in res.skipped.items():
        print(f"not shown: {name} ({why})")

    info = {
        "provenance": provenance(argv=args.argv, threads=args.threads, device=args.device, amp=args.amp,
                                 batch_sizes=[speed["batch"], 1],
                                 seed=seeds[0], seeds=seeds, quick=args.quick, wall_s=round(wall, 1),
                                 reference_s=round(t_ref, 1)),
        "reference": {"checkpoint": str(ckpt), "origin": origin, "model": ref.meta.get("model"),
                      "task": ref.task.spec(),
                      "train_metrics": {k: (ref.meta.get("metrics") or {}).get(k)
                                        for k in (ref.task.metric, "epochs", "steps")}},
        "data": data_info, "speed": speed, "budgets": res.budgets,
    }
    ev.write_outputs(out, res.rows, info, f"demo: {origin}; {data_info['n']} test images, "
                     f"{ev.threads_text(args.threads)}, batch {speed['batch']}", task=ref.task)
    images, titles = ev.first_images(data.test, mode["images"], ref.meta.get("classes") or [])
    specs = ev.one_per_method(res.picks, sorted(targets)[len(targets) // 2])
    ev.log(f"visualising {len(titles)} test images for {', '.join(specs)}")
    outlines = data.masks[: len(titles)] if data.masks is not None else None
    paths = draw(ref.model, specs, images, titles, out / "visualize", outlines, amp=args.amp)
    ev.log(f"wrote {len(paths)} visualisations under {out / 'visualize'}")
    print(f"done in {time.perf_counter() - t0:.0f} s (reference ready after {t_ref:.0f} s); results in {out}/",
          flush=True)
    return 0
