"""docs/cli.md is the parsers' own reference: regenerate it when a flag changes."""

from __future__ import annotations

from pathlib import Path

from accel.commands.reference import render

PAGE = Path(__file__).parents[3] / "docs" / "cli.md"


def test_cli_reference_is_up_to_date() -> None:
    assert PAGE.read_text() == render(), "run `python -m accel.commands.reference > docs/cli.md`"


def test_reference_lists_every_launch_flag_with_both_spellings() -> None:
    from accel.commands.launch import launch_parser

    page = PAGE.read_text()
    for action in launch_parser(with_adapters=False)._actions:
        for option in action.option_strings:
            if option not in ("-h", "--help", "-q"):
                assert f"`{option}`" in page, option
