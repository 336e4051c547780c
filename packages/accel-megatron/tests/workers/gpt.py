"""Train a small megatron-core GPTModel through accel; argv: MODE OUT_DIR.

MODE: ref (one process, no model parallelism: the reference), tp (TP=2), dp (DP=2 through
megatron-core's DDP, overlapped bucketed reduction), dpopt (DP=2 with the distributed optimizer), pp (PP=2,
pipeline schedule, 1 + 3 layers), vpp (PP=2 with 2 virtual stages per process: the interleaved schedule), accum
(TP=2 with selective recomputation, 2 accumulated half-batches per step).
Every mode starts from the reference's initial full weights and writes its per-step losses and gradient norms;
ref, pp and accum also write Megatron-LM's TensorBoard scalars to OUT_DIR/MODE_tb.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accel import Accelerator
from accel_megatron import (
    MegatronPlugin,
    ModelProvider,
    avg_losses_across_data_parallel_group,
    gather_across_data_parallel_groups,
)
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, TensorDataset

mode, out = sys.argv[1], Path(sys.argv[2])


STEPS, VOCAB, SEQ, BATCH = 4, 64, 8, 8
# Megatron-LM's TensorBoard scalars (every logging option) for the reference, TP=2 with accumulation and PP=2.
logged = {"tensorboard_dir": str(out / f"{mode}_tb"), "set_all_logging_options": True}
plugin = {
    "ref": MegatronPlugin(**logged),
    "tp": MegatronPlugin(tp_degree=2),
    # megatron-core's bucketed, overlapped gradient reduction (small buckets: several per step).
    "dp": MegatronPlugin(overlap_grad_reduce=True, bucket_size=2000),
    "dpopt": MegatronPlugin(use_distributed_optimizer=True),
    # An uneven split: 1 layer on the first stage, 3 on the last.
    "pp": MegatronPlugin(pp_degree=2, num_micro_batches=2, decoder_last_pipeline_num_layers=3, **logged),
    "vpp": MegatronPlugin(pp_degree=2, virtual_pipeline_model_parallel_size=2, num_micro_batches=2),
    # Selective recomputation on top of TP=2 (sequence parallelism needs Apex/TE layer norms: not on CPU).
    "accum": MegatronPlugin(tp_degree=2, recompute_activations=True, **logged),
}[mode]
# Data-parallel modes split each batch of BATCH over the replicas, so one step sees the same
# samples as the reference and the scheduler steps once per step (as on one process).
# "accum": TP=2 with 2 accumulated micro-batches of BATCH // 2 per optimizer step.
accelerator = Accelerator(
    megatron_lm_plugin=plugin,
    split_batches=mode in ("dp", "dpopt"),
    gradient_accumulation_steps=2 if mode == "accum" else 1,
)
rank = accelerator.process_index


def provider(pre_process: bool, post_process: bool, vp_stage: int | None = None) -> torch.nn.Module:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=4,
        hidden_size=32,
        num_attention_heads=4,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **plugin.transformer_config_kwargs(),
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=False,
        vp_stage=vp_stage,
    )


g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, VOCAB, (BATCH * STEPS, SEQ + 1), generator=g)
loader = DataLoader(TensorDataset(tokens), batch_size=BATCH // 2 if mode == "accum" else BATCH)
model = accelerator.prepare(ModelProvider(provider))
if mode == "ref":
    init = {k: v.detach().clone().contiguous() for k, v in accelerator.get_state_dict(model).items()}
    save_file(init, str(out / "init.safetensors"))
else:
    accelerator.wait_for_everyone()
    accelerator._load_model_state_dict(model, load_file(str(out / "init.safetensors")))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, end_factor=1.0, total_iters=2)
optimizer, loader, scheduler = accelerator.prepare(optimizer, loader, scheduler)

position_ids = torch.arange(SEQ, device=accelerator.device)[None]
causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool, device=accelerator.device), 1)[None, None]


def forward(stage: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return stage(batch[:, :-1], position_ids.expand(batch.shape[0], -1), causal, labels=batch[:, 1:])


def loss_fn(per_token: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return per_token.float().mean()


losses, lrs, seen, gathered, norms = [], [], [], [], []
for (batch,) in loader:
    seen.append(batch.tolist())
    gathered.append(accelerator.gather_for_metrics(batch).tolist())
    with accelerator.accumulate(model):
        if mode in ("pp", "vpp"):
            loss = accelerator.strategy.train_step(model, batch, forward, loss_fn, seq_length=SEQ)
        else:
            loss = loss_fn(forward(model, batch), batch)
            accelerator.backward(loss)
        if accelerator.sync_gradients:
            # The global norm over every TP/PP/DP shard, through megatron-core's optimizer (too high to clip).
            norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 1e6)))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    if accelerator.sync_gradients:
        lrs.append(scheduler.get_last_lr()[0])
    losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    # Accelerate's Megatron helpers: over the data-parallel replicas only.
    averaged = avg_losses_across_data_parallel_group([loss])[0].item()
    assert abs(averaged - losses[-1]) <= 1e-6 * max(1.0, abs(losses[-1])), (averaged, losses[-1])
    assert gather_across_data_parallel_groups({"x": batch})["x"].tolist() == gathered[-1]

# Evaluation of the trained model on the first batch: the pipeline schedule's forward-only pass.
eval_batch = tokens[:BATCH].to(accelerator.device)
if mode in ("pp", "vpp"):
    # Accelerate's eval_step with return_logits: the loss and the last stage's outputs.
    accelerator.strategy.plugin.return_logits = True
    step = accelerator.strategy.train_step
    evaluated, outputs = step(model, eval_batch, forward, loss_fn, forward_only=True, seq_length=SEQ)
else:
    with torch.no_grad():
        outputs = forward(model, eval_batch)
        evaluated = loss_fn(outputs, eval_batch)
# Accelerate's log_eval_results (only under tensorboard_dir: ref, pp, accum).
accelerator.strategy.log_eval_results({"lm loss": float(evaluated)})
all_outputs = [None] * accelerator.num_processes
dist.all_gather_object(all_outputs, None if outputs is None else outputs.tolist())

everyone = [None] * accelerator.num_processes
dist.all_gather_object(everyone, seen)
final = accelerator.get_state_dict(model)
accelerator.save_model(model, out / f"{mode}_model")
if accelerator.is_main_process:
    plain = {k: v for k, v in accelerator.unwrap_model(model).state_dict().items() if isinstance(v, torch.Tensor)}
    result = {"losses": losses, "lrs": lrs, "seen": everyone, "gathered": gathered, "final_keys": sorted(final)}
    result["norms"] = norms
    result["eval"] = float(evaluated)
    result["eval_outputs"] = next(o for o in all_outputs if o is not None)
    if mode == "ref":
        save_file({k: v.contiguous() for k, v in plain.items()}, str(out / "ref_plain.safetensors"))
    (out / f"{mode}.json").write_text(json.dumps(result))
accelerator.end_training()
