import argparse

import pytest
from accel.adapter.options import AdapterOptionsError
from accel_example_adapter import ExampleAdapter, ExampleOptions, device_emulated


def test_mark_every_from_code_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_EXAMPLE_MARK_EVERY", "3")
    assert ExampleAdapter(emulate=True).config.mark_every == 3
    adapter = ExampleAdapter(emulate=True, options={"mark_every": 2})
    before = device_emulated.steps
    for _ in range(5):
        adapter.after_optimizer_step()
    assert device_emulated.steps - before == 2  # after steps 2 and 4


def test_the_launch_flag_sets_the_variable_the_workers_read() -> None:
    parser = argparse.ArgumentParser()
    ExampleAdapter.add_launch_arguments(parser.add_argument_group("example"))
    env = ExampleAdapter.launch_env(parser.parse_args(["--example-mark-every", "4"]))
    assert env == {"ACCEL_EXAMPLE_MARK_EVERY": "4"}
    assert ExampleOptions.from_env(env) == ExampleOptions(mark_every=4)


def test_bad_values_are_refused() -> None:
    with pytest.raises(AdapterOptionsError, match="mark_every must be at least 1, got 0"):
        ExampleAdapter(emulate=True, options={"mark_every": 0})
    with pytest.raises(AdapterOptionsError, match=r"Unknown example adapter option\(s\) \['every'\]"):
        ExampleAdapter(emulate=True, options={"every": 2})
