"""``tokenreduce report``: every registered study rendered from its stored run JSONs into one page,
results/REPORT.md, with its PNG figures (experiments/page.py; rebuilt from the same JSONs it is
byte-identical)."""

from __future__ import annotations

import argparse

from . import vocab

#: report has no flags of its own (commands/vocab.py).
OWN_FLAGS: tuple[str, ...] = ()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write results/REPORT.md: every study's claims, verdicts, tables, figures",
                       description="Render every registered study from its stored run JSONs into one page, "
                       "REPORT.md, with PNG figures (rebuilt from the same JSONs it is byte-identical).")
    vocab.add_out_dir(p, default="results", note="the results folder REPORT.md and figures/ are written to")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..experiments.page import build_report

    print(f"wrote {build_report(args.out)}")
    return 0
