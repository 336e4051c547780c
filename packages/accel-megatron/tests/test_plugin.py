"""MegatronPlugin validation, the strategy's registration, and optimizer/scheduler translation (one process)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel.adapter.registry import get_strategy_class
from accel.state import DistributedType
from accel_megatron import MegatronConfigError, MegatronPlugin, MegatronStrategy, ModelProvider


def test_registered_under_accel_strategies_and_selected_by_the_plugin() -> None:
    assert get_strategy_class("megatron") is MegatronStrategy
    accelerator = Accelerator(megatron_lm_plugin=MegatronPlugin(tp_degree=1))
    assert isinstance(accelerator.strategy, MegatronStrategy)
    assert accelerator.distributed_type is DistributedType.MEGATRON_LM


def test_strategy_refuses_another_config_type() -> None:
    with pytest.raises(TypeError, match="MegatronPlugin, got dict"):
        MegatronStrategy({"tp_degree": 2})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_degree": 0}, "tp_degree must be an integer >= 1, got 0"),
        ({"pp_degree": -1}, "pp_degree must be an integer >= 1"),
        ({"num_micro_batches": 0}, "num_micro_batches must be an integer >= 1"),
        ({"sequence_parallelism": True}, "needs tp_degree > 1"),
        ({"num_layers_per_virtual_pipeline_stage": 1}, "virtual .*pipeline needs pp_degree > 1"),
        ({"pp_degree": 2, "virtual_pipeline_model_parallel_size": 2, "num_micro_batches": 3}, "multiple of pp_degree"),
        ({"gradient_clipping": 0.0}, "gradient_clipping must be > 0 or None"),
        ({"pipeline_dtype": "int8"}, "pipeline_dtype must be"),
    ],
)
def test_plugin_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(MegatronConfigError, match=message):
        MegatronPlugin(**kwargs)


def test_world_size_must_be_a_multiple_of_the_model_parallel_size() -> None:
    plugin = MegatronPlugin(tp_degree=2, pp_degree=2)
    assert plugin.model_parallel_size == 4
    assert plugin.data_parallel_size(8) == 2
    with pytest.raises(MegatronConfigError, match=r"world size \(6 processes\) must be a multiple of .* = 4"):
        plugin.validate(6, "cpu")


def test_cuda_only_features_are_refused_on_other_devices() -> None:
    with pytest.raises(MegatronConfigError, match="gradient_accumulation_fusion needs the fused CUDA"):
        MegatronPlugin(gradient_accumulation_fusion=True).validate(1, "cpu")
    with pytest.raises(MegatronConfigError, match="Context parallelism needs Transformer Engine"):
        MegatronPlugin(cp_degree=2).validate(2, "cpu")
    MegatronPlugin(gradient_accumulation_fusion=True).validate(1, "cuda")


def test_transformer_config_kwargs_follow_the_plugin() -> None:
    kwargs = MegatronPlugin(tp_degree=2, pp_degree=2, sequence_parallelism=True, recompute_activations=True)
    got = kwargs.transformer_config_kwargs()
    assert got["tensor_model_parallel_size"] == 2 and got["pipeline_model_parallel_size"] == 2
    assert got["sequence_parallel"] is True and got["recompute_granularity"] == "selective"
    assert got["pipeline_dtype"] is torch.float32
    assert "pipeline_dtype" not in MegatronPlugin().transformer_config_kwargs()


def test_optimizer_hyperparameters_carry_over() -> None:
    from accel_megatron.optim import optimizer_config

    params = [torch.nn.Parameter(torch.zeros(2))]
    plugin = MegatronPlugin(use_distributed_optimizer=True, gradient_clipping=0.5)
    adamw = optimizer_config(torch.optim.AdamW(params, lr=3e-4, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1), plugin)
    assert (adamw.optimizer, adamw.lr, adamw.adam_beta1, adamw.adam_beta2, adamw.adam_eps) == (
        "adam",
        3e-4,
        0.8,
        0.9,
        1e-6,
    )
    assert adamw.weight_decay == 0.1 and adamw.decoupled_weight_decay is True
    assert adamw.use_distributed_optimizer is True and adamw.clip_grad == 0.5
    adam = optimizer_config(torch.optim.Adam(params, lr=1e-3, weight_decay=0.1), MegatronPlugin())
    assert adam.decoupled_weight_decay is False, "torch Adam's weight decay is L2, not decoupled"
    assert adam.clip_grad == 0.0, "no clipping unless the plugin asks for it (megatron-core's default is 1.0)"
    sgd = optimizer_config(torch.optim.SGD(params, lr=0.1, momentum=0.7), MegatronPlugin())
    assert (sgd.optimizer, sgd.lr, sgd.sgd_momentum) == ("sgd", 0.1, 0.7)
    opt = torch.optim.AdamW(params, lr=1e-2)
    torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3)
    assert optimizer_config(opt, MegatronPlugin()).lr == 1e-2, "the schedule's base lr, not its first value"


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        (lambda p: torch.optim.RMSprop(p), "no counterpart for RMSprop"),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "no nesterov"),
        (lambda p: torch.optim.Adam(p, amsgrad=True), "no \\['amsgrad'\\]"),
        (lambda p: torch.optim.Adam([{"params": p[:1], "lr": 1}, {"params": p[1:], "lr": 2}]), "param groups differ"),
    ],
)
def test_optimizers_without_a_counterpart_are_refused(optimizer, message: str) -> None:
    from accel_megatron.optim import optimizer_config

    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(MegatronConfigError, match=message):
        optimizer_config(optimizer(params), MegatronPlugin())


def test_model_provider_needs_a_callable_and_the_strategy_a_megatron_model() -> None:
    from accel_megatron.parallel import model_config

    with pytest.raises(TypeError, match="needs a callable"):
        ModelProvider(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"prepares megatron-core models .* got Linear"):
        model_config(torch.nn.Linear(2, 2))


def test_interleaved_pipeline_needs_the_chunk_count() -> None:
    from accel_megatron.parallel import initialize

    plugin = MegatronPlugin(pp_degree=2, num_layers_per_virtual_pipeline_stage=1, num_micro_batches=2)
    with pytest.raises(MegatronConfigError, match=r"Set MegatronPlugin\(virtual_pipeline_model_parallel_size=...\)"):
        initialize(plugin, torch.device("cpu"), "gloo")


def test_device_placement_list_and_a_second_model_are_refused_with_accelerates_messages(megatron_world) -> None:
    import sys

    from conftest import WORKERS

    sys.path.insert(0, str(WORKERS))
    from resume import gpt_provider

    plugin = MegatronPlugin()
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    with pytest.raises(ValueError, match=r"^You can't customize device placements with DeepSpeed or Megatron-LM\.$"):
        accelerator.prepare(ModelProvider(gpt_provider(plugin)), device_placement=[True])
    model = accelerator.prepare(ModelProvider(gpt_provider(plugin)))
    assert accelerator.prepare(model) is model, "an already prepared model is not a second one"
    expected = "You can't use same `Accelerator()` instance with multiple models when using Megatron-LM"
    with pytest.raises(AssertionError, match=f"^{re.escape(expected)}$"):
        accelerator.prepare(ModelProvider(gpt_provider(plugin)))


def _train_three_steps(mixed_precision: str) -> tuple[list[float], Any, Any, dict[str, torch.Tensor]]:
    import sys

    from accel.testing.pytest_plugin import reset_state
    from conftest import WORKERS

    sys.path.insert(0, str(WORKERS))
    from resume import BATCH, SEQ, VOCAB, gpt_provider

    reset_state()
    plugin = MegatronPlugin()
    accelerator = Accelerator(megatron_lm_plugin=plugin, mixed_precision=mixed_precision)
    model = accelerator.prepare(ModelProvider(gpt_provider(plugin)))
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
    batch = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    position_ids = torch.arange(SEQ)[None].expand(BATCH, -1)
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)[None, None]
    losses = []
    for _ in range(3):
        loss = model(batch[:, :-1], position_ids, causal, labels=batch[:, 1:]).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    weights = accelerator.get_state_dict(model)
    return losses, model, optimizer.optimizer.inner, weights


def test_bf16_uses_megatron_cores_mixed_precision_optimizer(megatron_world) -> None:
    """mixed_precision="bf16": bf16 parameters in Float16Module, fp32 main parameters in megatron-core's
    Float16OptimizerWithFloat16Params; the losses follow the fp32 run within bf16 rounding."""
    from megatron.core import parallel_state
    from megatron.core.transformer.module import Float16Module

    losses, model, inner, weights = _train_three_steps("bf16")
    assert isinstance(model.module, Float16Module)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    (chained,) = getattr(inner, "chained_optimizers", [inner])
    assert type(chained).__name__ == "Float16OptimizerWithFloat16Params"
    assert {p.dtype for g in chained.fp32_from_float16_groups for p in g} == {torch.float32}
    parallel_state.destroy_model_parallel()
    reference, ref_model, _, ref_weights = _train_three_steps("no")
    assert {p.dtype for p in ref_model.parameters()} == {torch.float32}
    assert sorted(weights) == sorted(ref_weights), "the unwrapped model keeps the one-process names"
    assert losses != reference, "bf16 arithmetic ran"
    assert losses == pytest.approx(reference, rel=5e-3)


def test_fp16_backward_scales_the_loss_by_megatron_cores_loss_scale() -> None:
    """fp16 (CUDA only; the CPU adapter refuses it): backward multiplies by the optimizer's loss scale,
    which megatron-core's Float16Optimizer divides out again before its step."""
    from types import SimpleNamespace

    strategy = MegatronStrategy(MegatronPlugin())
    w = torch.nn.Parameter(torch.tensor(3.0))
    model = torch.nn.Module()
    model.config = SimpleNamespace(fp16=True, grad_scale_func=lambda loss: loss * 1024.0)  # type: ignore[assignment]
    strategy.models.append(model)
    assert strategy.backward(w * 2.0, sync=True) is True
    assert w.grad == 2.0 * 1024.0
    model.config.fp16 = False
    assert strategy.backward(w * 2.0, sync=True) is True
    assert w.grad == 2.0 * 1024.0 + 2.0, "bf16 and fp32: the ordinary backward, unscaled"
