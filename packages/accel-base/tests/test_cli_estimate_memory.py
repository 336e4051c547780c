"""`accel estimate-memory` against the bytes each process really holds after a training step: one
process (DDP's figures) and 2 FSDP2 processes (local shards), counted tensor by tensor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from accel.commands import UsageError
from accel.commands.estimate_memory import build_on_meta, model_sizes, per_process_bytes
from conftest import launch

NET = """
import torch

class Block(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

def Net(hidden=16, blocks=3):
    return torch.nn.Sequential(torch.nn.ModuleList([Block(hidden) for _ in range(blocks)]), torch.nn.Linear(hidden, 2))

class Model(torch.nn.Module):
    def __init__(self, hidden=16, blocks=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(hidden) for _ in range(blocks)])
        self.head = torch.nn.Linear(hidden, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)
"""

MEASURE = """
import json, sys
import torch
from accel import Accelerator
from memnet import Model

def local(t):
    return t.to_local() if hasattr(t, "to_local") else t

def nbytes(tensors):
    return sum(local(t).numel() * local(t).element_size() for t in tensors)

accelerator = Accelerator(strategy=sys.argv[2])
model = Model()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
loss = model(torch.randn(4, 16)).pow(2).mean()
accelerator.backward(loss)
optimizer.step()
params = list(model.parameters())
states = [v for s in optimizer.optimizer.state.values() for k, v in s.items() if k != "step"]
row = {"parameters": nbytes(params), "gradients": nbytes(p.grad for p in params), "optimizer": nbytes(states)}
(open(sys.argv[1] + f"/rank{accelerator.process_index}.json", "w")).write(json.dumps(row))
"""


@pytest.fixture
def memnet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "memnet.py").write_text(NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def estimate(folder: Path, *args: str) -> dict[str, dict[str, int]]:
    proc = subprocess.run(
        [sys.executable, "-m", "accel.cli", "estimate-memory", "memnet:Model", "--json", *args],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["per_process_bytes"]


def measure(folder: Path, strategy: str, nproc: int) -> list[dict[str, int]]:
    script = folder / "measure.py"
    script.write_text(MEASURE)
    out = folder / f"out_{strategy}"
    out.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    launch(script, str(out), strategy, nproc=nproc, launch_args=("--cpu",), env=env, timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def test_one_process_matches_the_tensors_it_holds(memnet: Path) -> None:
    estimated = estimate(memnet, "--num-processes", "1", "--optimizer", "adamw")["ddp"]
    (measured,) = measure(memnet, "ddp", 1)
    for key in ("parameters", "gradients", "optimizer"):
        assert estimated[key] == measured[key], key


def test_fsdp2_shards_match_the_estimate_on_every_process(memnet: Path) -> None:
    estimated = estimate(memnet, "--num-processes", "2", "--optimizer", "adamw")
    for row in measure(memnet, "fsdp2", 2):
        for key in ("parameters", "gradients", "optimizer"):
            assert estimated["fsdp2"][key] == row[key], key
    # ZeRO rows follow the same arithmetic over the same full sizes.
    assert estimated["zero3"]["total"] == estimated["fsdp2"]["total"]
    assert estimated["zero1"]["optimizer"] == estimated["fsdp2"]["optimizer"]
    assert estimated["zero1"]["parameters"] == estimated["ddp"]["parameters"]


def test_sizes_of_a_known_model(memnet: Path) -> None:
    sizes = model_sizes(build_on_meta("memnet:Net", {"hidden": 16, "blocks": 3}, "bfloat16"))
    block = 16 * 64 + 64 + 64 * 16 + 16
    assert sizes.parameters == 3 * block + 16 * 2 + 2
    assert sizes.parameter_bytes == 2 * sizes.parameters
    assert sizes.largest_unit_bytes == 2 * block
    ddp = per_process_bytes(sizes, "ddp", 4, "adam")
    assert ddp["optimizer"] == 8 * sizes.parameters and ddp["gathered unit"] == 0
    zero2 = per_process_bytes(sizes, "zero2", 4, "adam")
    assert zero2["gradients"] == -(-sizes.parameter_bytes // 4)


def test_bad_model_spec_is_a_usage_error(memnet: Path) -> None:
    with pytest.raises(UsageError, match="MODEL must be module:callable"):
        build_on_meta("memnet", {}, "float32")
    with pytest.raises(UsageError, match="cannot import memnet:Nope"):
        build_on_meta("memnet:Nope", {}, "float32")
    with pytest.raises(UsageError, match=r"not a torch\.nn\.Module"):
        build_on_meta("torch:zeros", {"size": (1,)}, "float32")


def test_a_hugging_face_config_or_model_type_is_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As `accelerate estimate-memory` users expect: a transformers model type with config fields, or a local
    config.json (what a hub model's folder holds), built on the meta device without downloading."""
    transformers = pytest.importorskip("transformers")
    from accel.cli import main

    fields = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 100, "n_positions": 32}
    real = transformers.GPT2Model(transformers.GPT2Config(**fields))  # real tensors, counted another way
    expected = sum(p.numel() for p in real.parameters())
    expected_unit = sum(p.numel() * 4 for p in real.h[0].parameters())
    by_type = model_sizes(build_on_meta("gpt2", fields, "float32"))
    assert (by_type.parameters, by_type.parameter_bytes, by_type.largest_unit_bytes) == (
        expected,
        4 * expected,
        expected_unit,
    )
    real.config.to_json_file(tmp_path / "config.json")
    for spec in (str(tmp_path / "config.json"), str(tmp_path)):
        assert model_sizes(build_on_meta(spec, {}, "bfloat16")).parameter_bytes == 2 * expected
    # --kwargs override a file's fields.
    assert model_sizes(build_on_meta(str(tmp_path), {"n_layer": 1}, "float32")).parameters == expected - sum(
        p.numel() for p in real.h[1].parameters()
    )
    assert main(["estimate-memory", "gpt2", "--kwargs", json.dumps(fields), "--num-processes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parameters"] == expected
    assert out["per_process_bytes"]["ddp"]["parameters"] == 4 * expected
    with pytest.raises(UsageError, match=r"huggingface-cli download bert-base-cased config.json"):
        build_on_meta("bert-base-cased", {}, "float32")
    with pytest.raises(UsageError, match=r"--kwargs for a gpt2 config: .*n_layer"):
        build_on_meta("gpt2", {"n_embd": 65, "n_head": 2, "n_layer": "x"}, "float32")
