"""save_state / load_state through megatron-core's distributed checkpointing; argv: TP PP OUT_DIR [DROPOUT [VIRTUAL]].

Trains 2 steps, saves, trains 2 more (recording losses, weights and the learning rate), loads
the checkpoint and repeats those 2 steps: everything must be identical. With DROPOUT > 0 the
attention dropout runs inside tensor-parallel regions (megatron-core's model-parallel RNG
tracker) and the hidden dropout outside them (the default generator).
"""

import json
import sys
from pathlib import Path

import torch
from accel import Accelerator
from accel_megatron import MegatronPlugin, ModelProvider

VOCAB, SEQ, BATCH = 64, 8, 4


def gpt_provider(plugin: MegatronPlugin, dropout: float = 0.0, num_layers: int = 2):
    def provider(pre_process: bool, post_process: bool, vp_stage: int | None = None) -> torch.nn.Module:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(
            num_layers=num_layers,
            hidden_size=32,
            num_attention_heads=4,
            use_cpu_initialization=True,
            hidden_dropout=dropout,
            attention_dropout=dropout,
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

    return provider


def main() -> None:
    tp, pp, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    dropout = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    virtual = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    plugin = MegatronPlugin(
        tp_degree=tp, pp_degree=pp, num_micro_batches=2, virtual_pipeline_model_parallel_size=virtual or None
    )
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    model = accelerator.prepare(ModelProvider(gpt_provider(plugin, dropout, num_layers=2 * max(virtual, 1))))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=8, eta_min=1e-3)
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    device = accelerator.device
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g).to(device) for _ in range(4)]
    position_ids = torch.arange(SEQ, device=device)[None].expand(BATCH, -1)
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool, device=device), 1)[None, None]

    def forward(stage: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return stage(batch[:, :-1], position_ids[: batch.shape[0]], causal, labels=batch[:, 1:])

    def step(batch: torch.Tensor) -> float:
        if pp > 1:
            loss = accelerator.strategy.train_step(model, batch, forward, lambda out, b: out.mean(), seq_length=SEQ)
        else:
            loss = forward(model, batch).mean()
            accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        return float(loss)

    for batch in batches[:2]:
        step(batch)
    accelerator.save_state(out / "ckpt")
    first = [step(b) for b in batches[2:]]
    weights = accelerator.get_state_dict(model)
    lr = scheduler.get_last_lr()[0]
    accelerator.load_state(out / "ckpt")
    again = [step(b) for b in batches[2:]]
    after = accelerator.get_state_dict(model)
    assert first == again, (first, again)
    assert lr == scheduler.get_last_lr()[0], (lr, scheduler.get_last_lr())
    assert all(torch.equal(weights[k], after[k]) for k in weights), "weights differ after resume"
    if accelerator.is_main_process:
        (out / "resume.json").write_text(
            json.dumps({"first": first, "again": again, "lr": lr, "dtype": str(next(model.parameters()).dtype)})
        )
    accelerator.end_training()


# megatron-core's checkpoint writer starts a spawned helper process, which imports this file again.
if __name__ == "__main__":
    main()
