"""Checkpoint digests: chunked XXH3-128 computed in the one pass that writes or reads the bytes; whole-file XXH3-128,
BLAKE3 and SHA-256 manifests of earlier releases still verified; the ranks agreeing in one collective per save step,
and the processes of a node hashing each chunk of the files they all read once between them (2 gloo processes)."""

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
from accel.checkpoint import digest
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


def _chunked_xxh3(data: bytes) -> str:
    """The documented digest: XXH3-128 of the 16-byte XXH3-128 digests of the 16 MiB chunks, in order."""
    chunk = 16 << 20
    inner = b"".join(xxhash.xxh3_128(data[i : i + chunk]).digest() for i in range(0, len(data), chunk))
    return "xxh3-128/16MiB:" + xxhash.xxh3_128(inner).hexdigest()


def test_the_chunked_digest_is_the_same_fed_in_any_pieces() -> None:
    data = bytes(range(256)) * ((33 << 20) // 256) + b"tail"  # two whole chunks and a short one
    for piece in (1 << 20, (16 << 20) - 1, 16 << 20, 5_000_011):
        hasher = digest.Hasher()
        for i in range(0, len(data), piece):
            hasher.update(data[i : i + piece])
        assert hasher.text() == _chunked_xxh3(data), piece
    parts = digest.chunk_digests(data, [2, 0]) | digest.chunk_digests(data, [1])
    assert digest.combine(parts[i] for i in range(3)) == _chunked_xxh3(data)
    assert digest.of_bytes(b"") == "xxh3-128/16MiB:" + xxhash.xxh3_128(b"").hexdigest()


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
        assert recorded == _chunked_xxh3((directory / name).read_bytes()), name


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
    # As earlier releases wrote them: bare SHA-256 hex digests, then "blake3:<hex>", then "xxh3-128:<hex>".
    "SHA-256": lambda data: hashlib.sha256(data).hexdigest(),
    "BLAKE3 hash": lambda data: "blake3:" + blake3.blake3(data).hexdigest(),
    "XXH3-128 hash": lambda data: "xxh3-128:" + xxhash.xxh3_128(data).hexdigest(),
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


SPLIT = r"""
import json, sys
from pathlib import Path
import torch
from accel import Accelerator
from accel.checkpoint import io as checkpoint_io
from accel.errors import CheckpointError

out = Path(sys.argv[1])
accelerator = Accelerator()
rank = accelerator.process_index
torch.manual_seed(0)
model = torch.nn.Linear(2048, 2048)  # 16 MiB and a bias: two chunks, as is the momentum in optimizer.bin
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, opt = accelerator.prepare(model, opt)
accelerator.backward(model(torch.ones(2, 2048)).sum())
opt.step()
directory = Path(accelerator.save_state(out / "ckpt"))
saved = {k: v.clone() for k, v in model.state_dict().items()}
hashed = []
real = checkpoint_io.SharedHashing.hash_part

def recorded(self, path, *args):
    real(self, path, *args)
    hashed.append((Path(path).name, sorted(self.hashed[str(path)][3])))

checkpoint_io.SharedHashing.hash_part = recorded

def report(what, fn):
    hashed.clear()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(rank + 5)
    try:
        fn()
        outcome = "ok" if all(torch.equal(v, saved[k]) for k, v in model.state_dict().items()) else "wrong weights"
    except CheckpointError as exc:
        untouched = all(bool((p == rank + 5).all()) for p in model.parameters())
        outcome = f"{'untouched' if untouched else 'CHANGED'}: {exc}"
    line = json.dumps({"rank": rank, "what": what, "outcome": outcome, "hashed": sorted(hashed)})
    sys.stdout.write("RESULT " + line + "\n")
    sys.stdout.flush()

report("load", lambda: accelerator.load_state(directory))
for name in ("model.safetensors", "optimizer.bin"):
    for chunk in (0, 1):
        path = directory / name
        data = path.read_bytes()
        accelerator.wait_for_everyone()
        if rank == 0:
            flipped = bytearray(data)
            flipped[chunk * (16 << 20) + 4096] ^= 0x20
            path.write_bytes(bytes(flipped))
        accelerator.wait_for_everyone()
        report(f"{name} chunk {chunk}", lambda: accelerator.load_state(directory))
        accelerator.wait_for_everyone()
        if rank == 0:
            path.write_bytes(data)
        accelerator.wait_for_everyone()
"""


def test_the_processes_of_a_node_hash_each_chunk_once_and_all_refuse_a_damaged_one(
    write_script, tmp_path: Path
) -> None:
    proc = launch(write_script(SPLIT), str(tmp_path), timeout=240)
    results = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    by = {(r["rank"], r["what"]): r for r in results}
    assert len(by) == 10, proc.stdout
    # Each chunk of each file both ranks read is hashed by exactly one of them.
    shares: dict[str, list[int]] = {}
    for rank in (0, 1):
        assert by[(rank, "load")]["outcome"] == "ok", proc.stdout
        for name, chunks in by[(rank, "load")]["hashed"]:
            shares.setdefault(name, []).extend(chunks)
    # (Small JSON files and each rank's random states are hashed whole by the process reading them.)
    assert sorted(shares) == ["model.safetensors", "optimizer.bin"], shares
    assert sorted(shares["model.safetensors"]) == [0, 1] and sorted(shares["optimizer.bin"]) == [0, 1], shares
    # A damaged chunk, whichever rank hashed it, is refused on both ranks with nothing loaded.
    for name in ("model.safetensors", "optimizer.bin"):
        for chunk in (0, 1):
            for rank in (0, 1):
                outcome = by[(rank, f"{name} chunk {chunk}")]["outcome"]
                assert outcome.startswith("untouched: "), (rank, name, chunk, outcome)
                assert re.search(rf"{re.escape(name)} does not match the XXH3-128 hash recorded", outcome), outcome


def test_checkpoint_torch_files_are_written_without_zip_crcs_and_other_saves_keep_them(tmp_path: Path) -> None:
    import zipfile

    assert torch.serialization.get_crc32_options() is True
    digest = checkpoint_io.save_torch({"w": torch.arange(1000)}, tmp_path / "ours.bin", zip_crc=False)
    with zipfile.ZipFile(tmp_path / "ours.bin") as archive:
        assert all(info.CRC == 0 for info in archive.infolist() if info.file_size), "the manifest's digest covers it"
    assert torch.equal(checkpoint_io.load_torch(tmp_path / "ours.bin", sha256=digest)["w"], torch.arange(1000))
    # A checkpoint's files go without them; weights users take elsewhere keep them, and so does the user's own
    # torch.save afterwards.
    _, _, directory = _saved(tmp_path)
    with zipfile.ZipFile(directory / "optimizer.bin") as archive:
        assert not any(info.CRC for info in archive.infolist())
    checkpoint_io.write_weights({"w": torch.arange(1000)}, tmp_path / "pytorch_model.bin", safe=False)
    with zipfile.ZipFile(tmp_path / "pytorch_model.bin") as archive:
        assert archive.testzip() is None and any(info.CRC for info in archive.infolist())
    assert torch.serialization.get_crc32_options() is True
    torch.save({"w": torch.arange(1000)}, tmp_path / "theirs.bin")
    with zipfile.ZipFile(tmp_path / "theirs.bin") as archive:
        assert archive.testzip() is None and any(info.CRC for info in archive.infolist())
