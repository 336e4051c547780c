"""docs/cli.md, rendered from the parsers themselves so the page cannot drift from the code.

    python -m accel.commands.reference > docs/cli.md

Only accel-base's own flags are listed: each adapter package adds its own to `accel launch`
(`accel launch --adapter NAME --help` shows them).
"""

from __future__ import annotations

import argparse

HEADER = """# accel command-line reference

Generated from the parsers by `python -m accel.commands.reference > docs/cli.md`; a test
fails when this page and the code disagree. Every flag takes both spellings, `--kebab-case`
and `--snake_case`. Flags of adapter packages are listed by `accel launch --adapter NAME --help`.
A usage mistake prints one line and exits with code 2; see [Launching](launching.md).
"""


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    return action.metavar if isinstance(action.metavar, str) else action.dest.upper()


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default is None or action.default is False or action.default == argparse.SUPPRESS:
        return ""
    return f"`{action.default}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").replace("|", "\\|").split())


def render_parser(title: str, parser: argparse.ArgumentParser, intro: str = "") -> str:
    """One `## title` section: the usage, then a table of flags per argument group."""
    out = [f"## {title}", ""]
    if intro:
        out += [intro, ""]
    if parser.description:
        out += [parser.description, ""]
    positionals = [a for a in parser._actions if not a.option_strings and a.help != argparse.SUPPRESS]
    if positionals:
        out += ["| argument | what it is |", "|---|---|"]
        out += [
            f"| `{a.dest}` | {_cell(a.help)} |" for a in positionals if not isinstance(a, argparse._SubParsersAction)
        ]
        out.append("")
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.option_strings and a.help != argparse.SUPPRESS]
        actions = [a for a in actions if "--help" not in a.option_strings]
        if not actions:
            continue
        out += [f"### {group.title}", "", "| flag | value | default | meaning |", "|---|---|---|---|"]
        for a in actions:
            flags = ", ".join(f"`{o}`" for o in a.option_strings)
            out.append(f"| {flags} | {_value(a)} | {_default(a)} | {_cell(a.help)} |")
        out.append("")
    return "\n".join(out)


def render() -> str:
    """The whole page."""
    from ..cli import COMMANDS
    from .config import config_parser
    from .launch import launch_parser

    sections = [HEADER, "## Commands", "", "| command | what it does |", "|---|---|"]
    sections += [f"| `accel {name}` | {help_text} |" for name, (_, help_text) in COMMANDS.items()]
    sections.append("")
    sections.append(render_parser("accel launch", launch_parser(with_adapters=False)))
    sections.append(render_parser("accel config", config_parser()))
    sections.append(
        "## accel test\n\n`accel test [accel launch flags]`: accel's self-check (gather, reduce, sharded "
        "training, identical replicas) through `accel launch`, on 2 processes unless `--num-processes` says "
        "otherwise. Every `accel launch` flag applies, the rendezvous ones included.\n"
    )
    sections.append("## accel env\n\n`accel env`: versions, adapters (available or not, and why), strategies, "
                    "optional packages with the pip extra that installs each, the config file `accel launch` "
                    "would read, and the `ACCEL_*`/`ACCELERATE_*` variables set.\n")  # fmt: skip
    for name in ("merge-weights", "estimate-memory"):
        if name in COMMANDS:
            module = __import__(f"accel.commands.{name.replace('-', '_')}", fromlist=["parser"])
            sections.append(render_parser(f"accel {name}", module.parser()))
    return "\n".join(sections).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
