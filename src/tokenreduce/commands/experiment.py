"""``tokenreduce experiment``: run one published claim or reviewer's falsifier (probes/).

``tokenreduce experiment`` lists the experiments with their claims; ``tokenreduce experiment
'NAME(key=value, ...)'`` runs one, prints its report and writes its results (with provenance) to
``--results``; ``--smoke`` runs the tiny end-to-end version the tests run.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from . import checks, vocab


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment", help="run a paper's claim or a reviewer's falsifier (list them with no argument)",
        description="Run one experiment (probes/: one module per published claim or reviewer's objection), "
        "print its report and write its results with provenance. Without SPEC: list the experiments.",
        epilog="Example: tokenreduce experiment \"recall_at_kept(spec='ctp()')\" --results results/eet/recall.json",
    )
    p.add_argument("spec", nargs="?", metavar="SPEC", help="experiment spec, e.g. \"name(key=value)\"")
    p.add_argument("--smoke", action="store_true", help="the tiny end-to-end version (seconds; what the tests run)")
    vocab.add_out_dir(p, default=None, note="for the files it writes (default runs/experiments/NAME)")
    vocab.add_results(p)
    vocab.add_threads(p)
    vocab.add_device(p)
    vocab.add_amp(p)
    p.set_defaults(func=run)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..probes import ProbeRequest, get_experiment, list_experiments

    if not args.spec:
        for name in list_experiments():
            cls = get_experiment(name)
            print(f"{name}\n{textwrap.indent(textwrap.fill(cls.claim, 96), '    ')}\n    source: {cls.source}")
        return 0
    import torch

    from ..bench.report import provenance, write_json
    from ..probes import RunContext

    exp = ProbeRequest(args.spec, smoke=args.smoke).experiment()
    checks.threads(args.threads)
    args.device = checks.device(args.device)
    if args.results:
        checks.writable_file(args.results, "--results")
    threads = checks.resolve_threads(args.threads)
    torch.set_num_threads(threads)
    out_dir = checks.writable_dir(args.out) if args.out else Path("runs/experiments") / exp.name
    _log(f"experiment {exp.spec()}{' (smoke)' if args.smoke else ''}: {threads} threads, {args.device}"
         f"{'' if args.amp == 'off' else ', autocast ' + args.amp}")
    result = exp.run(RunContext(threads=threads, device=args.device, amp=args.amp, out_dir=out_dir, smoke=args.smoke,
                                log=_log))
    print(exp.report(result))
    if args.results:
        doc = {"experiment": exp.spec(), "claim": exp.claim, "source": exp.source, "smoke": args.smoke,
               "provenance": provenance(argv=args.argv, threads=threads, device=args.device, amp=args.amp),
               "result": result}
        _log(f"wrote {write_json(args.results, doc)}")
    return 0
