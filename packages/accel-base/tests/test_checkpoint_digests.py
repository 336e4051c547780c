"""Checkpoint digests: XXH3-128 computed in the one pass that writes or reads the bytes, BLAKE3 and SHA-256 manifests
of earlier releases still verified, and the ranks agreeing in one collective per save step (2 gloo processes)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import blake3
import pytest
import torch
import xxhash
from accel import Accelerator
from accel.checkpoint import io as checkpoint_io
from accel.checkpoint.layout import MANIFEST
from accel.errors import CheckpointError
from conftest import launch
from safetensors.torch import load_file


def _saved(tmp_path: Path) -> tuple[Accelerator, torch.nn.Module, Path]:
    accelerator = Accelerator()
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    accelerator.backward(model(torch.ones(2, 32)).sum())
    opt.step()
    return accelerator, model, Path(accelerator.save_state(tmp_path / "ckpt"))


def test_a_save_records_the_xxh3_of_every_file_without_reading_any_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def second_pass(*args: object) -> str:
        raise AssertionError(f"a file was read back to hash it: {args}")

    monkeypatch.setattr(checkpoint_io, "hash_file", second_pass)
    _, _, directory = _saved(tmp_path)
    digests = json.loads((directory / MANIFEST).read_text())["sha256"]
    assert set(digests) == {"model.safetensors", "optimizer.bin", "dataloaders.json", "random_states_0.pt"}
    for name, recorded in digests.items():
        assert recorded == "xxh3-128:" + xxhash.xxh3_128((directory / name).read_bytes()).hexdigest(), name


def test_safetensors_written_here_read_back_by_safetensors_itself(tmp_path: Path) -> None:
    tensors = {
        "w": torch.randn(3, 5),
        "half": torch.randn(7).to(torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, 1:],  # not contiguous
    }
    digest = checkpoint_io.save_safetensors(tensors, tmp_path / "t.safetensors")
    assert digest == checkpoint_io.hash_file(tmp_path / "t.safetensors")
    for loaded in (
        load_file(str(tmp_path / "t.safetensors")),
        checkpoint_io.load_safetensors(tmp_path / "t.safetensors", sha256=digest),
    ):
        assert loaded.keys() == tensors.keys()
        for k, v in tensors.items():
            assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k


EARLIER = {
    # As earlier releases wrote them: bare SHA-256 hex digests, then "blake3:<hex>".
    "SHA-256": lambda data: hashlib.sha256(data).hexdigest(),
    "BLAKE3 hash": lambda data: "blake3:" + blake3.blake3(data).hexdigest(),
}


@pytest.mark.parametrize("algorithm", list(EARLIER))
def test_a_manifest_of_earlier_digests_still_verifies(tmp_path: Path, algorithm: str) -> None:
    accelerator, model, directory = _saved(tmp_path)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["sha256"] = {name: EARLIER[algorithm]((directory / name).read_bytes()) for name in manifest["sha256"]}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(directory)
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    data = bytearray((directory / "model.safetensors").read_bytes())
    data[-3] ^= 0x01
    (directory / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=rf"model\.safetensors does not match the {algorithm} recorded when it was saved"
    ):
        accelerator.load_state(directory)


COUNTED = r"""
import sys
from pathlib import Path
import torch
import torch.distributed as dist
from accel import Accelerator
from accel.checkpoint import state
from accel.errors import CheckpointError

out = Path(sys.argv[1])
accelerator = Accelerator()
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, opt = accelerator.prepare(model, opt)
accelerator.backward(model(torch.ones(2, 16)).sum())
opt.step()
rank = accelerator.process_index
real = dist.all_gather_object
calls = []

def counted(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)

dist.all_gather_object = counted

def count(what, fn):
    calls.clear()
    try:
        fn()
        line = f"rank {rank} {what}: {len(calls)} ok"
    except CheckpointError as exc:
        line = f"rank {rank} {what}: {len(calls)} {exc}"
    sys.stdout.write(line + "\n")  # one write per line: the ranks share the pipe
    sys.stdout.flush()

count("save", lambda: accelerator.save_state(out / "ckpt"))
torch.manual_seed(1234 + rank)
count("load", lambda: accelerator.load_state(out / "ckpt"))
count("async save", lambda: accelerator.save_state(out / "ckpt", async_save=True))
real_torch = state._WRITERS["torch"]

def full(obj, path):
    if path.name == "optimizer.bin" and path.parent.parent.name == "other":
        raise OSError(28, "No space left on device", str(path))
    return real_torch(obj, path)

state._WRITERS["torch"] = full
count("failing async save", lambda: accelerator.save_state(out / "other", async_save=True))
count("next save", lambda: accelerator.save_state(out / "third"))
"""


def test_two_ranks_agree_in_one_collective_per_step_and_share_an_async_failure(write_script, tmp_path: Path) -> None:
    proc = launch(write_script(COUNTED), str(tmp_path), timeout=240)
    found = dict(re.findall(r"rank (\d [a-z ]+): (.*)", proc.stdout))
    for rank in (0, 1):
        assert found[f"{rank} save"] == "2 ok", proc.stdout  # the directory and every rank's share; the outcome
        assert found[f"{rank} load"] == "2 ok", proc.stdout  # the directory; everything read, checked and applied
        assert found[f"{rank} async save"] == "1 ok", proc.stdout
        assert found[f"{rank} failing async save"] == "1 ok", proc.stdout
        # The background failure is raised by the next save, on both ranks, naming the file.
        assert re.match(
            r"1 (The asynchronous|save_state\(.*\) failed on rank 0: CheckpointError: The asynchronous) "
            r"save_state\(\S+other\) failed: .*No space left on device.*optimizer\.bin",
            found[f"{rank} next save"],
        ), (rank, proc.stdout)
    assert (tmp_path / "ckpt" / "random_states_1.pt").is_file()
