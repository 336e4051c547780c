"""The `accel` subcommands, one module each; `accel.cli` dispatches to them."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any, NoReturn

from ..errors import AccelError


class UsageError(AccelError, ValueError):
    """The command line asks for something impossible; the CLI prints it in one line and exits 2."""


class CliParser(argparse.ArgumentParser):
    """An argparse parser whose errors are two short lines (not the full usage) and exit 2.

    Prefixes of long flags are not matched (`allow_abbrev=False`): `--fp8` is an unknown flag, never
    an ambiguous prefix of twenty `--fp8_*` flags, and `--use_deep` never silently means `--use_deepspeed`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        guesses = self._did_you_mean(message)
        if guesses:
            message += f" (did you mean {guesses}?)"
        elif message.startswith("unrecognized arguments") and self.prog == "accel launch":
            from ..adapter import registry

            installed = ", ".join(sorted(registry.installed_adapters())) or "none"
            message += (
                f". Flags for one vendor's hardware come with its accel adapter package, and no installed adapter"
                f" ({installed}) declares it: the adapter for that hardware is missing, or spells the flag its own"
                " way (`accel launch --adapter NAME --help` lists an adapter's flags)"
            )
        sys.stderr.write(f"{self.prog}: error: {message}\n(`{self.prog} --help` lists every flag)\n")
        sys.exit(2)

    def _did_you_mean(self, message: str) -> str:
        """The known flags closest to each unknown one in an "unrecognized arguments" message ("" if none)."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        known = {flag[2:]: flag for flag in self._option_string_actions if flag.startswith("--")}
        guesses: list[str] = []
        for word in message.removeprefix("unrecognized arguments: ").split():
            name = word.split("=", 1)[0][2:] if word.startswith("--") else ""
            if len(name) >= 5:  # a typo of a longer name; a short unknown flag is more likely an adapter's
                close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85)
                guesses += [known[c] for c in close if known[c] not in guesses]
        return " or ".join(guesses)


def spellings(name: str) -> list[str]:
    """`--kebab-case` and `--snake_case` spellings of one flag (the first is shown in help)."""
    kebab, snake = "--" + name.replace("_", "-"), "--" + name.replace("-", "_")
    return [kebab] if kebab == snake else [kebab, snake]


def add_flag(group: argparse._ActionsContainer, name: str, *aliases: str, **kwargs: object) -> argparse.Action:
    """Add a flag under both spellings of `name` and of each alias; `dest` defaults to `name`."""
    options = [opt for n in (name, *aliases) for opt in spellings(n)]
    kwargs.setdefault("dest", name.replace("-", "_"))
    return group.add_argument(*options, **kwargs)  # type: ignore[arg-type]
