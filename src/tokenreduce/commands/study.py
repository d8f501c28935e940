"""``tokenreduce study`` and ``tokenreduce report``: run a study (study/declare.py), render the report.

``tokenreduce study`` lists the studies; ``tokenreduce study NAME`` runs every run of its plan not done
yet (a killed study continues, a killed run resumes from its checkpoint); ``--jobs N`` runs N at once;
``--list`` prints one command per run for any scheduler; ``--run ID`` runs one; ``--where AXIS=V`` narrows
the run or the list to a slice of the grid (``steps=937``: the one-epoch runs); a whole run ends, and
``--summarize`` alone does, by printing its tables and verdicts from the run JSONs and writing them to
summary.md; ``--smoke`` is the tiny
version the tests run. The test bed flags (``--model``, ``--pretrained``, ``--weights``, ``--data``)
put the same study on another model and dataset. ``tokenreduce report`` (commands/report.py) writes results/REPORT.md.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from . import vocab


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study", help="run a study (a paper's claim as a controlled comparison); list them with no argument",
        description="Run the runs of a study that are not done yet (each writes <out>/runs/<id>.json), or one "
        "(--run), or print them as commands (--list); a whole run ends by printing its tables and verdicts and "
        "writing <out>/summary.md, which --summarize alone does from the stored runs. A study declares its "
        "claims once and runs them on each of its test beds (--testbed; or your own with --model/--data).",
        epilog="Example: tokenreduce study eet --smoke; tokenreduce study eet --testbed fmnist --summarize; "
        "tokenreduce study bspf --where steps=937 (its one-epoch runs); "
        "tokenreduce study eet --model deit_small_patch16_224 "
        "--pretrained --data /data/birds --device cuda --jobs 2",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="the study (tokenreduce study lists them)")
    p.add_argument("--testbed", metavar="BED", default=None,
                   help="which of the study's declared test beds (e.g. scenes, fmnist; tokenreduce study lists "
                        "them; default: its first)")
    p.add_argument("--run", metavar="ID", help="run only this run of the plan (its id from --list); one whose "
                   "record exists is left as it is (remove the record to run it again)")
    p.add_argument("--list", action="store_true", help="print one shell command per run, in order")
    p.add_argument("--where", action="append", default=[], metavar="AXIS=V[,V]",
                   help="run (or --list) only the runs at these values of a grid axis, and the measures and "
                   "probes that read only them: --where steps=937 (the one-epoch fine-tunes), --where seed=0; "
                   "repeatable, one axis each")
    p.add_argument("--summarize", action="store_true",
                   help="run nothing: print the tables and verdicts, write summary.md")
    p.add_argument("--smoke", action="store_true", help="the tiny version (seconds; what the tests run)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="runs at once (a pool of N worker processes, threads // N each; a run starts when the runs "
                   "it reads are done; runs that time go one at a time, last)")
    vocab.add_threads(p)
    vocab.add_device(p, note="every run and measure; repeated by --list's commands (--list and --summarize "
                                 "check the name only, so a GPU's commands list anywhere)")
    vocab.add_amp(p, note="every run's training and evaluation and every measure")
    vocab.add_out_dir(p, default=None, note="results/NAME/BED for a declared test bed, runs/studies/NAME-BED-<test "
                      "bed> for your own; checkpoints in DIR/checkpoints")
    g = p.add_argument_group("test bed (default: the study's own)")
    vocab.add_model(g, default=None)
    vocab.add_pretrained(g)
    vocab.add_weights(g)
    vocab.add_data(g, download=False)
    p.set_defaults(func=run)


def _testbed(args: argparse.Namespace):
    from ..study.testbed import Testbed

    if args.data_dir:
        from ..core.errors import TokenReduceError

        raise TokenReduceError("study reads --data as a dataset name or folder; --data-dir is not used here, "
                               "give the folder to --data")
    if not (args.model or args.data):
        return None
    if args.data and not args.model:
        from ..core.errors import TokenReduceError

        raise TokenReduceError("--data needs --model NAME: a study's reference test bed brings its own dataset")
    return Testbed(model=args.model, pretrained=args.pretrained, weights=args.weights, data=args.data)


def _flags(args: argparse.Namespace) -> list[str]:
    """The test bed and output flags a run's command repeats."""
    out = ["--smoke"] if args.smoke else []
    for flag in ("model", "weights", "data", "out", "device", "amp"):
        value = getattr(args, flag)
        if value and not (flag == "device" and value == "cpu") and not (flag == "amp" and value == "off"):
            out += [f"--{flag}", str(value)]
    return out + (["--pretrained"] if args.pretrained else [])


def _where(items: list[str]) -> dict[str, set[str]]:
    """``--where`` flags (``AXIS=V[,V...]``) -> axis name -> the values kept, as written."""
    from ..core.errors import TokenReduceError

    out: dict[str, set[str]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        kept = {v.strip() for v in values.split(",") if v.strip()}
        if not (sep and name.strip() and kept):
            raise TokenReduceError(f"--where takes AXIS=VALUE[,VALUE...], e.g. --where steps=937; got {item!r}")
        if name.strip() in out:
            raise TokenReduceError(f"--where names the axis {name.strip()!r} twice; give its values once, "
                                   "separated by commas")
        out[name.strip()] = kept
    return out


def run(args: argparse.Namespace) -> int:
    from ..study.declare import get_study, list_studies

    if not args.name:
        for name in list_studies():
            cls = get_study(name)
            print(f"{name}\n{textwrap.indent(textwrap.fill(cls.claim, 96), '    ')}\n    source: {cls.source}\n"
                  f"    test beds: {', '.join(cls.beds)}")
        return 0
    import torch

    from ..core.errors import TokenReduceError
    from ..study.plan import layout_for
    from ..study.records import load_runs
    from ..study.runner import Runner
    from ..study.tables import summary
    from . import checks

    checks.threads(args.threads)
    args.device = checks.device(args.device, here=not (args.list or args.summarize))  # those two run nothing
    if args.jobs < 1:
        raise TokenReduceError(f"--jobs must be >= 1, got {args.jobs}")
    study = get_study(args.name)(args.testbed, testbed=_testbed(args), smoke=args.smoke)
    layout = layout_for(study, args.out)
    threads = args.threads if args.threads is not None else torch.get_num_threads()
    if args.where and (args.run or args.summarize):
        raise TokenReduceError(f"--where selects the runs to run or --list; it does not combine with "
                               f"{'--run' if args.run else '--summarize'}")
    runner = Runner(study, layout, threads=threads, device=args.device, amp=args.amp, flags=_flags(args),
                    where=_where(args.where))
    if args.list:
        print("\n".join(runner.commands()))
        return 0
    if not args.summarize:
        checks.writable_dir(layout.results)
    if args.run:
        unit = runner.unit(args.run)
        if runner.done(unit):  # as a whole study skips it; a timing would be re-timed and its record replaced
            print(f"run {unit.id} is done: {layout.json(unit.id)} (remove it to run it again)", file=sys.stderr)
            return 0
        runner.run_one(unit)
        return 0
    if not args.summarize:
        runner.run(jobs=args.jobs)
    elif not (layout.results / "runs").is_dir():
        raise TokenReduceError(f"--summarize: {layout.results} holds no run records (no runs/ folder); check --out "
                               f"and --testbed, or run the study first (tokenreduce study {args.name})")
    from ..bench.report import write_text
    from ..study.page import judged_results

    judgement = None  # on the committed results, the report's: claims adjusted with every other study's
    if layout.results == Path("results") / study.key:
        judgement = judged_results(Path("results"))[1]
    text = summary(study, load_runs(layout, study), judgement)
    print(text, end="")
    print(f"wrote {write_text(layout.results / 'summary.md', text)}", file=sys.stderr)
    return 0
