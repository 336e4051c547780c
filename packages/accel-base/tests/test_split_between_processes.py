"""`split_between_processes` gives the shares Accelerate gives.

The expected shares below were produced by Accelerate 1.15.0 itself:
`PartialState(cpu=True).split_between_processes(...)` under `torchrun --nproc-per-node 2`
and `3` (CPU, gloo), one JSON file per rank, copied here by hand so that this test does
not need Accelerate. Two deliberate differences, both where Accelerate raises: a tuple
with `apply_padding=True` (Accelerate: `TypeError: can only concatenate tuple (not "list")
to tuple`) is padded like a list and stays a tuple; and the input dict is not modified
(Accelerate overwrites its values in place).

The split itself needs no communication, so most cases set the rank on a one-process
state; one real 2-rank launch checks the case the option exists for: padded shares that
`gather` accepts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from accel.state import PartialState
from conftest import launch

# (name, input, {world: {apply_padding: [share of rank 0, rank 1, ...]}}), from Accelerate 1.15.0.
CASES: list[tuple[str, Any, dict[int, dict[bool, list[Any]]]]] = [
    ("list_1", [1], {2: {False: [[1], []], True: [[1], [1]]}, 3: {False: [[1], [], []], True: [[1], [1], [1]]}}),
    (
        "list_3",
        ["A", "B", "C"],
        {
            2: {False: [["A", "B"], ["C"]], True: [["A", "B"], ["C", "C"]]},
            3: {False: [["A"], ["B"], ["C"]], True: [["A"], ["B"], ["C"]]},
        },
    ),
    (
        "list_4",
        [0, 1, 2, 3],
        {
            2: {False: [[0, 1], [2, 3]], True: [[0, 1], [2, 3]]},
            # Rank 1 is padded with the input's last item (3), not its own last item (2).
            3: {False: [[0, 1], [2], [3]], True: [[0, 1], [2, 3], [3, 3]]},
        },
    ),
    (
        "list_5",
        [0, 1, 2, 3, 4],
        {
            2: {False: [[0, 1, 2], [3, 4]], True: [[0, 1, 2], [3, 4, 4]]},
            3: {False: [[0, 1], [2, 3], [4]], True: [[0, 1], [2, 3], [4, 4]]},
        },
    ),
    (
        "tensor_1",
        torch.tensor([1]),
        {2: {False: [[1], []], True: [[1], [1]]}, 3: {False: [[1], [], []], True: [[1], [1], [1]]}},
    ),
    (
        "tensor_5",
        torch.arange(5),
        {
            2: {False: [[0, 1, 2], [3, 4]], True: [[0, 1, 2], [3, 4, 4]]},
            3: {False: [[0, 1], [2, 3], [4]], True: [[0, 1], [2, 3], [4, 4]]},
        },
    ),
    (
        "tensor2d_4",
        torch.arange(8).reshape(4, 2),
        {
            2: {False: [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], True: [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]},
            3: {
                False: [[[0, 1], [2, 3]], [[4, 5]], [[6, 7]]],
                True: [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[6, 7], [6, 7]]],
            },
        },
    ),
    (
        "tensor2d_1",
        torch.arange(2).reshape(1, 2),
        {
            2: {False: [[[0, 1]], []], True: [[[0, 1]], [[0, 1]]]},
            3: {False: [[[0, 1]], [], []], True: [[[0, 1]], [[0, 1]], [[0, 1]]]},
        },
    ),
    (
        "dict_1",
        {"a": [7], "b": torch.tensor([[1, 2]])},
        {
            2: {
                False: [{"a": [7], "b": [[1, 2]]}, {"a": [], "b": []}],
                True: [{"a": [7], "b": [[1, 2]]}, {"a": [7], "b": [[1, 2]]}],
            },
            3: {
                False: [{"a": [7], "b": [[1, 2]]}, {"a": [], "b": []}, {"a": [], "b": []}],
                True: [{"a": [7], "b": [[1, 2]]}] * 3,
            },
        },
    ),
    (
        "dict_5",
        {"a": [0, 1, 2, 3, 4], "b": torch.arange(10, 15)},
        {
            2: {
                False: [{"a": [0, 1, 2], "b": [10, 11, 12]}, {"a": [3, 4], "b": [13, 14]}],
                True: [{"a": [0, 1, 2], "b": [10, 11, 12]}, {"a": [3, 4, 4], "b": [13, 14, 14]}],
            },
            3: {
                False: [{"a": [0, 1], "b": [10, 11]}, {"a": [2, 3], "b": [12, 13]}, {"a": [4], "b": [14]}],
                True: [{"a": [0, 1], "b": [10, 11]}, {"a": [2, 3], "b": [12, 13]}, {"a": [4, 4], "b": [14, 14]}],
            },
        },
    ),
]


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _shares(inputs: Any, world: int, apply_padding: bool) -> list[Any]:
    state = PartialState(cpu=True)
    shares = []
    for rank in range(world):
        # The split is computed from the rank alone; no process group is needed to check it.
        state.num_processes, state.process_index = world, rank
        with state.split_between_processes(inputs, apply_padding=apply_padding) as share:
            shares.append(share)
    return shares


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("apply_padding", [False, True])
@pytest.mark.parametrize(("name", "inputs", "expected"), CASES, ids=[c[0] for c in CASES])
def test_shares_match_accelerate(name: str, inputs: Any, expected: dict, world: int, apply_padding: bool) -> None:
    shares = _shares(inputs, world, apply_padding)
    assert [_plain(s) for s in shares] == expected[world][apply_padding]
    for share in shares:
        if isinstance(inputs, torch.Tensor):
            assert isinstance(share, torch.Tensor) and share.dtype == inputs.dtype
            assert share.shape[1:] == inputs.shape[1:]
        else:
            assert type(share) is type(inputs)


def test_fewer_items_than_processes_gives_every_rank_one() -> None:
    # The case: [1] on 2 ranks gave [[1], []] (unequal shares, so `gather` failed).
    assert _shares([1], 2, apply_padding=True) == [[1], [1]]


def test_tuple_padding_keeps_a_tuple() -> None:
    # Accelerate raises TypeError here; accel pads the tuple as it pads a list.
    assert _shares((0, 1, 2, 3, 4), 2, apply_padding=True) == [(0, 1, 2), (3, 4, 4)]
    assert _shares((0, 1, 2, 3, 4), 2, apply_padding=False) == [(0, 1, 2), (3, 4)]


def test_dict_input_is_not_modified() -> None:
    inputs = {"a": [0, 1, 2], "b": torch.arange(3)}
    _shares(inputs, 2, apply_padding=True)
    assert inputs["a"] == [0, 1, 2] and inputs["b"].tolist() == [0, 1, 2]


def test_dict_values_of_different_lengths_are_refused() -> None:
    # Accelerate's message; a nested dict counts its keys, as there.
    with pytest.raises(ValueError, match="All values in the dictionary must have the same length"):
        _shares({"a": [0, 1, 2], "n": {"x": [0, 1, 2], "y": [3, 4, 5]}}, 2, apply_padding=False)


def test_empty_inputs_give_empty_shares() -> None:
    # Accelerate raises IndexError (it reads `inputs[-1]`); nothing to pad with means empty shares.
    assert _shares([], 2, apply_padding=True) == [[], []]
    assert [s.shape for s in _shares(torch.zeros(0, 3), 2, apply_padding=True)] == [(0, 3), (0, 3)]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize(
    ("inputs", "kind"),
    [
        ({3, 1, 2}, "set"),
        (frozenset({1}), "frozenset"),
        ((i for i in range(4)), "generator"),
        (iter([1, 2]), "list_iterator"),
        ({"a": 1}.keys(), "dict_keys"),
        ({"a": [1, 2], "b": {1, 2}}, "set"),
    ],
)
def test_unsplittable_inputs_are_refused(inputs: Any, kind: str, world: int) -> None:
    # Before (issue 26): a set went whole to every process (each rank then worked on all of it).
    with pytest.raises(TypeError) as caught:
        _shares(inputs, world, apply_padding=False)
    assert str(caught.value) == (
        f"split_between_processes cannot split a `{kind}`: it has no length and order to share by position, so "
        "every process would get all of it. Pass a list (for example `sorted(items)` or `list(items)`), a tuple, "
        "a tensor, a dict of those, or a datasets.Dataset."
    )


SCRIPT = """
import json, sys
import torch
from accel import Accelerator

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
out = {}
with accelerator.split_between_processes([1], apply_padding=True) as share:
    out["list"] = share
    out["gathered_list"] = accelerator.gather(torch.tensor(share)).tolist()
with accelerator.split_between_processes(torch.arange(6).reshape(3, 2) * 10, apply_padding=True) as share:
    out["tensor"] = share.tolist()
    out["gathered_tensor"] = accelerator.gather(share).tolist()
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump(out, f)
"""


def test_padded_shares_gather_on_two_processes(write_script, tmp_path: Path) -> None:
    launch(write_script(SCRIPT), str(tmp_path), timeout=180)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["list"] for r in reports] == [[1], [1]]
    assert [r["tensor"] for r in reports] == [[[0, 10], [20, 30]], [[40, 50], [40, 50]]]
    for report in reports:
        assert report["gathered_list"] == [1, 1]
        assert report["gathered_tensor"] == [[0, 10], [20, 30], [40, 50], [40, 50]]
