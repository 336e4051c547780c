"""Accelerate's MegatronLMPlugin fields on one process: each honoured (recomputation, schedules, parameter-group
conditions, clip_grad_norm_, TensorBoard, optimizer-state checkpoint options) or refused by name."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel_megatron import MegatronConfigError, MegatronLMDummyScheduler, MegatronPlugin, ModelProvider
from conftest import WORKERS

sys.path.insert(0, str(WORKERS))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pipeline_model_parallel_split_rank": 1}, "pipeline_model_parallel_split_rank is not supported: .*encoder"),
        ({"use_custom_fsdp": True}, "use_custom_fsdp is not supported: Megatron-FSDP needs CUDA"),
        ({"eod_mask_loss": True}, "eod_mask_loss is not supported: .*mask end-of-document tokens"),
        ({"calculate_per_token_loss": True}, "calculate_per_token_loss is not supported"),
        ({"is_train_batch_min": False}, "is_train_batch_min is not supported: each prepared loader"),
        ({"train_samples": 100, "train_iters": 10}, "train_samples is not supported: give train_iters or"),
        ({"lr_warmup_samples": 10}, "lr_warmup_samples is not supported: sample counts need train_samples"),
        ({"recompute_granularity": "full"}, "needs recompute_method .* and recompute_num_layers"),
        ({"recompute_granularity": "some"}, "recompute_granularity must be"),
        ({"recompute_method": "block"}, "apply to recompute_granularity='full' only"),
        ({"decoder_last_pipeline_num_layers": 1}, "needs pp_degree > 1"),
        ({"optimizer_cpu_offload": True}, "needs use_distributed_optimizer=True"),
        ({"lr_decay_style": "step"}, "lr_decay_style must be one of"),
        ({"lr_decay_style": "WSD"}, "needs lr_wsd_decay_iters"),
        ({"weight_decay_incr_style": "linear"}, "needs start_weight_decay and end_weight_decay"),
        ({"start_weight_decay": 0.1}, "need weight_decay_incr_style 'linear' or 'cosine'"),
        ({"lr_warmup_iters": 1, "lr_warmup_fraction": 0.1}, "not both"),
        ({"recompute_num_layers": "two"}, "recompute_num_layers must be a int"),
        ({"custom_train_step_kwargs": {"a": 1}}, "custom_train_step_kwargs is not supported: .*not set"),
        ({"custom_prepare_model_function": len}, "custom_prepare_model_function is not supported"),
        ({"encoder_seq_length": 8}, "encoder_seq_length is not supported: no encoder-decoder"),
    ],
)
def test_fields_without_a_counterpart_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(MegatronConfigError, match=message):
        MegatronPlugin(**kwargs)


def test_settings_strings_take_the_fields_type() -> None:
    """Accelerate's MEGATRON_LM_* settings arrive as strings."""
    plugin = MegatronPlugin(recompute_granularity="full", recompute_method="uniform", recompute_num_layers="2")
    assert plugin.recompute_num_layers == 2
    assert MegatronPlugin(hidden_dropout="0.25", no_save_optim="true").hidden_dropout == 0.25
    assert MegatronPlugin(attention_backend="True").attention_backend is None, "Accelerate's boolean: the default"
    assert MegatronPlugin(attention_backend=False).attention_backend == "local"
    with pytest.raises(MegatronConfigError, match="attention_backend must be one of"):
        MegatronPlugin(attention_backend="fastest")
    assert MegatronPlugin(context_parallel_size=1).cp_degree == 1
    assert MegatronPlugin(context_parallel_size="2").cp_degree == 2, "Accelerate's name for cp_degree"


def test_cuda_only_optimizer_fields_and_attention_backends_are_refused_off_cuda() -> None:
    for name in ("use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d"):
        with pytest.raises(MegatronConfigError, match=f"{name} needs megatron-core's CUDA optimizer kernels"):
            MegatronPlugin(**{name: True}).validate(1, "cpu")
        MegatronPlugin(**{name: True}).validate(1, "cuda")
    with pytest.raises(MegatronConfigError, match="attention_backend='flash' needs Transformer Engine"):
        MegatronPlugin(attention_backend="flash").validate(1, "cpu")


def test_model_fields_reach_the_transformer_config() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import AttnBackend

    plugin = MegatronPlugin(
        pp_degree=2,
        recompute_granularity="full",
        recompute_method="block",
        recompute_num_layers=1,
        attention_dropout=0.1,
        hidden_dropout=0.2,
        attention_softmax_in_fp32=False,
        attention_backend="local",
        decoder_last_pipeline_num_layers=3,
        use_rotary_position_embeddings=True,
        other_megatron_args={"normalization": "RMSNorm"},
    )
    got = plugin.transformer_config_kwargs()
    assert {k: got[k] for k in ("recompute_granularity", "recompute_method", "recompute_num_layers")} == {
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 1,
    }
    assert (got["attention_dropout"], got["hidden_dropout"], got["attention_softmax_in_fp32"]) == (0.1, 0.2, False)
    assert got["attention_backend"] is AttnBackend.local
    assert got["num_layers_in_last_pipeline_stage"] == 3
    assert got["normalization"] == "RMSNorm"
    assert plugin.gpt_model_kwargs() == {"position_embedding_type": "rope"}
    assert (
        MegatronPlugin(recompute_activations=True).transformer_config_kwargs()["recompute_granularity"] == "selective"
    )
    with pytest.raises(MegatronConfigError, match=r"other_megatron_args \['lr_warmup_init'\] are not megatron-core"):
        MegatronPlugin(other_megatron_args={"lr_warmup_init": 0.1}).transformer_config_kwargs()


def test_a_prebuilt_model_without_the_plugins_model_fields_is_refused(megatron_world) -> None:
    """recompute_activations (and every model field) reaches a prebuilt model or is refused: never ignored."""
    from resume import gpt_provider

    built_for = MegatronPlugin()
    plugin = MegatronPlugin(recompute_activations=True, use_rotary_position_embeddings=True)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    with pytest.raises(MegatronConfigError, match=r"recompute_granularity=None \(plugin: selective\)") as info:
        accelerator.prepare(ModelProvider(gpt_provider(built_for)))
    assert "position_embedding_type=learned_absolute (plugin: rope)" in str(info.value)


def _train(
    plugin: MegatronPlugin,
    steps: int = 3,
    *,
    clip: float | None = None,
    scheduler: Any = None,
    weight_decay: float = 0.0,
    hook: Any = None,
) -> dict[str, Any]:
    """Train the small GPTModel of the resume worker `steps` AdamW steps on one process."""
    from accel.testing.pytest_plugin import reset_state
    from megatron.core import parallel_state
    from resume import BATCH, SEQ, VOCAB, gpt_provider

    reset_state()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    model = accelerator.prepare(ModelProvider(gpt_provider(plugin)))
    if hook is not None:
        hook(accelerator.unwrap_model(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=weight_decay)
    sched = scheduler(optimizer) if scheduler else None
    optimizer, sched = accelerator.prepare(optimizer, sched) if sched else (accelerator.prepare(optimizer), None)
    g = torch.Generator().manual_seed(0)
    position_ids = torch.arange(SEQ)[None].expand(BATCH, -1)
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)[None, None]
    out: dict[str, Any] = {"losses": [], "norms": [], "expected_norms": [], "lrs": []}
    for _ in range(steps):
        batch = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        loss = model(batch[:, :-1], position_ids, causal, labels=batch[:, 1:]).mean()
        accelerator.backward(loss)
        if clip is not None:
            grads = [p.main_grad for p in model.parameters()]
            out["expected_norms"].append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
            out["norms"].append(float(accelerator.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
        if sched is not None:
            sched.step()
            out["lrs"].append(sched.get_last_lr()[0])
        optimizer.zero_grad()
        out["losses"].append(float(loss))
        if clip is None:
            out["norms"].append(optimizer.optimizer.grad_norm)
    out["weights"] = accelerator.get_state_dict(model)
    out["accelerator"], out["model"], out["optimizer"], out["scheduler"] = accelerator, model, optimizer, sched
    return out


def test_full_recompute_reruns_each_layer_in_backward_with_the_same_results(megatron_world) -> None:
    def counting(model: torch.nn.Module) -> None:
        layer = model.decoder.layers[0]
        layer.calls = 0

        def count(*args: Any) -> None:
            layer.calls += 1

        layer.register_forward_hook(count)

    full = MegatronPlugin(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    recomputed = _train(full, steps=2, hook=counting)
    plain = _train(MegatronPlugin(), steps=2, hook=counting)
    layer_calls = [r["accelerator"].unwrap_model(r["model"]).decoder.layers[0].calls for r in (recomputed, plain)]
    assert layer_calls == [4, 2], "full recomputation runs each layer's forward again in backward"
    assert recomputed["losses"] == plain["losses"]
    for name, value in plain["weights"].items():
        torch.testing.assert_close(recomputed["weights"][name], value, rtol=0, atol=0, msg=name)


def test_clip_grad_norm_goes_through_megatron_cores_optimizer(megatron_world) -> None:
    """The norm returned is the global L2 norm of the reduced gradients; clipping matches the plugin's
    gradient_clipping (megatron-core's own clip inside its step)."""
    clipped = _train(MegatronPlugin(), clip=0.05)
    plugin_clipped = _train(MegatronPlugin(gradient_clipping=0.05))
    assert clipped["norms"] == pytest.approx(clipped["expected_norms"], rel=1e-5)
    assert clipped["norms"] == pytest.approx(plugin_clipped["norms"], rel=1e-6)
    assert min(clipped["norms"]) > 0.05, "the clip was active"
    assert clipped["losses"] == plugin_clipped["losses"]
    for name, value in plugin_clipped["weights"].items():
        torch.testing.assert_close(clipped["weights"][name], value, rtol=0, atol=0, msg=name)
    unclipped = _train(MegatronPlugin())
    assert unclipped["losses"][1:] != clipped["losses"][1:]
    with pytest.raises(MegatronConfigError, match="clips the L2 norm only"):
        clipped["accelerator"].clip_grad_norm_(clipped["model"].parameters(), 1.0, norm_type=1.0)


def _megatron_lm_reference(plugin: MegatronPlugin, lr: float, wd: float, steps: int, gbs: int) -> list[tuple]:
    """Megatron-LM's sample-based bookkeeping (counts times the global batch size, stepped by it) on
    megatron-core's own OptimizerParamScheduler: (lr, wd) of a default group after each step."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    groups = [{"lr": 0.0, "weight_decay": 0.0}]
    ref = OptimizerParamScheduler(
        SimpleNamespace(param_groups=groups),
        init_lr=0.0,
        max_lr=lr,
        min_lr=plugin.min_lr,
        lr_warmup_steps=(plugin.lr_warmup_iters or 0) * gbs,
        lr_decay_steps=(plugin.lr_decay_iters or plugin.train_iters) * gbs,
        lr_decay_style=plugin.lr_decay_style,
        start_wd=plugin.start_weight_decay if plugin.start_weight_decay is not None else wd,
        end_wd=plugin.end_weight_decay if plugin.end_weight_decay is not None else wd,
        wd_incr_steps=plugin.train_iters * gbs,
        wd_incr_style=plugin.weight_decay_incr_style,
    )
    out = []
    for _ in range(steps):
        ref.step(increment=gbs)
        out.append((groups[0]["lr"], groups[0]["weight_decay"]))
    return out


def test_dummy_scheduler_follows_megatron_lms_schedule_fields(megatron_world) -> None:
    """Cosine decay after warmup to min_lr, weight decay rising linearly, lr_mult for scale_lr_cond's parameters,
    no weight decay for no_wd_decay_cond's: each group's values after every step, against the closed forms and
    against megatron-core's scheduler driven as Megatron-LM drives it."""
    plugin = MegatronPlugin(
        train_iters=8,
        lr_decay_style="cosine",
        lr_warmup_iters=2,
        min_lr=1e-3,
        weight_decay_incr_style="linear",
        start_weight_decay=0.0,
        end_weight_decay=0.1,
        scale_lr_cond=lambda name, param: "output_layer" in name,
        lr_mult=0.5,
        no_wd_decay_cond=lambda name, param: "embedding" in name,
    )
    run = _train(plugin, steps=0, scheduler=lambda opt: MegatronLMDummyScheduler(opt, total_num_steps=100))
    model, optimizer, scheduler = run["model"], run["optimizer"], run["scheduler"]
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    default = group_of[id(names["module.decoder.layers.0.mlp.linear_fc1.weight"])]
    scaled = group_of[id(names["module.output_layer.weight"])]
    no_wd = group_of[id(names["module.embedding.word_embeddings.weight"])]
    bias = group_of[id(names["module.decoder.layers.0.mlp.linear_fc1.bias"])]
    reference = _megatron_lm_reference(plugin, lr=1e-2, wd=0.0, steps=10, gbs=8)
    for step in range(1, 11):
        scheduler.step()
        if step <= 2:
            lr = 1e-2 * step / 2
        elif step <= 8:
            lr = 1e-3 + (1e-2 - 1e-3) * 0.5 * (math.cos(math.pi * (step - 2) / 6) + 1)
        else:
            lr = 1e-3
        wd = 0.1 * min(step, 8) / 8
        assert default["lr"] == pytest.approx(lr, rel=1e-12) and default["weight_decay"] == pytest.approx(wd)
        assert (default["lr"], default["weight_decay"]) == pytest.approx(reference[step - 1], rel=1e-12)
        assert scaled["lr"] == pytest.approx(0.5 * lr, rel=1e-12) and scaled["weight_decay"] == pytest.approx(wd)
        assert no_wd["lr"] == pytest.approx(lr, rel=1e-12) and no_wd["weight_decay"] == 0.0
        assert bias["weight_decay"] == pytest.approx(wd), "no_wd_decay_cond replaces the bias/1-D default"
        assert scheduler.get_last_lr()[0] == pytest.approx(lr, rel=1e-12)


@pytest.mark.parametrize(
    ("fields", "dummy", "expected"),
    [
        # total_num_steps / warmup_num_steps stand in for train_iters / lr_warmup_iters (linear decay to 0).
        ({}, {"total_num_steps": 10, "warmup_num_steps": 2}, [0.5, 1.0, 0.875, 0.75]),
        ({"train_iters": 4, "lr_decay_style": "constant", "lr_warmup_fraction": 0.5}, {}, [0.5, 1.0, 1.0, 1.0]),
        ({"train_iters": 16, "lr_decay_style": "inverse-square-root", "lr_warmup_iters": 1}, {}, [1.0, 0.5**0.5]),
        (
            {"train_iters": 4, "lr_decay_style": "WSD", "lr_wsd_decay_iters": 2, "lr_wsd_decay_style": "linear"},
            {},
            [1.0, 1.0, 0.5, 0.0],
        ),
    ],
)
def test_dummy_scheduler_decay_styles(megatron_world, fields: dict, dummy: dict, expected: list[float]) -> None:
    run = _train(MegatronPlugin(**fields), steps=0, scheduler=lambda opt: MegatronLMDummyScheduler(opt, **dummy))
    lrs = []
    for _ in expected:
        run["scheduler"].step()
        lrs.append(run["scheduler"].get_last_lr()[0] / 1e-2)
    assert lrs == pytest.approx(expected, rel=1e-12)


def test_schedule_fields_with_a_torch_scheduler_and_bad_lengths_are_refused(megatron_world) -> None:
    with pytest.raises(MegatronConfigError, match=r"\['train_iters'\] describe a MegatronLMDummyScheduler"):
        _train(MegatronPlugin(train_iters=10), steps=0, scheduler=lambda o: torch.optim.lr_scheduler.ConstantLR(o, 1))
    with pytest.raises(MegatronConfigError, match=r"warm up \(4 steps\) over fewer steps than it decays \(4\)"):
        _train(MegatronPlugin(train_iters=4, lr_warmup_iters=4), steps=0, scheduler=MegatronLMDummyScheduler)
    with pytest.raises(MegatronConfigError, match="Give the run length"):
        _train(MegatronPlugin(), steps=0, scheduler=MegatronLMDummyScheduler)
    with pytest.raises(RuntimeError, match="stand-in"):
        MegatronLMDummyScheduler(None).step()


def test_tensorboard_dir_gets_megatrons_training_scalars(megatron_world, tmp_path: Path) -> None:
    """One process, no prepared DataLoader: no global batch size, so no "batch-size" and no "vs samples" scalars
    (the two-process test in test_parallel_training checks those)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plugin = MegatronPlugin(tensorboard_dir=str(tmp_path / "tb"), set_all_logging_options=True, gradient_clipping=1.0)
    started = time.perf_counter()
    run = _train(plugin, scheduler=lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.5, total_iters=2))
    took = time.perf_counter() - started
    run["accelerator"].strategy.log_eval_results({"lm loss": 2.0})
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert set(scalars) == {
        "lm loss",
        "learning-rate",
        "loss-scale",
        "world-size",
        "grad-norm",
        "num-zeros",
        "params-norm",
        "iteration-time",
        "lm loss validation",
        "lm loss validation ppl",
    }
    assert scalars["lm loss validation"] == [2.0] and [e.step for e in events.Scalars("lm loss validation")] == [3]
    assert scalars["lm loss validation ppl"] == pytest.approx([math.exp(2.0)])
    assert scalars["lm loss"] == pytest.approx(run["losses"], rel=1e-6)
    assert [e.step for e in events.Scalars("learning-rate")] == [1, 2, 3]
    # Logged after the optimizer step, before the scheduler's: the rate the step used.
    assert scalars["learning-rate"] == pytest.approx([5e-3, 7.5e-3, 1e-2])
    assert scalars["grad-norm"] == pytest.approx(run["norms"], rel=1e-6)
    assert scalars["loss-scale"] == [1.0] * 3 and scalars["world-size"] == [1.0] * 3
    assert all(n >= 0 for n in scalars["num-zeros"])
    # After the last step: the norm of the trained weights.
    full = torch.cat([w.float().flatten() for w in run["weights"].values()])
    assert scalars["params-norm"][-1] == pytest.approx(float(full.norm()), rel=1e-5)
    assert all(t > 0 for t in scalars["iteration-time"]) and sum(scalars["iteration-time"]) < took


def test_no_save_optim_and_no_load_optim(megatron_world, tmp_path: Path) -> None:
    import json

    from accel.errors import CheckpointError

    run = _train(MegatronPlugin(no_save_optim=True), steps=1)
    accelerator, optimizer = run["accelerator"], run["optimizer"]
    accelerator.save_state(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "megatron.json").read_text())["optimizer_state"] is False
    saved = run["weights"]
    with pytest.raises(CheckpointError, match=r"saved without optimizer state .* MegatronPlugin\(no_load_optim=True\)"):
        accelerator.load_state(tmp_path / "ckpt")
    accelerator.strategy.plugin.no_load_optim = True
    (torch_adam,) = [o.optimizer for o in optimizer.optimizer.inner.chained_optimizers]
    for state in torch_adam.state.values():  # state the load must leave alone
        state["exp_avg"].fill_(0.25)
    with torch.no_grad():
        for p in run["model"].parameters():
            p.add_(1.0)
    accelerator.load_state(tmp_path / "ckpt")
    for name, value in accelerator.get_state_dict(run["model"]).items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
    assert torch_adam.state and all(bool((s["exp_avg"] == 0.25).all()) for s in torch_adam.state.values())


def test_translated_cosine_schedule_keeps_its_floor(megatron_world) -> None:
    """CosineAnnealingLR(eta_min) translated to megatron-core's scheduler decays to eta_min, as torch's does
    (megatron-core reads the floor from each param group)."""
    run = _train(MegatronPlugin(), steps=0, scheduler=lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 4, 2e-3))
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    torch_sched = torch.optim.lr_scheduler.CosineAnnealingLR(plain, 4, 2e-3)
    for _ in range(4):  # torch's cosine climbs again after T_max; megatron-core's stays at the floor
        run["scheduler"].step()
        torch_sched.step()
        assert run["scheduler"].get_last_lr()[0] == pytest.approx(torch_sched.get_last_lr()[0], rel=1e-9)
    assert run["scheduler"].get_last_lr()[0] == pytest.approx(2e-3)


def _fresh(plugin: MegatronPlugin) -> Accelerator:
    from accel.testing.pytest_plugin import reset_state
    from megatron.core import parallel_state

    reset_state()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    return Accelerator(megatron_lm_plugin=plugin)


def test_dummy_loader_serves_megatron_cores_gpt_datasets_and_resumes_at_consumed_samples(megatron_world) -> None:
    """Train and valid splits of megatron-core's (mock) GPT dataset in Megatron's sample order; EOD tokens out of
    the loss mask (eod_mask_loss); a run given consumed_samples starts where the first left off."""
    from accel_megatron import MegatronLMDummyDataLoader
    from resume import gpt_provider

    def loaders(consumed: list[int] | None) -> tuple[Any, Any, Any, MegatronPlugin]:
        plugin = MegatronPlugin(
            train_iters=4, eval_iters=2, megatron_dataset_flag=True, eod_mask_loss=True, consumed_samples=consumed
        )
        accelerator = _fresh(plugin)
        args = {"micro_batch_size": 2, "seq_length": 8, "vocab_size": 64}
        train, valid = accelerator.prepare(MegatronLMDummyDataLoader(**args), MegatronLMDummyDataLoader(**args))
        return accelerator, train, valid, plugin

    accelerator, train, valid, plugin = loaders(None)
    first = [batch for _, batch in zip(range(3), train)]
    assert set(first[0]) == {"tokens", "labels", "loss_mask", "attention_mask", "position_ids"}
    assert first[0]["tokens"].shape == (2, 8)
    train_split = accelerator.strategy._datasets.splits[0]
    for k, batch in enumerate(first):
        expected = torch.stack([train_split[i]["tokens"] for i in (2 * k, 2 * k + 1)])
        assert torch.equal(batch["tokens"], expected), "Megatron's sequential sample order"
    samples = [train_split[i] for i in range(8)]
    eod = torch.stack([s["tokens"] for s in samples]) == 63
    assert eod.any(), "the mock documents end with EOD tokens"
    assert torch.equal(torch.stack([s["loss_mask"] for s in samples]) == 0, eod), "eod_mask_loss"
    assert next(iter(valid))["tokens"].shape == (2, 8)
    assert len(train_split) >= 4 * 2, "sized for train_iters x the global batch"
    # Trains a GPTModel with the masked loss.
    model = accelerator.prepare(ModelProvider(gpt_provider(plugin)))
    batch = first[0]
    per_token = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    loss = (per_token * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    accelerator.backward(loss)
    assert torch.isfinite(loss)

    _, resumed, _, _ = loaders([4])
    assert torch.equal(next(iter(resumed))["tokens"], first[2]["tokens"]), "consumed_samples=[4] skips 2 batches"


def test_datasets_provider_gets_megatrons_sample_counts(megatron_world) -> None:
    from accel_megatron import MegatronLMDummyDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    asked = []

    def provider(counts: list[int]) -> tuple:
        asked.append(counts)
        return tuple(TensorDataset(torch.arange(n)) for n in counts)

    plugin = MegatronPlugin(
        train_iters=3,
        eval_iters=2,
        eval_interval=2,
        num_micro_batches=2,
        megatron_dataset_flag=True,
        custom_megatron_datasets_provider_function=provider,
        consumed_samples=[0, 4],
    )
    accelerator = _fresh(plugin)
    train, valid, test = accelerator.prepare(*(MegatronLMDummyDataLoader(micro_batch_size=1) for _ in range(3)))
    # global batch = 1 x 2 micro-batches x 1 replica; valid: (3 // 2 + 1) evaluations x 2 iterations.
    assert asked == [[6, 8, 4]]
    assert [b[0].tolist() for b in train] == [[0, 1], [2, 3], [4, 5]], "one step's micro-batches per batch"
    assert next(iter(valid))[0].tolist() == [4, 5], "consumed_samples for the valid split"
    assert len(list(test)) == 2
    with pytest.raises(MegatronConfigError, match="At most three MegatronLMDummyDataLoaders"):
        accelerator.prepare(MegatronLMDummyDataLoader(micro_batch_size=1))
    with pytest.raises(MegatronConfigError, match=r"megatron_dataset_flag=True: .* instead of a DataLoader"):
        accelerator.prepare(DataLoader(TensorDataset(torch.arange(4))))


def test_custom_model_provider_function_builds_the_model_prepare_is_given(megatron_world) -> None:
    from megatron.core.models.gpt import GPTModel
    from resume import gpt_provider

    plugin = MegatronPlugin()
    plugin.custom_model_provider_function = gpt_provider(plugin)
    accelerator = _fresh(plugin)
    model = accelerator.prepare(torch.nn.Linear(2, 2))  # Accelerate: the Hugging Face model it stands in for
    assert isinstance(accelerator.unwrap_model(model), GPTModel)


def test_virtual_stages_from_the_layer_count_per_virtual_stage() -> None:
    """Megatron-LM derives the chunk count from num_layers_per_virtual_pipeline_stage and the model's layers."""
    plugin = MegatronPlugin(
        pp_degree=2, num_micro_batches=2, num_layers_per_virtual_pipeline_stage=1, other_megatron_args={"num_layers": 4}
    )
    assert plugin.virtual_pipeline_model_parallel_size == 2
    assert plugin.transformer_config_kwargs()["virtual_pipeline_model_parallel_size"] == 2
    with pytest.raises(MegatronConfigError, match=r"num_layers \(5\) must be a multiple of pp_degree"):
        MegatronPlugin(pp_degree=2, num_layers_per_virtual_pipeline_stage=1, other_megatron_args={"num_layers": 5})


def test_schedule_in_samples_steps_by_the_global_batch_size(megatron_world) -> None:
    """train_samples / lr_warmup_samples / lr_decay_samples: Megatron-LM's sample-counted schedule, each step adding
    the train loader's global batch (4 here), against megatron-core's scheduler driven the same way."""
    from torch.utils.data import DataLoader, TensorDataset

    plugin = MegatronPlugin(train_samples=32, lr_warmup_samples=8, lr_decay_samples=24, min_lr=1e-3)
    accelerator = _fresh(plugin)
    from resume import gpt_provider

    model = accelerator.prepare(ModelProvider(gpt_provider(plugin)))
    loader = DataLoader(TensorDataset(torch.arange(64)), batch_size=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _, optimizer, scheduler = accelerator.prepare(loader, optimizer, MegatronLMDummyScheduler(optimizer))
    lrs = []
    for _ in range(8):
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    # Warmup over 8 samples (2 steps), linear decay to min_lr at sample 24 (step 6), then the floor.
    expected = [5e-3, 1e-2] + [1e-3 + 9e-3 * (1 - (4 * k - 8) / 16) for k in range(3, 7)] + [1e-3, 1e-3]
    assert lrs == pytest.approx(expected, rel=1e-12)
    with pytest.raises(MegatronConfigError, match="steps by the global batch size: prepare the train DataLoader"):
        other = _fresh(plugin)
        m = other.prepare(ModelProvider(gpt_provider(plugin)))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        other.prepare(opt, MegatronLMDummyScheduler(opt))
