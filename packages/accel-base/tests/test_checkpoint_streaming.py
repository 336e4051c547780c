"""Hash verification streams: a verified load never holds a second copy of a file in memory.

Each file is deserialised from disk while a thread hashes it in 4 MiB chunks. Python-level
allocations are what a whole-file read (`read_bytes`) would show up as; tensor storage is
allocated by torch, outside `tracemalloc`'s view, so the peak measured here is the reading
overhead alone.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.checkpoint import io as checkpoint_io
from accel.errors import CheckpointError

MB = 1 << 20


def _big_checkpoint(tmp_path: Path) -> tuple[Accelerator, torch.nn.Module, Path]:
    accelerator = Accelerator()
    model = torch.nn.Linear(2048, 2048)  # 16 MiB of weights; AdamW adds two moments of the same size
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    accelerator.backward(model(torch.randn(2, 2048)).sum())
    opt.step()
    return accelerator, model, Path(accelerator.save_state(tmp_path / "ckpt"))


def test_a_verified_load_reads_each_file_in_chunks(tmp_path: Path) -> None:
    accelerator, model, directory = _big_checkpoint(tmp_path)
    sizes = {p.name: p.stat().st_size for p in directory.iterdir() if p.is_file()}
    assert sizes["model.safetensors"] > 16 * MB and sizes["optimizer.bin"] > 32 * MB, sizes
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    tracemalloc.start()
    try:
        accelerator.load_state(directory)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    # One 4 MiB chunk in flight (plus slack), far below the 16 and 32 MiB a whole-file read would hold.
    assert peak < 10 * MB, f"peak Python allocation {peak / MB:.1f} MiB during a verified load"


def test_a_bit_flip_is_still_caught_by_the_streamed_hash(tmp_path: Path) -> None:
    accelerator, _, directory = _big_checkpoint(tmp_path)
    path = directory / "optimizer.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside tensor data, in a middle chunk
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"optimizer\.bin does not match the XXH3-128 hash recorded"):
        accelerator.load_state(directory)


def test_a_file_replaced_while_it_is_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.bin"
    sha = checkpoint_io.save_torch({"w": torch.arange(10)}, path)
    real_hash = checkpoint_io.hash_file

    def hash_then_replace(target: os.PathLike[str]) -> str:
        # Same bytes, new file: what the hash saw is no longer the file the parser read.
        digest = real_hash(target)
        copy = tmp_path / "copy.bin"
        copy.write_bytes(Path(target).read_bytes())
        os.replace(copy, target)
        return digest

    monkeypatch.setattr(checkpoint_io, "hash_file", hash_then_replace)
    with pytest.raises(CheckpointError, match=r"state\.bin changed while it was being read"):
        checkpoint_io.load_torch(path, sha256=sha)
    monkeypatch.undo()
    assert torch.equal(checkpoint_io.load_torch(path, sha256=sha)["w"], torch.arange(10))
