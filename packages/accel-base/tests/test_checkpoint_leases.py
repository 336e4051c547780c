"""Model weights read in place: `load_state` copies them from the page cache into the model, under a read lease.

The lease makes the kernel hold back any other process that opens the file for writing or
truncates it until the load is over, so the model gets the bytes that were hashed and the
mapping never loses its pages. Where no lease can be had, the weights are copied into memory
of their own first, as before.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.checkpoint import io as checkpoint_io
from accel.errors import CheckpointError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="file leases are Linux's")


def _saved(tmp_path: Path) -> tuple[Accelerator, torch.nn.Module, Path, dict[str, torch.Tensor]]:
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    accelerator.backward(model(torch.randn(4, 64)).sum())
    opt.step()
    directory = Path(accelerator.save_state(tmp_path / "ckpt"))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return accelerator, model, directory, saved


def _start(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def _opens_for_writing_at_once(path: Path) -> bool:
    """Whether another process can open `path` for writing within 10 s (a lease still held would stop it 45 s)."""
    writer = _start(f"open({str(path)!r}, 'r+b').close()")
    try:
        return writer.wait(timeout=10) == 0
    except subprocess.TimeoutExpired:
        writer.kill()
        return False


def test_a_truncation_during_the_load_waits_until_the_model_holds_the_verified_weights(tmp_path: Path) -> None:
    accelerator, model, directory, saved = _saved(tmp_path)
    path = directory / "model.safetensors"
    seen: list[tuple[bool, int]] = []

    def truncate_meanwhile(*_args: object) -> None:
        # Inside Module.load_state_dict, before it copies: the file is hashed and mapped, the lease held.
        writer = _start(f"import os; os.truncate({str(path)!r}, 0)")
        try:
            writer.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            seen.append((True, path.stat().st_size))  # held back by the lease, the file whole
            return
        seen.append((False, path.stat().st_size))

    handle = model.register_load_state_dict_pre_hook(truncate_meanwhile)
    accelerator.load_state(directory)
    handle.remove()
    assert seen and seen[0][0] and seen[0][1] > 0, seen
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    # The lease ended with the load: the truncation went through, and the process outlived its signal.
    deadline_ok = _opens_for_writing_at_once(path)
    assert deadline_ok and path.stat().st_size == 0


def test_the_lease_ends_when_a_load_fails(tmp_path: Path) -> None:
    accelerator, model, directory, _ = _saved(tmp_path)
    optimizer = directory / "optimizer.bin"
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0x10
    optimizer.write_bytes(bytes(data))  # read after the model's file, which is leased by then
    with pytest.raises(CheckpointError, match=r"optimizer\.bin does not match the XXH3-128 hash recorded"):
        accelerator.load_state(directory)
    assert all(not p.any() for p in model.parameters())  # nothing was loaded
    assert _opens_for_writing_at_once(directory / "model.safetensors")


def test_a_file_that_cannot_be_leased_is_copied_and_verified_as_before(tmp_path: Path) -> None:
    accelerator, model, directory, saved = _saved(tmp_path)
    path = directory / "model.safetensors"
    with open(path, "r+b"):  # open for writing: the kernel grants no read lease
        assert checkpoint_io.map_safetensors(path) is None
        accelerator.load_state(directory)
        assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x01  # in the last tensor's bytes
        path.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=r"model\.safetensors does not match the XXH3-128 hash recorded"):
            accelerator.load_state(directory)


def test_a_mapped_file_is_verified_before_its_tensors_are_given_out(tmp_path: Path) -> None:
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(0), "c": torch.tensor([7])}
    path = tmp_path / "w.safetensors"
    digest = checkpoint_io.save_safetensors(tensors, path)
    mapped = checkpoint_io.map_safetensors(path, sha256=digest)
    assert mapped is not None
    try:
        out = mapped.verify()
        assert list(out) == ["a", "b", "c"]
        assert all(torch.equal(out[k], tensors[k]) and out[k].dtype == tensors[k].dtype for k in tensors)
    finally:
        mapped.release()
    assert _opens_for_writing_at_once(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    mapped = checkpoint_io.map_safetensors(path, sha256=digest)
    assert mapped is not None
    try:
        with pytest.raises(CheckpointError, match=r"w\.safetensors does not match the XXH3-128 hash recorded"):
            mapped.verify()
    finally:
        mapped.release()
