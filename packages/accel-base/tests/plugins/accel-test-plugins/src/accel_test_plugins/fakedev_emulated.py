"""The CPU stand-in for `fakedev_vendor`: counts step markers."""

calls = {"mark_step": 0}


def mark_step() -> None:
    calls["mark_step"] += 1
