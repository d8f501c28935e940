"""MkDocs hooks: the pages that are generated at build time, so that no generated copy is committed.

- ``cli.md``: the placeholder ``<!-- cli-reference -->`` becomes ``tokenreduce.commands.reference.cli_markdown()``,
  rendered from the real argparse parsers.
- ``results.md``: the placeholder ``<!-- report -->`` becomes ``results/REPORT.md`` as ``tokenreduce report``
  wrote it (headings one level down, its figure links pointed at ``results/figures/``, which is added to the
  site); other relative links of the report, which point into ``results/``, become plain paths.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "results" / "REPORT.md"
FIGURES = ROOT / "results" / "figures"
CLI_MARK = "<!-- cli-reference -->"
REPORT_MARK = "<!-- report -->"
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def on_files(files: Files, config, **kwargs) -> Files:
    """Add the report's figures to the site, under ``results/figures/``."""
    # Read now rather than copied later: `tokenreduce report` may be rewriting the folder meanwhile.
    for png in sorted(FIGURES.glob("*.png")) if FIGURES.is_dir() else ():
        try:
            content = png.read_bytes()
        except OSError:
            continue
        files.append(File.generated(config, f"results/figures/{png.name}", content=content))
    return files


def _report_markdown() -> str:
    if not REPORT.is_file():
        return "*`results/REPORT.md` does not exist yet: run `tokenreduce report`.*\n"
    text = REPORT.read_text()

    def link(m: re.Match) -> str:
        bang, label, target = m.groups()
        if re.match(r"[a-z]+:|#", target):  # absolute URL or an anchor on the page
            return m.group(0)
        if target.startswith("figures/") and (FIGURES.parent / target).is_file():
            return f"{bang}[{label}](results/{target})"
        return f"{label} (`results/{target}`)"

    text = _LINK.sub(link, text)
    # One level down, outside fenced code: the page's own title is the only top-level heading.
    out, fenced = [], False
    for line in text.splitlines():
        fenced ^= line.lstrip().startswith("```")
        out.append(re.sub(r"^(#{1,5}) ", r"#\1 ", line) if not fenced else line)
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if CLI_MARK in markdown:
        from tokenreduce.commands.reference import cli_markdown

        markdown = markdown.replace(CLI_MARK, cli_markdown())
    if REPORT_MARK in markdown:
        markdown = markdown.replace(REPORT_MARK, _report_markdown())
    return markdown
