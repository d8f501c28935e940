"""``tokenreduce report``: every registered study rendered from its stored run JSONs into one page,
results/REPORT.md, with its PNG figures (study/page.py; rebuilt from the same JSONs it is
byte-identical)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import vocab

#: report has no flags of its own (commands/vocab.py).


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write results/REPORT.md: every study's claims, verdicts, tables, figures",
                       description="Render every registered study from its stored run JSONs into one page, "
                       "REPORT.md, with PNG figures, each study's summary.md and the README's generated tables "
                       "(rebuilt from the same JSONs they are byte-identical).")
    vocab.add_out_dir(p, default="results", note="the results folder REPORT.md, figures/ and each study's "
                      "<study>/<test bed>/summary.md are written to")
    p.add_argument("--readme", metavar="FILE", default="README.md",
                   help="the README whose generated tables (between its report:headline markers) are rewritten; "
                        "'' for none (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..core.errors import TokenReduceError
    from ..studies.readme import headline
    from ..study.page import build_report

    if not Path(args.out).is_dir():
        raise TokenReduceError(f"--out {args.out}: no results folder there (it holds the studies' run records, "
                               "results/<study>/<test bed>/runs/); run tokenreduce report from the repository root, "
                               "or give the folder with --out")
    readme = (Path(args.readme), headline) if args.readme else None
    print(f"wrote {build_report(args.out, readme=readme)}")
    return 0
