"""Hugging Face causal LMs (GPT-2, Llama) through megatron-core: config parsing, weight conversion both ways,
and Accelerate's `GPTTrainStep` behaviour for them.

`accelerator.prepare(hf_model)` under the megatron strategy reads the model's `transformers` config as
Accelerate's model parsers do (`num_layers`, `hidden_size`, `num_attention_heads`, `max_position_embeddings`,
`orig_vocab_size`, `seq_length`), builds the same network as a megatron-core `GPTModel` for this process's
tensor/pipeline shard and loads the Hugging Face weights into it, converted to megatron-core's layout:

| Hugging Face | megatron-core |
| --- | --- |
| GPT-2 `Conv1D` weights (in, out) | `Linear` weights (out, in): transposed |
| separate or concatenated q, k, v | one `linear_qkv`, per query group `[q heads of the group, k, v]` |
| Llama `gate_proj`, `up_proj` | one `linear_fc1`, `[gate; up]` (SwiGLU) |
| `LayerNorm` / `RMSNorm`, rotary (`rope_theta`), tied embeddings | the same, as TransformerConfig/GPTModel options |

`save_model` / `get_state_dict` convert back: the files have the Hugging Face model's names and shapes and load
with `from_pretrained` (next to the model's `config.json`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .plugin import MegatronConfigError, MegatronPlugin

HF_CONFIG = "_accel_hf_config"
"""Attribute of a built megatron-core model that came from a Hugging Face model: that model's config."""

# Accelerate 1.15's parsers this package refuses, with the reason.
_REFUSED = {
    "bert": "megatron-core's BertModel is a pre-LayerNorm transformer and Hugging Face BERT is post-LayerNorm, so "
    "its weights do not compute the same network there",
    "t5": "its conversion is not implemented (megatron-core 0.16 has a T5Model, but Hugging Face T5's unscaled "
    "attention, shared relative position bias and T5TrainStep are not mapped here)",
    "glm4_moe": "Accelerate's GLM4-MoE mapping uses grouped-GEMM experts, fused permutation and flash attention "
    "(CUDA/Transformer Engine); it is not converted here",
}
_SUPPORTED = ("gpt2", "llama")


def is_hf_model(model: nn.Module) -> bool:
    """Whether `model` is a `transformers` model (it has a config with a `model_type`) and not megatron-core's."""
    from megatron.core.transformer.module import MegatronModule

    config = getattr(model, "config", None)
    return not isinstance(model, MegatronModule) and isinstance(getattr(config, "model_type", None), str)


def _family(config: Any) -> str:
    kind = str(config.model_type).lower()
    for name in _SUPPORTED:
        if kind == name:
            return name
    for name, reason in _REFUSED.items():
        if name in kind:
            raise MegatronConfigError(
                f"Hugging Face model type {kind!r} is not supported: {reason}; train a GPT-2 or Llama model, or "
                "build a megatron-core model yourself (custom_model_provider_function)."
            )
    raise MegatronConfigError(
        f"Hugging Face model type {kind!r} has no megatron-core conversion here (GPT-2 and Llama do); give "
        "MegatronPlugin(custom_model_provider_function=...) to build its megatron-core model."
    )


def megatron_args(config: Any, plugin: MegatronPlugin, batch_data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Megatron-LM's network-size arguments for a Hugging Face config, as Accelerate's model parsers set them.

    `seq_length`: the plugin's, else the batch's sequence length, else `max_position_embeddings` (the plugin's
    `seq_length` is not changed).

    Raises:
        MegatronConfigError: a model type without a conversion (BERT, T5 and GLM4-MoE by name, with the reason).
    """
    family = _family(config)
    if family == "gpt2":
        layers, hidden, heads, positions = config.n_layer, config.n_embd, config.n_head, config.n_positions
        tokenizer = "GPT2BPETokenizer"
    else:
        layers, hidden, heads = config.num_hidden_layers, config.hidden_size, config.num_attention_heads
        positions, tokenizer = config.max_position_embeddings, "Llama2Tokenizer"
    seq_length = plugin.seq_length
    if seq_length is None and family == "llama":
        seq_length = getattr(config, "max_sequence_length", None)
    if seq_length is None and batch_data is not None:
        seq_length = int(batch_data["input_ids"].shape[1])
    return {
        "model_type_name": "gpt",
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "max_position_embeddings": positions,
        "orig_vocab_size": config.vocab_size,
        "seq_length": seq_length or positions,
        "pretraining_flag": True,
        "tokenizer_type": tokenizer,
        "return_logits": plugin.return_logits,
        "model_return_dict": getattr(config, "return_dict", True),
    }


def _gelu(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    name = config.activation_function
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return functools.partial(F.gelu, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise MegatronConfigError(
        f"GPT-2 activation_function={name!r} has no megatron-core counterpart here; use 'gelu_new'."
    )


def _llama_rope(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", scaling.get("rope_type", "default"))
    if kind != "default":
        raise MegatronConfigError(
            f"Llama rope_type={kind!r} is not converted here; only the default rotary embedding is."
        )
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def model_kwargs(config: Any, plugin: MegatronPlugin) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TransformerConfig kwargs, GPTModel kwargs) of the megatron-core network equal to the Hugging Face one.

    Raises:
        MegatronConfigError: an option of the Hugging Face model without a megatron-core counterpart here, or a
            vocabulary that the tensor-parallel size does not divide.
    """
    family = _family(config)
    if config.vocab_size % plugin.tp_degree:
        raise MegatronConfigError(
            f"vocab_size {config.vocab_size} is not divisible by tp_degree {plugin.tp_degree}: megatron-core splits "
            "the vocabulary evenly; pad the vocabulary (resize_token_embeddings) to a multiple of it."
        )
    if family == "gpt2":
        if getattr(config, "scale_attn_by_inverse_layer_idx", False) or not getattr(config, "scale_attn_weights", True):
            raise MegatronConfigError(
                "GPT-2 scale_attn_by_inverse_layer_idx=True / scale_attn_weights=False have no megatron-core "
                "counterpart; use the defaults."
            )
        if config.embd_pdrop != config.resid_pdrop:
            raise MegatronConfigError(
                f"GPT-2 embd_pdrop ({config.embd_pdrop}) differs from resid_pdrop ({config.resid_pdrop}): megatron-core "
                "uses one hidden_dropout for both; set them equal."
            )
        tc = {
            "num_layers": config.n_layer,
            "hidden_size": config.n_embd,
            "num_attention_heads": config.n_head,
            "ffn_hidden_size": config.n_inner or 4 * config.n_embd,
            "layernorm_epsilon": config.layer_norm_epsilon,
            "hidden_dropout": config.resid_pdrop,
            "attention_dropout": config.attn_pdrop,
            "activation_func": _gelu(config),
            "normalization": "LayerNorm",
        }
        gpt = {"max_sequence_length": config.n_positions, "position_embedding_type": "learned_absolute"}
    else:
        if (
            config.hidden_act != "silu"
            or getattr(config, "attention_bias", False)
            or getattr(config, "mlp_bias", False)
        ):
            raise MegatronConfigError(
                "Llama with hidden_act other than 'silu', attention_bias or mlp_bias is not converted here; use the "
                "defaults."
            )
        heads = config.num_attention_heads
        tc = {
            "num_layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "num_attention_heads": heads,
            "num_query_groups": config.num_key_value_heads or heads,
            "kv_channels": getattr(config, "head_dim", None) or config.hidden_size // heads,
            "ffn_hidden_size": config.intermediate_size,
            "layernorm_epsilon": config.rms_norm_eps,
            "hidden_dropout": 0.0,
            "attention_dropout": config.attention_dropout,
            "activation_func": F.silu,
            "gated_linear_unit": True,
            "add_bias_linear": False,
            "normalization": "RMSNorm",
        }
        gpt = {
            "max_sequence_length": config.max_position_embeddings,
            "position_embedding_type": "rope",
            "rotary_base": _llama_rope(config),
        }
    # The plugin's own model fields (dropouts, recomputation, other_megatron_args) win over the model's.
    tc.update(use_cpu_initialization=True, **plugin.transformer_config_kwargs())
    gpt.update(vocab_size=config.vocab_size, share_embeddings_and_output_weights=bool(config.tie_word_embeddings))
    return tc, gpt


def provider(config: Any, plugin: MegatronPlugin) -> Callable[..., nn.Module]:
    """`fn(pre_process, post_process[, vp_stage])` building this stage of the megatron-core twin of `config`."""
    tc_kwargs, gpt_kwargs = model_kwargs(config, plugin)

    def build(pre_process: bool, post_process: bool, vp_stage: int | None = None) -> nn.Module:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        spec = get_gpt_layer_local_spec(normalization=tc_kwargs["normalization"])
        model = GPTModel(
            config=TransformerConfig(**tc_kwargs),
            transformer_layer_spec=spec,
            pre_process=pre_process,
            post_process=post_process,
            vp_stage=vp_stage,
            **gpt_kwargs,
        )
        setattr(model, HF_CONFIG, config)
        return model

    return build


# ---- weights -----------------------------------------------------------------------------------
def _heads(config: Any) -> tuple[int, int, int]:
    """(attention heads, key/value groups, head size)."""
    if _family(config) == "gpt2":
        return config.n_head, config.n_head, config.n_embd // config.n_head
    heads = config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, config.num_key_value_heads or heads, dim


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: Any) -> torch.Tensor:
    heads, groups, dim = _heads(config)
    rest = q.shape[1:]
    parts = [
        q.reshape(groups, heads // groups * dim, *rest),
        k.reshape(groups, dim, *rest),
        v.reshape(groups, dim, *rest),
    ]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, config: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    heads, groups, dim = _heads(config)
    rest = qkv.shape[1:]
    q, k, v = qkv.reshape(groups, -1, *rest).split([heads // groups * dim, dim, dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _layer_count(config: Any) -> int:
    return int(config.n_layer if _family(config) == "gpt2" else config.num_hidden_layers)


def to_megatron(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """A Hugging Face GPT-2/Llama state dict in the megatron-core GPTModel's names and layout (one process)."""
    hf = {k.removeprefix("module."): v.detach() for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    if _family(config) == "gpt2":
        out["embedding.word_embeddings.weight"] = hf["transformer.wte.weight"]
        out["embedding.position_embeddings.weight"] = hf["transformer.wpe.weight"]
        for i in range(_layer_count(config)):
            h, m = f"transformer.h.{i}.", f"decoder.layers.{i}."
            q, k, v = hf[h + "attn.c_attn.weight"].t().chunk(3)
            out[m + "self_attention.linear_qkv.weight"] = _fuse_qkv(q, k, v, config)
            qb, kb, vb = hf[h + "attn.c_attn.bias"].chunk(3)
            out[m + "self_attention.linear_qkv.bias"] = _fuse_qkv(qb, kb, vb, config)
            out[m + "self_attention.linear_proj.weight"] = hf[h + "attn.c_proj.weight"].t()
            out[m + "self_attention.linear_proj.bias"] = hf[h + "attn.c_proj.bias"]
            out[m + "mlp.linear_fc1.weight"] = hf[h + "mlp.c_fc.weight"].t()
            out[m + "mlp.linear_fc1.bias"] = hf[h + "mlp.c_fc.bias"]
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.c_proj.weight"].t()
            out[m + "mlp.linear_fc2.bias"] = hf[h + "mlp.c_proj.bias"]
            for norm, ours in (("ln_1", "input_layernorm"), ("ln_2", "pre_mlp_layernorm")):
                out[m + f"{ours}.weight"] = hf[h + f"{norm}.weight"]
                out[m + f"{ours}.bias"] = hf[h + f"{norm}.bias"]
        out["decoder.final_layernorm.weight"] = hf["transformer.ln_f.weight"]
        out["decoder.final_layernorm.bias"] = hf["transformer.ln_f.bias"]
        head = hf.get("lm_head.weight", hf["transformer.wte.weight"])
    else:
        out["embedding.word_embeddings.weight"] = hf["model.embed_tokens.weight"]
        for i in range(_layer_count(config)):
            h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
            q, k, v = (hf[h + f"self_attn.{p}_proj.weight"] for p in "qkv")
            out[m + "self_attention.linear_qkv.weight"] = _fuse_qkv(q, k, v, config)
            out[m + "self_attention.linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"]
            out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]])
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
            out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
            out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        head = hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    # Tied: the last pipeline stage keeps its own copy of the embedding as output layer (unused otherwise).
    out["output_layer.weight"] = head
    return {k: v.contiguous() for k, v in out.items()}


def to_hf(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """A full megatron-core GPTModel state dict (as `save_model` gathers it) in the Hugging Face model's names and
    layout (tied output embeddings left out, as `save_pretrained` does)."""
    mg = {k: v for k, v in state.items() if not k.endswith("_extra_state")}
    out: dict[str, torch.Tensor] = {}
    if _family(config) == "gpt2":
        out["transformer.wte.weight"] = mg["embedding.word_embeddings.weight"]
        out["transformer.wpe.weight"] = mg["embedding.position_embeddings.weight"]
        for i in range(_layer_count(config)):
            h, m = f"transformer.h.{i}.", f"decoder.layers.{i}."
            out[h + "attn.c_attn.weight"] = torch.cat(
                _split_qkv(mg[m + "self_attention.linear_qkv.weight"], config)
            ).t()
            out[h + "attn.c_attn.bias"] = torch.cat(_split_qkv(mg[m + "self_attention.linear_qkv.bias"], config))
            out[h + "attn.c_proj.weight"] = mg[m + "self_attention.linear_proj.weight"].t()
            out[h + "attn.c_proj.bias"] = mg[m + "self_attention.linear_proj.bias"]
            out[h + "mlp.c_fc.weight"] = mg[m + "mlp.linear_fc1.weight"].t()
            out[h + "mlp.c_fc.bias"] = mg[m + "mlp.linear_fc1.bias"]
            out[h + "mlp.c_proj.weight"] = mg[m + "mlp.linear_fc2.weight"].t()
            out[h + "mlp.c_proj.bias"] = mg[m + "mlp.linear_fc2.bias"]
            for norm, ours in (("ln_1", "input_layernorm"), ("ln_2", "pre_mlp_layernorm")):
                out[h + f"{norm}.weight"] = mg[m + f"{ours}.weight"]
                out[h + f"{norm}.bias"] = mg[m + f"{ours}.bias"]
        out["transformer.ln_f.weight"] = mg["decoder.final_layernorm.weight"]
        out["transformer.ln_f.bias"] = mg["decoder.final_layernorm.bias"]
    else:
        out["model.embed_tokens.weight"] = mg["embedding.word_embeddings.weight"]
        for i in range(_layer_count(config)):
            h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
            q, k, v = _split_qkv(mg[m + "self_attention.linear_qkv.weight"], config)
            out |= {
                h + "self_attn.q_proj.weight": q,
                h + "self_attn.k_proj.weight": k,
                h + "self_attn.v_proj.weight": v,
            }
            out[h + "self_attn.o_proj.weight"] = mg[m + "self_attention.linear_proj.weight"]
            gate, up = mg[m + "mlp.linear_fc1.weight"].chunk(2)
            out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
            out[h + "mlp.down_proj.weight"] = mg[m + "mlp.linear_fc2.weight"]
            out[h + "input_layernorm.weight"] = mg[m + "input_layernorm.weight"]
            out[h + "post_attention_layernorm.weight"] = mg[m + "pre_mlp_layernorm.weight"]
        out["model.norm.weight"] = mg["decoder.final_layernorm.weight"]
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = mg["output_layer.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def is_hf_state_dict(state: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict has Hugging Face names (not megatron-core GPTModel's)."""
    return not any(k.startswith(("decoder.", "embedding.")) for k in state)


# ---- Accelerate's GPTTrainStep -------------------------------------------------------------------
class GPTTrainStep:
    """Accelerate's `GPTTrainStep` for a prepared Hugging Face causal LM (GPT-2, Llama) under the megatron strategy.

    Batches are Hugging Face's: `{"input_ids": ..., "labels": ... (optional, default the input ids)}` with
    `-100` labels left out of the loss, right padding. The loss is the Hugging Face model's: cross-entropy of
    each next token (computed over the tensor-parallel vocabulary shards), averaged over the batch's
    counted tokens, and over micro-batches under pipeline parallelism.

    `GPTTrainStep(accelerator)` (or the accelerator's megatron strategy). `step(model, batch)` runs forward and
    backward through megatron-core's schedule (`accelerator.strategy.train_step`) and returns the loss averaged over
    the data-parallel replicas; call `optimizer.step()` after it as usual. (`model(**batch)` runs this and the
    optimizer and scheduler steps itself, as Accelerate's Megatron-LM engine does: see `MegatronEngine`.)
    `step.eval_step(model, batch)` is Accelerate's `eval_step`: `{"lm loss": ...}` averaged over the
    data-parallel replicas, with `"logits"` (full vocabulary, gathered over the tensor-parallel group; on the
    last pipeline stage) when the plugin's `return_logits` is set.
    """

    def __init__(self, accelerator: Any) -> None:
        from .strategy import MegatronStrategy

        strategy = accelerator if isinstance(accelerator, MegatronStrategy) else getattr(accelerator, "strategy", None)
        if not isinstance(strategy, MegatronStrategy):
            raise MegatronConfigError(
                "GPTTrainStep needs an Accelerator(megatron_lm_plugin=MegatronPlugin(...)) (the megatron strategy)."
            )
        self.strategy = strategy

    @staticmethod
    def forward_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """This stage's output; on the last stage the logits over this process's vocabulary shard `[b, s, v/tp]`."""
        tokens = batch["input_ids"]
        mask = batch.get("attention_mask")
        if mask is not None and bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise MegatronConfigError(
                "GPTTrainStep runs causal attention without a padding mask: pad on the right (tokenizer padding_side="
                "'right') and label the padding -100."
            )
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        return model(tokens, positions, None)  # type: ignore[no-any-return]  # causal: megatron-core builds the mask

    @staticmethod
    def loss_fn(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token cross-entropy over the labels that are not -100 (Hugging Face's causal-LM loss)."""
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        labels = batch.get("labels", batch["input_ids"])
        shifted = torch.full_like(labels, -100)
        shifted[:, :-1] = labels[:, 1:]
        counted = shifted != -100
        per_token = vocab_parallel_cross_entropy(logits.float().contiguous(), shifted.clamp(min=0))
        return (per_token * counted).sum() / counted.sum().clamp(min=1)

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        from .utils import avg_losses_across_data_parallel_group

        loss = self.strategy.train_step(model, batch, self.forward_fn, self.loss_fn)
        return avg_losses_across_data_parallel_group([loss])[0]

    def eval_step(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Forward only: `{"lm loss": loss averaged over the data-parallel replicas}` and, with `return_logits`,
        `"logits"` of the whole batch over the full vocabulary."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        from .utils import avg_losses_across_data_parallel_group

        with torch.no_grad():
            result = self.strategy.train_step(model, batch, self.forward_fn, self.loss_fn, forward_only=True)
        out: dict[str, torch.Tensor] = {}
        if isinstance(result, tuple):
            result, logits = result
            if logits is not None:
                with self.strategy.redirect():
                    out["logits"] = gather_from_tensor_model_parallel_region(logits)
        out["lm loss"] = avg_losses_across_data_parallel_group([result])[0]
        return out
