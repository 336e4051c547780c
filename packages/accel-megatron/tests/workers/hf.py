"""Hugging Face GPT-2 and Llama (tiny configs, no download) trained 3 AdamW steps with a linear lr decay;
argv: MODE OUT_DIR.

MODE ref (`reference`, which the test runs in its own process): the plain `transformers` models in an ordinary
torch loop on one process (the reference).
MODE mp: 2 processes, `Accelerator(megatron_lm_plugin=MegatronPlugin(..., return_logits=True))`, GPT-2 under PP=2
(2 micro-batches), Llama under TP=2 and under DP=2:
`prepare(hf_model)` parses the config into a megatron-core GPTModel and converts the weights in. GPT-2 and the
data-parallel Llama train with Accelerate's own Megatron-LM loop (`outputs = model(**batch)` runs the whole step; the
`accelerator.backward`, `optimizer.step`, `scheduler.step` and `zero_grad` after it do nothing) and evaluate with
`model.eval(); model(**batch)`; the tensor-parallel Llama trains through `GPTTrainStep` (megatron-core's schedule)
with its own `optimizer.step()` and evaluates with `eval_step`. Evaluation returns the loss and full-vocabulary logits;
`save_model` writes the weights back in Hugging Face layout (with the model's config.json next to them).
Both modes build each model from the same seed; each process writes its per-step losses and learning rates, the
evaluation loss and logits (hf_MODE_RANK.json).
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

STEPS, BATCH, SEQ, VOCAB = 3, 4, 8, 64
CONFIGS = {
    "gpt2": GPT2Config(
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
    # Grouped-query attention (4 heads, 2 key/value groups), untied output layer, non-default rope_theta.
    "llama": LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        rope_theta=500.0,
        tie_word_embeddings=False,
    ),
}

g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, VOCAB, (STEPS * BATCH, SEQ), generator=g)
labels = tokens.clone()
labels[::2, :3] = -100  # left out of the loss, as Hugging Face's loss does
samples = [{"input_ids": t, "labels": lab} for t, lab in zip(tokens, labels)]
eval_batch = {"input_ids": tokens[:BATCH], "labels": labels[:BATCH]}


# 2 processes: GPT-2 under PP=2 (its tied embedding on both stages), Llama under TP=2 (q/k/v groups and the SwiGLU
# gate/up halves split over the ranks).
# llama_dp: data parallelism 2, each replica half of every batch (split_batches), the loss averaged over replicas.
LAYOUTS = {
    "gpt2": {"pp_degree": 2, "num_micro_batches": 2},
    "llama": {"tp_degree": 2},
    "llama_dp": {},
    # Accelerate's train-step protocol: a custom_train_step_class whose Megatron-LM forward_step computes the
    # Hugging Face loss from megatron-core's per-token losses (model(..., labels=...)), under PP=2.
    "gpt2_custom": {"pp_degree": 2, "num_micro_batches": 2},
}
ACCELERATE_LOOP = {"gpt2", "llama_dp", "gpt2_custom"}
"""Runs trained as Accelerate's Megatron-LM examples train (`model(**batch)`); the others through GPTTrainStep."""


class HFLossStep:
    """A `custom_train_step_class` as Accelerate's users write them: built with Megatron-LM's args and the plugin's
    `custom_train_step_kwargs`; `forward_step(data_iterator, model) -> (output, loss_func)`."""

    def __init__(self, args, ignore_index):
        from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

        self.args = args
        self.ignore_index = ignore_index
        self.model_output_class = CausalLMOutputWithCrossAttentions

    def forward_step(self, data_iterator, model):
        from accel_megatron import avg_losses_across_data_parallel_group

        micro = next(data_iterator)
        tokens, labels = micro["input_ids"], micro["labels"]
        shifted = torch.full_like(labels, self.ignore_index)
        shifted[:, :-1] = labels[:, 1:]
        mask = (shifted != self.ignore_index).float()
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        per_token = model(tokens, positions, None, labels=shifted.clamp(min=0))

        def loss_func(output):
            loss = (output.float() * mask).sum() / mask.sum()
            return loss, {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}

        return per_token, loss_func


def build(family: str) -> torch.nn.Module:
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(CONFIGS[family], attn_implementation="eager")
    return model.float()


def optimizer_for(params):
    return torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def scheduler_for(optimizer):
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.5, total_iters=STEPS)


def reference(out: Path) -> None:
    """The plain `transformers` models trained in an ordinary torch loop on this one process."""
    result = {}
    for family in CONFIGS:
        model = build(family)
        optimizer = optimizer_for(model.parameters())
        scheduler = scheduler_for(optimizer)
        losses, lrs = [], []
        for i in range(STEPS):
            batch = {k: torch.stack([s[k] for s in samples[i * BATCH : (i + 1) * BATCH]]) for k in samples[0]}
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            lrs.append(scheduler.get_last_lr()[0])
        with torch.no_grad():
            evaluated = model(**eval_batch)
        result[family] = {
            "losses": losses,
            "lrs": lrs,
            "eval": evaluated.loss.item(),
            "logits": evaluated.logits.tolist(),
        }
        tied = family == "gpt2"  # save_pretrained leaves the tied head out
        final = {k: v.clone() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(final, str(out / f"{family}_ref.safetensors"))
    result["eval_ids"] = eval_batch["input_ids"].tolist()
    (out / "hf_ref_0.json").write_text(json.dumps(result))


def model_parallel(out: Path) -> None:
    """Each model through `Accelerator(megatron_lm_plugin=...)` in its LAYOUTS entry (2 processes)."""
    from accel import Accelerator
    from accel.distributed.state import AcceleratorState, GradientState
    from accel_megatron import GPTTrainStep, MegatronPlugin
    from megatron.core import parallel_state
    from torch.utils.data import DataLoader

    result = {}
    for run, layout in LAYOUTS.items():
        family = run.removesuffix("_dp").removesuffix("_custom")
        AcceleratorState._reset_state(reset_partial_state=False)  # one Accelerator per model, as in Accelerate
        GradientState._reset_state()
        parallel_state.destroy_model_parallel()  # each model its own layout
        plugin = MegatronPlugin(**layout, return_logits=True)
        if run.endswith("_custom"):
            plugin = MegatronPlugin(
                **layout, custom_train_step_class=HFLossStep, custom_train_step_kwargs={"ignore_index": -100}
            )
        accelerator = Accelerator(megatron_lm_plugin=plugin, split_batches=run.endswith("_dp"))
        hf_model = build(family)
        model = accelerator.prepare(hf_model)
        optimizer = optimizer_for(model.parameters())
        scheduler = scheduler_for(optimizer)
        optimizer, loader, scheduler = accelerator.prepare(optimizer, DataLoader(samples, batch_size=BATCH), scheduler)
        step = GPTTrainStep(accelerator)
        losses, lrs = [], []
        model.train()
        for batch in loader:
            if run in ACCELERATE_LOOP:  # Accelerate's loop: the model call runs the step, the rest does nothing
                loss = model(**batch).loss
                accelerator.backward(loss)
            else:
                loss = step(model, batch)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            lrs.append(scheduler.get_last_lr()[0])
        eval_batch_here = {k: v.to(accelerator.device) for k, v in eval_batch.items()}
        if run in ACCELERATE_LOOP:
            model.eval()
            outputs = model(**eval_batch_here)
            evaluated = {"lm loss": outputs.loss} | ({} if outputs.logits is None else {"logits": outputs.logits})
        else:
            evaluated = step.eval_step(model, eval_batch_here)
        target = out / f"{run}_mp"
        accelerator.save_model(model, target)
        if accelerator.is_main_process:
            hf_model.config.save_pretrained(target)
        if run.endswith("_custom"):  # what the class was built with: Megatron-LM's names and the parsed model
            args = model._handler.args
            result["custom_args"] = [
                args.tensor_model_parallel_size,
                args.pipeline_model_parallel_size,
                args.num_layers,
                args.num_micro_batches,
                args.model_type_name,
            ]
        result[run] = {
            "losses": losses,
            "lrs": lrs,
            "eval": evaluated["lm loss"].item(),
            "logits": evaluated["logits"].tolist() if "logits" in evaluated else None,  # last pipeline stage only
            "shard_params": sum(p.numel() for p in accelerator.unwrap_model(model).parameters()),
            "hf_params": sum(p.numel() for p in hf_model.parameters()),
        }
        accelerator.wait_for_everyone()
    (out / f"hf_mp_{accelerator.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    (reference if sys.argv[1] == "ref" else model_parallel)(Path(sys.argv[2]))
