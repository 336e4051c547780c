"""MoE expert parallelism: a GPTModel with megatron-core's MoE layer (2 experts, top-1 routing, the all-gather
token dispatcher) trained 3 AdamW steps; argv: MODE OUT_DIR.

MODE ref: one process holds both experts (the reference); ep: 2 processes, expert_model_parallel_size=2 (one
expert each) over data parallelism 2, each taking half of every batch. ep starts from ref's initial weights
and writes its losses, gradient norms and its merged final weights.
"""

import json
import sys
from pathlib import Path

import torch
from accel import Accelerator
from accel_megatron import MegatronPlugin, ModelProvider
from safetensors.torch import load_file, save_file

VOCAB, SEQ, BATCH, STEPS = 64, 8, 8, 3


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    plugin = MegatronPlugin(expert_model_parallel_size=2 if mode == "ep" else 1)
    accelerator = Accelerator(megatron_lm_plugin=plugin, split_batches=mode == "ep")

    def provider(pre_process: bool, post_process: bool) -> torch.nn.Module:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            use_cpu_initialization=True,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            num_moe_experts=2,
            moe_router_topk=1,
            moe_router_pre_softmax=True,
            moe_token_dispatcher_type="allgather",
            moe_aux_loss_coeff=0.0,
            add_bias_linear=False,  # megatron-core 0.16.1 adds expert biases in place on a view (autograd error)
            **plugin.transformer_config_kwargs(),
        )
        return GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(num_experts=2, moe_grouped_gemm=False),
            vocab_size=VOCAB,
            max_sequence_length=SEQ,
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=False,
        )

    model = accelerator.prepare(ModelProvider(provider))
    if mode == "ref":
        init = {k: v.detach().clone().contiguous() for k, v in accelerator.get_state_dict(model).items()}
        save_file(init, str(out / "moe_init.safetensors"))
    else:
        accelerator._load_model_state_dict(model, load_file(str(out / "moe_init.safetensors")))
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH * STEPS, SEQ + 1), generator=g)
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=BATCH))
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)[None, None]
    losses, norms = [], []
    for (batch,) in loader:
        position_ids = torch.arange(SEQ)[None].expand(batch.shape[0], -1)
        loss = model(batch[:, :-1], position_ids, causal, labels=batch[:, 1:]).mean()
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 1e6)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    final = accelerator.get_state_dict(model)
    experts = sum(1 for n, _ in accelerator.unwrap_model(model).named_parameters() if ".experts." in n)
    if accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in final.items()}, str(out / f"moe_{mode}_final.safetensors"))
        (out / f"moe_{mode}.json").write_text(json.dumps({"losses": losses, "norms": norms, "experts": experts}))
    accelerator.end_training()


if __name__ == "__main__":
    main()
