"""`accel merge-weights`: a real 2-process FSDP2 sharded `save_state`, merged into one safetensors file
that equals the full state dict the run gathered itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accel.commands import UsageError
from accel.commands.merge_weights import merge_weights
from accel.errors import CheckpointError
from conftest import launch
from safetensors.torch import load_file

TRAIN = """
import sys
from pathlib import Path
import torch
from accel import Accelerator, FSDPConfig
from safetensors.torch import save_file

out = Path(sys.argv[1])
accelerator = Accelerator(fsdp_plugin=FSDPConfig(state_dict_type="SHARDED_STATE_DICT"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(3):
    torch.manual_seed(100 + step)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
accelerator.save_state(str(out / "ckpt"))
full = accelerator.get_state_dict(model)
if accelerator.is_main_process:
    save_file({k: v.contiguous() for k, v in full.items()}, str(out / "reference.safetensors"))
"""


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    script = out / "train.py"
    script.write_text(TRAIN)
    launch(script, str(out), timeout=300)
    assert (out / "ckpt" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    return out


def test_merged_file_equals_the_gathered_state_dict(sharded: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "accel.cli", "merge-weights", str(sharded / "ckpt"), str(tmp_path / "merged")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    reference = load_file(str(sharded / "reference.safetensors"))
    assert sorted(merged) == sorted(reference) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for name, tensor in reference.items():
        assert torch.equal(merged[name], tensor), name


def test_the_shard_folder_itself_and_unsafe_serialization(sharded: Path, tmp_path: Path) -> None:
    target = merge_weights(sharded / "ckpt" / "pytorch_model_fsdp_0", tmp_path / "bin", safe_serialization=False)
    assert target.name == "pytorch_model.bin"
    merged = torch.load(target, weights_only=True)
    reference = load_file(str(sharded / "reference.safetensors"))
    assert all(torch.equal(merged[k], v) for k, v in reference.items())


def test_what_cannot_be_merged_says_why(sharded: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a folder"):
        merge_weights(tmp_path / "nothing", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no sharded checkpoint: expected a save_state folder"):
        merge_weights(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(CheckpointError, match="optimizer checkpoint"):
        merge_weights(sharded / "ckpt" / "optimizer_0", tmp_path / "out")
    proc = subprocess.run(
        [sys.executable, "-m", "accel.cli", "merge-weights", str(tmp_path / "empty"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_deepspeed_checkpoint_without_deepspeed_names_the_extra(tmp_path: Path) -> None:
    from accel.commands.env import installed

    if installed("deepspeed"):
        pytest.skip("deepspeed is installed here")
    (tmp_path / "pytorch_model").mkdir()
    (tmp_path / "pytorch_model" / "mp_rank_00_model_states.pt").write_bytes(b"")
    with pytest.raises(UsageError, match=r"pip install 'accel-base\[deepspeed\]'"):
        merge_weights(tmp_path, tmp_path / "out")


def test_remove_checkpoint_dir(sharded: Path, tmp_path: Path) -> None:
    import shutil

    # As with Accelerate: the model's shard folder, every file of which it read, goes.
    copy = tmp_path / "pytorch_model_fsdp_0"
    shutil.copytree(sharded / "ckpt" / "pytorch_model_fsdp_0", copy)
    merge_weights(copy, tmp_path / "merged", remove_checkpoint_dir=True)
    assert (tmp_path / "merged" / "model.safetensors").is_file() and not copy.exists()


def test_an_output_inside_the_checkpoint_with_remove_is_refused_before_anything(sharded: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(sharded / "ckpt", copy)
    before = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    with pytest.raises(UsageError, match=r"would delete the merged file with the checkpoint\. Nothing was done"):
        merge_weights(copy, copy / "merged", remove_checkpoint_dir=True)
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == before


def test_remove_deletes_only_the_files_it_read(sharded: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(sharded / "ckpt", copy)
    (copy / "notes.txt").write_text("mine")
    merge_weights(copy, tmp_path / "merged", remove_checkpoint_dir=True)
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert not (copy / "pytorch_model_fsdp_0").exists() and not (copy / "accel_checkpoint.json").exists()
    # Files it did not read stay: the user's, and the optimizer's shards.
    assert (copy / "notes.txt").read_text() == "mine" and (copy / "optimizer_0" / ".metadata").is_file()


def test_an_existing_output_file_is_refused_and_kept(sharded: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_text("mine")
    with pytest.raises(UsageError, match=r"model\.safetensors already exists: merge-weights does not overwrite it"):
        merge_weights(sharded / "ckpt", tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").read_text() == "mine"


def test_a_fifo_in_a_shards_place_is_refused_without_blocking(sharded: Path, tmp_path: Path) -> None:
    import os
    import shutil

    from test_checkpoint_paths import _within

    copy = tmp_path / "shards"
    shutil.copytree(sharded / "ckpt" / "pytorch_model_fsdp_0", copy)
    shard = next(copy.glob("*.distcp"))
    shard.unlink()
    os.mkfifo(shard)
    error = _within(30, lambda: merge_weights(copy, tmp_path / "out"), fifo=shard)
    assert isinstance(error, CheckpointError) and f"{shard.name} is a FIFO, not a regular file" in str(error), error


def test_an_impossible_tensor_size_in_the_metadata_is_refused(sharded: Path, tmp_path: Path) -> None:
    import pickle
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(sharded / "ckpt" / "pytorch_model_fsdp_0", copy)
    metadata = pickle.loads((copy / ".metadata").read_bytes())  # written by this test's own run
    fqn = next(k for k in metadata.state_dict_metadata if k.endswith("0.weight"))
    metadata.state_dict_metadata[fqn].size = torch.Size([1 << 40, 1 << 20])
    (copy / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match=rf"records tensor '{fqn}' of shape \(1099511627776, 1048576\)"):
        merge_weights(copy, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_accelerates_merge_fsdp_weights_refuses_an_output_it_would_delete(sharded: Path, tmp_path: Path) -> None:
    import shutil

    from accel.compat.other import merge_fsdp_weights

    copy = tmp_path / "pytorch_model_fsdp_0"
    shutil.copytree(sharded / "ckpt" / "pytorch_model_fsdp_0", copy)
    before = sorted(p.name for p in copy.iterdir())
    with pytest.raises(ValueError, match=r"would delete the merged file with the checkpoint\. Nothing was done"):
        merge_fsdp_weights(str(copy), str(copy / "merged"), remove_checkpoint_dir=True)
    assert sorted(p.name for p in copy.iterdir()) == before


def test_accelerates_merge_fsdp_weights_reads_safely_replaces_its_output_and_deletes_only_what_it_read(
    sharded: Path, tmp_path: Path
) -> None:
    import pickle
    import shutil

    from accel.compat.other import merge_fsdp_weights
    from accel.errors import UnsafeCheckpointError

    copy = tmp_path / "pytorch_model_fsdp_0"
    shutil.copytree(sharded / "ckpt" / "pytorch_model_fsdp_0", copy)
    (copy / "notes.txt").write_text("mine")
    out = tmp_path / "merged"
    out.mkdir()
    (out / "model.safetensors").write_text("an older merge")  # Accelerate's function replaces it
    merge_fsdp_weights(str(copy), str(out), remove_checkpoint_dir=True)
    reference = load_file(sharded / "reference.safetensors")
    merged = load_file(out / "model.safetensors")
    assert set(merged) == set(reference)
    for name, value in reference.items():
        torch.testing.assert_close(merged[name], value, rtol=0, atol=0)
    assert sorted(p.name for p in copy.iterdir()) == ["notes.txt"], "only the files it read were deleted"
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"], "no temporary file is left"

    # A metadata file that would run code on unpickling is refused: the restricted reader, not torch's.
    crafted = tmp_path / "crafted"
    shutil.copytree(sharded / "ckpt" / "pytorch_model_fsdp_0", crafted)
    (crafted / ".metadata").write_bytes(pickle.dumps(print))
    with pytest.raises(UnsafeCheckpointError, match=r"references builtins\.print"):
        merge_fsdp_weights(str(crafted), str(tmp_path / "out2"))
    with pytest.raises(ValueError, match=r"couldn't find a valid metadata file: it does not exist"):
        merge_fsdp_weights(str(tmp_path / "missing"), str(tmp_path / "out3"))


def test_shards_are_checked_against_xxh3_and_older_blake3_and_sha256_manifests(sharded: Path, tmp_path: Path) -> None:
    """A shard whose bytes differ from its manifest's digest is refused (nothing merged); manifests written before
    chunked XXH3-128 (whole-file XXH3-128 "xxh3-128:<hex>", BLAKE3 "blake3:<hex>", bare SHA-256 hex digests) still
    verify and merge."""
    import hashlib
    import json
    import shutil

    import blake3
    import xxhash

    ckpt = tmp_path / "ckpt"
    shutil.copytree(sharded / "ckpt", ckpt)
    manifest_path = ckpt / "accel_checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    shards = sorted(n for n in manifest["sha256"] if n.startswith("pytorch_model_fsdp_0/") and n.endswith(".distcp"))
    assert shards and all(manifest["sha256"][n].startswith("xxh3-128/16MiB:") for n in shards)
    reference = load_file(str(sharded / "reference.safetensors"))
    earlier = {
        "xxh3": lambda data: "xxh3-128:" + xxhash.xxh3_128(data).hexdigest(),
        "blake3": lambda data: "blake3:" + blake3.blake3(data).hexdigest(),
        "sha256": lambda data: hashlib.sha256(data).hexdigest(),
    }
    for algorithm, digest in earlier.items():  # as checkpoints written before recorded them
        for name in shards:
            manifest["sha256"][name] = digest((ckpt / name).read_bytes())
        manifest_path.write_text(json.dumps(manifest))
        merged = load_file(str(merge_weights(ckpt, tmp_path / f"merged_{algorithm}")))
        assert all(torch.equal(merged[k], v) for k, v in reference.items()), algorithm
    shard = ckpt / shards[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the digest its checkpoint's manifest records"):
        merge_weights(ckpt, tmp_path / "again")
    assert not (tmp_path / "again").exists()
