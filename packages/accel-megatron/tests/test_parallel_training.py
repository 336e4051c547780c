"""TP=2, PP=2 (1F1B, and interleaved with 2 virtual stages) and DP=2 (megatron-core's DDP, with and without its distributed optimizer) on 2 gloo
processes against the same small GPTModel trained on one process with no model parallelism.

Every run starts from the reference's initial weights (loaded through `load_full_state_dict`,
so that is tested too), trains 4 AdamW steps under a warmup schedule, and writes its losses,
learning rates, the batches each rank saw, and its `save_model` output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import WORKERS, run_launch
from safetensors.torch import load_file

pytest.importorskip("megatron.core")

WORKER = WORKERS / "gpt.py"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("megatron")
    run_launch(WORKER, "ref", str(out), nproc=1)
    return out


@pytest.mark.parametrize("mode", ["tp", "pp", "vpp", "dp", "dpopt", "accum"])
def test_two_ranks_match_the_one_process_reference(reference: Path, mode: str) -> None:
    run_launch(WORKER, mode, str(reference))
    ref = json.loads((reference / "ref.json").read_text())
    got = json.loads((reference / f"{mode}.json").read_text())
    if mode == "accum":
        # Two accumulated half-batches per step: their mean loss is the reference's batch loss.
        pairs = zip(got["losses"][::2], got["losses"][1::2])
        got["losses"] = [(a + b) / 2 for a, b in pairs]
        for key in ("seen", "gathered"):
            halves = [got[key]] if key == "gathered" else got[key]
            joined = [[a + b for a, b in zip(h[::2], h[1::2])] for h in halves]
            got[key] = joined[0] if key == "gathered" else joined
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5), mode
    assert got["lrs"] == pytest.approx([0.0075, 0.01, 0.01, 0.01]) == ref["lrs"], "warmup carried into megatron-core"
    # clip_grad_norm_ through megatron-core's optimizer: the norm of the whole model, whatever the sharding.
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4), mode
    assert len(ref["norms"]) == 4 and min(ref["norms"]) > 0
    assert got["eval"] == pytest.approx(ref["eval"], rel=1e-5), "forward-only evaluation (pipeline: train_step)"
    torch.testing.assert_close(torch.tensor(got["eval_outputs"]), torch.tensor(ref["eval_outputs"]), rtol=0, atol=1e-5)

    rank0, rank1 = got["seen"]
    if mode in ("tp", "pp", "vpp", "accum"):
        assert rank0 == rank1, "every process of one model replica must see the same batches"
        assert rank0 == ref["seen"][0]
    else:
        # Each replica takes its half of every batch; together they are the reference's batches.
        assert rank0 != rank1
        assert [a + b for a, b in zip(rank0, rank1)] == ref["seen"][0]

    assert got["gathered"] == ref["seen"][0], "gather_for_metrics over the data-parallel group: each sample once"

    plain = load_file(str(reference / "ref_plain.safetensors"))
    merged = load_file(str(reference / f"{mode}_model" / "model.safetensors"))
    assert set(merged) == set(plain), "save_model writes the names of the unsharded model"
    for name, value in plain.items():
        assert merged[name].shape == value.shape, name
        torch.testing.assert_close(merged[name], value, rtol=0, atol=2e-4, msg=name)


def test_moe_expert_parallel_two_ranks_match_one_process(tmp_path: Path) -> None:
    """megatron-core's MoE layer (2 experts, top-1) with expert_model_parallel_size=2: one expert per process,
    tokens exchanged by its all-gather dispatcher; losses, global gradient norms and the merged weights (experts
    under their global indices) equal the one-process model's."""
    run_launch(WORKERS / "moe.py", "ref", str(tmp_path), nproc=1)
    run_launch(WORKERS / "moe.py", "ep", str(tmp_path))
    ref = json.loads((tmp_path / "moe_ref.json").read_text())
    got = json.loads((tmp_path / "moe_ep.json").read_text())
    assert (ref["experts"], got["experts"]) == (8, 4), "each process holds half of the experts' weights"
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-5)
    plain = load_file(str(tmp_path / "moe_ref_final.safetensors"))
    merged = load_file(str(tmp_path / "moe_ep_final.safetensors"))
    assert set(merged) == set(plain)
    for name, value in plain.items():
        torch.testing.assert_close(merged[name], value, rtol=0, atol=2e-5, msg=name)
