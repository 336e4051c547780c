"""TP=2, PP=2 (1F1B, and interleaved with 2 virtual stages) and DP=2 (megatron-core's DDP, with and without its distributed optimizer) on 2 gloo
processes against the same small GPTModel trained on one process with no model parallelism.

Every run starts from the reference's initial weights (loaded through `load_full_state_dict`,
so that is tested too), trains 4 AdamW steps under a warmup schedule, and writes its losses,
learning rates, the batches each rank saw, and its `save_model` output.
"""

from __future__ import annotations

import json
import math
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
    if mode in ("pp", "accum"):
        _check_tensorboard(reference, mode, ref, merged)


def _check_tensorboard(reference: Path, mode: str, ref: dict, merged: dict[str, torch.Tensor]) -> None:
    """Megatron-LM's training scalars from the last process of the two, against the one-process run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def scalars(run: str) -> dict[str, list[tuple[int, float]]]:
        events = EventAccumulator(str(reference / f"{run}_tb"))
        events.Reload()
        return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}

    got, one = scalars(mode), scalars("ref")
    tracked = ["learning-rate", "batch-size", "lm loss", "loss-scale", "world-size", "grad-norm", "num-zeros"]
    tracked.append("params-norm")
    validation = ["lm loss validation", "lm loss validation ppl"]
    expected = {*tracked, *validation, *(f"{name} vs samples" for name in tracked + validation), "iteration-time"}
    assert set(got) == expected, sorted(got)
    # log_eval_results after the 4 steps (32 samples): the forward-only evaluation's loss.
    assert got["lm loss validation"] == [(4, pytest.approx(ref["eval"], rel=1e-5))]
    assert got["lm loss validation vs samples"] == [(32, pytest.approx(ref["eval"], rel=1e-5))]
    assert got["lm loss validation ppl vs samples"] == [(32, pytest.approx(math.exp(ref["eval"]), rel=1e-5))]
    steps = [1, 2, 3, 4]
    samples = [8 * s for s in steps]  # Megatron-LM's consumed samples: the global batch (8) per step
    for name in tracked:
        assert [s for s, _ in got[name]] == steps and [s for s, _ in got[f"{name} vs samples"]] == samples, name
        assert [v for _, v in got[name]] == [v for _, v in got[f"{name} vs samples"]], name

    def values(name: str, run: dict = got) -> list[float]:
        return [v for _, v in run[name]]

    assert values("batch-size") == [8.0] * 4, "micro-batches x data-parallel size x accumulation"
    assert values("world-size") == [2.0] * 4 and values("world-size", one) == [1.0] * 4
    assert values("loss-scale") == [1.0] * 4
    assert values("learning-rate") == pytest.approx([0.005, 0.0075, 0.01, 0.01]), "the rate each step used"
    assert values("lm loss") == pytest.approx(ref["losses"], rel=1e-5)
    assert values("grad-norm") == pytest.approx(ref["norms"], rel=1e-4)
    # Zero gradient entries over every shard, each parameter once (ordinary ones are the unseen tokens' embedding
    # rows; a few more or fewer where summing micro-batches rounds to exactly zero or not).
    numel = sum(w.numel() for w in merged.values())
    assert values("num-zeros") == pytest.approx(values("num-zeros", one), rel=0.05) and max(values("num-zeros")) < numel
    # The parameter norm of the whole model, each tensor-parallel duplicate once, whatever the sharding.
    assert values("params-norm") == pytest.approx(values("params-norm", one), rel=1e-5)
    full = torch.cat([w.float().flatten() for w in merged.values()])
    assert values("params-norm")[-1] == pytest.approx(float(full.norm()), rel=1e-5)
    assert len(got["iteration-time"]) == 4 and all(v > 0 for v in values("iteration-time"))


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
