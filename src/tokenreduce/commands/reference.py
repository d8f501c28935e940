"""The command-line reference as Markdown, generated from the real argparse parsers.

``cli_markdown()`` builds the parser of ``tokenreduce.cli`` and renders the top-level command and every
subcommand: its description, usage, epilog, and every argument (flags, metavar, choices, default, help).
The documentation site inserts it into ``docs/cli.md`` at build time (``docs/hooks.py``), so the
reference cannot drift from the parsers; ``tests/test_docs.py`` checks that every option string of
every subcommand appears in it. Like the parsers themselves, this imports no torch.
"""

from __future__ import annotations

import argparse

__all__ = ["cli_markdown", "subcommands"]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers directly under ``parser``, by name, in the order they were added."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _help_lines(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line ``help`` (what ``tokenreduce --help`` lists)."""
    lines = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            lines.update({a.dest: a.help or "" for a in action._choices_actions})
    return lines


def _cell(text: object) -> str:
    """Text made safe for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: object) -> str:
    """Inline code that survives backticks inside ``text``."""
    s = str(text)
    fence = "``" if "`" in s else "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _metavar(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    """The argument part of a flag as ``--help`` writes it (``N``, ``{a,b}``, ``[SPEC ...]``), or ''."""
    if action.nargs == 0:
        return ""
    default = action.dest.upper() if action.option_strings else action.dest
    return formatter._format_args(action, formatter._get_default_metavar_for_optional(action)
                                  if action.option_strings else default)


def _default(action: argparse.Action) -> str:
    """The default worth printing, or '' (none, a switch's False, or a suppressed default)."""
    d = action.default
    if d is None or d is argparse.SUPPRESS or action.nargs == 0 or d == [] or d is False:
        return ""
    return _code(d)


def _rows(parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Table rows of the visible arguments, and one line per hidden, refused old spelling."""
    formatter = parser._get_formatter()
    rows, refused = [], []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        if action.help == argparse.SUPPRESS:
            message = getattr(action, "message", "") or "not shown by --help"
            refused += [f"- {', '.join(_code(s) for s in action.option_strings)}: refused, exit status 2 "
                        f"({_cell(message)})"]
            continue
        names = action.option_strings or [action.metavar or action.dest]
        arg = _metavar(action, formatter)
        flags = ", ".join(_code(f"{n} {arg}".strip() if action.option_strings else n) for n in names)
        help_text = formatter._expand_help(action) if action.help else ""
        if action.choices is not None and action.metavar is not None:  # else the metavar shows them
            help_text += f" (one of: {', '.join(_code(c) for c in action.choices)})"
        if action.required:
            help_text += " (required)"
        rows.append(f"| {flags} | {_default(action)} | {_cell(help_text)} |")
    return rows, refused


def _section(name: str, parser: argparse.ArgumentParser, summary: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{name}`", ""]
    if summary:
        out += [_cell(summary[0].upper() + summary[1:]) + ".", ""] if not summary.endswith(".") else [summary, ""]
    if parser.description and parser.description != summary:
        out += [" ".join(parser.description.split()), ""]
    usage = parser.format_usage().strip()
    usage = usage[len("usage: "):] if usage.startswith("usage: ") else usage
    out += ["```text", usage, "```", ""]
    rows, refused = _rows(parser)
    if rows:
        out += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    if refused:
        out += ["Old spellings, refused with a line naming the new one:", "", *refused, ""]
    if parser.epilog:
        out += [" ".join(parser.epilog.split()), ""]
    helps = _help_lines(parser)
    for sub_name, sub_parser in subcommands(parser).items():
        out += _section(f"{name} {sub_name}", sub_parser, helps.get(sub_name, ""), min(level + 1, 6))
    return out


def cli_markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The Markdown reference of ``parser`` (default: ``tokenreduce.cli.build_parser()``) and its subcommands.

    One section per subcommand, in the order ``tokenreduce --help`` lists them: the one-line summary,
    the description, the usage line, a table of every argument (flags with metavar, default, help with
    its choices), the refused old spellings, and the epilog.
    """
    if parser is None:
        from ..cli import build_parser  # the one place the parser is built

        parser = build_parser()
    lines = [" ".join((parser.description or "").split()), "", "```text",
             parser.format_usage().strip().removeprefix("usage: "), "```", ""]
    rows, _ = _rows(parser)
    if rows:
        lines += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    if parser.epilog:
        lines += [" ".join(parser.epilog.split()), ""]
    helps = _help_lines(parser)
    subs = subcommands(parser)
    lines += ["| command | what it does |", "|---|---|",
              *[f"| [`{n}`](#{parser.prog}-{n}) | {_cell(helps.get(n, ''))} |" for n in subs], ""]
    for name, sub in subs.items():
        lines += _section(f"{parser.prog} {name}", sub, helps.get(name, ""), 2)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(cli_markdown(), end="")
