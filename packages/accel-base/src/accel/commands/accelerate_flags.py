"""`accelerate launch`'s flags in `accel launch`: accepted with their meaning, or refused with what to use.

Flags accel shares with `accelerate launch` under the same name (`--num_processes`,
`--mixed_precision`, `--main_process_port`, ...) are declared in `launch.py`. This module
adds the rest: the DeepSpeed and FSDP families (mapped onto `DeepSpeedPlugin` and
`FSDPConfig` through `accel.compat.settings`), the strategy switches, dynamo options,
and flags accel refuses with a one-line reason. Every flag takes both spellings.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..strategies.parallelism_config import LAUNCH_KEYS, launch_env
from . import add_flag

DEEPSPEED_FLAGS = (
    "deepspeed_config_file",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "gradient_clipping",
    "zero3_init_flag",
    "zero3_save_16bit_model",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_multinode_launcher",
    "deepspeed_moe_layer_cls_names",
)
FSDP_FLAGS = (
    "fsdp_version",
    "fsdp_offload_params",
    "fsdp_min_num_params",
    "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_backward_prefetch",
    "fsdp_state_dict_type",
    "fsdp_forward_prefetch",
    "fsdp_use_orig_params",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states",
    "fsdp_activation_checkpointing",
    "fsdp_activation_checkpointing_offload",
)
DYNAMO_FLAGS = ("dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation")

MEGATRON_FLAGS = tuple(
    f"megatron_lm_{name}"
    for name in (
        "tp_degree",
        "pp_degree",
        "num_micro_batches",
        "sequence_parallelism",
        "recompute_activations",
        "use_distributed_optimizer",
        "gradient_clipping",
        "use_custom_fsdp",
        "no_load_optim",
        "no_save_optim",
        "eod_mask_loss",
        "overlap_cpu_optimizer_d2h_h2d",
        "optimizer_cpu_offload",
        "use_precision_aware_optimizer",
        "decoder_last_pipeline_num_layers",
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "attention_backend",
        "expert_model_parallel_size",
        "context_parallel_size",
        "attention_dropout",
        "hidden_dropout",
        "attention_softmax_in_fp32",
        "expert_tensor_parallel_size",
        "calculate_per_token_loss",
        "use_rotary_position_embeddings",
    )
)

DEEPSPEED_HELP = {
    "deepspeed_config_file": "DeepSpeedPlugin.hf_ds_config: a DeepSpeed JSON config",
    "zero_stage": "DeepSpeedPlugin.zero_stage (0-3)",
    "offload_optimizer_device": "DeepSpeedPlugin.offload_optimizer_device (cpu, nvme)",
    "offload_param_device": "DeepSpeedPlugin.offload_param_device (cpu, nvme)",
    "offload_optimizer_nvme_path": "DeepSpeedPlugin.offload_optimizer_nvme_path",
    "offload_param_nvme_path": "DeepSpeedPlugin.offload_param_nvme_path",
    "gradient_clipping": "DeepSpeedPlugin.gradient_clipping",
    "zero3_init_flag": "DeepSpeedPlugin.zero3_init_flag (true/false)",
    "zero3_save_16bit_model": "DeepSpeedPlugin.zero3_save_16bit_model (true/false)",
    "deepspeed_multinode_launcher": "only `standard` (torchrun on each node)",
    "deepspeed_moe_layer_cls_names": "DeepSpeedPlugin.transformer_moe_cls_names: ZeRO-3 leaf modules (comma-separated class names)",
}
_DS_LAUNCHER = "accel launch starts every node through torchrun; run `accel launch --nnodes N` on each node"
FSDP_HELP = {
    "fsdp_version": "FSDPConfig.fsdp_version: 1 (FullyShardedDataParallel) or 2 (fully_shard, the default)",
    "fsdp_offload_params": "FSDPConfig.cpu_offload (true/false)",
    "fsdp_min_num_params": "FSDPConfig.min_num_params (with SIZE_BASED_WRAP)",
    "fsdp_sharding_strategy": "FSDPConfig.sharding_strategy under fsdp_version 1 (any); under 2 FULL_SHARD or "
    "SHARD_GRAD_OP (reshard_after_forward), HYBRID_SHARD is --parallelism_config_dp_replicate_size",
    "fsdp_reshard_after_forward": "FSDPConfig.reshard_after_forward (true/false)",
    "fsdp_auto_wrap_policy": "FSDPConfig.auto_wrap_policy (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP)",
    "fsdp_transformer_layer_cls_to_wrap": "FSDPConfig.transformer_cls_names_to_wrap (comma-separated)",
    "fsdp_backward_prefetch": "FSDPConfig.backward_prefetch under fsdp_version 1; under 2 noted, no effect "
    "(FSDP2 prefetches in backward by itself), as Accelerate",
    "fsdp_state_dict_type": "FSDPConfig.state_dict_type (FULL_STATE_DICT, SHARDED_STATE_DICT)",
    "fsdp_forward_prefetch": "FSDPConfig.forward_prefetch under fsdp_version 1; false only under 2",
    "fsdp_use_orig_params": "FSDPConfig.use_orig_params under fsdp_version 1; true only under 2",
    "fsdp_cpu_ram_efficient_loading": "FSDPConfig.cpu_ram_efficient_loading: every rank starts from rank 0's weights",
    "fsdp_sync_module_states": "FSDPConfig.sync_module_states under fsdp_version 1; under 2 noted, not honoured "
    "(seed every process the same, or cpu_ram_efficient_loading)",
    "fsdp_activation_checkpointing": "FSDPConfig.activation_checkpointing (true/false)",
    "fsdp_activation_checkpointing_offload": "false only",
}

_PODS = "Accelerate's pod launcher is not supported: run `accel launch --nnodes N` on each host"
FP8_FLAGS = {
    "fp8_backend": "the fp8 backend: te, ao or msamp (a recipe handler in the script wins)",
    "fp8_use_autocast_during_eval": "TERecipeKwargs.use_autocast_during_eval",
    "fp8_margin": "TERecipeKwargs.margin",
    "fp8_interval": "TERecipeKwargs.interval",
    "fp8_format": "TERecipeKwargs.fp8_format (HYBRID, E4M3, E5M2)",
    "fp8_amax_history_len": "TERecipeKwargs.amax_history_len",
    "fp8_amax_compute_algo": "TERecipeKwargs.amax_compute_algo (max, most_recent)",
    "fp8_override_linear_precision": "TERecipeKwargs.override_linear_precision: three booleans, comma-separated",
    "fp8_opt_level": "MS-AMP's opt_level (MS-AMP is refused by the adapters)",
    "fp8_enable_fsdp_float8_all_gather": "AORecipeKwargs.enable_fsdp_float8_all_gather (true/false)",
    "fp8_pad_inner_dim": "AORecipeKwargs.pad_inner_dim (true/false)",
}
"""`accelerate launch`'s fp8 flags: the workers get them as `ACCEL_FP8_*`, the defaults of the run's fp8 recipe
(a field set in the script's recipe handler wins)."""
_SP = "DeepSpeed Ulysses sequence parallelism is not supported; use --parallelism_config_cp_size (docs/parallelism.md)"
# Accelerate flag -> (takes a value, what to use instead). Flags named after one vendor's
# hardware are not listed: the core names no vendor, and the adapter for that hardware
# declares them (an unknown flag's error says so).
REFUSED: dict[str, tuple[bool, str]] = {
    "vm": (True, _PODS),
    "env": (True, _PODS),
    "main_training_function": (
        True,
        "accel launch runs the script as __main__ on every process: call that function there",
    ),
    "enable_cpu_affinity": (False, "bind the processes with numactl or taskset around `accel launch`"),
    "aws_access_key_id": (True, "SageMaker launches are not supported"),
    "aws_secret_access_key": (True, "SageMaker launches are not supported"),
    "mpirun_hostfile": (True, "run `mpirun -np N python train.py` yourself: accel reads MPI ranks (docs/launching.md)"),
    **{
        f"parallelism_config_{name}": (True, _SP)
        for name in ("sp_size", "sp_backend", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")
    },
}


class _FP8ToEnv(argparse.Action):
    """An `--fp8_*` flag: the workers get it as `ACCEL_FP8_*` (`launch.worker_env` adds `namespace.fp8_env`), as
    `accelerate launch` exports `ACCELERATE_FP8_*`."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        name = self.dest.removeprefix("fp8_")
        collected = dict(getattr(namespace, "fp8_env", None) or {})
        if name == "override_linear_precision":
            flags = str(values).split(",")
            if len(flags) != 3:
                parser.error(f"{option} takes three comma-separated booleans (fprop,dgrad,wgrad), got {values!r}")
            for part, flag in zip(("FPROP", "DGRAD", "WGRAD"), flags):
                collected[f"ACCEL_FP8_OVERRIDE_{part}"] = flag.strip()
        else:
            collected["ACCEL_FP8_" + name.upper()] = "true" if values in (None, []) else str(values)
        namespace.fp8_env = collected
        setattr(namespace, self.dest, True if values in (None, []) else values)


class _ParallelismToEnv(argparse.Action):
    """A `--parallelism_config_*` flag: the workers get it as `ACCEL_PARALLELISM_*` (`launch.worker_env` adds
    `namespace.parallelism_env`) and build their `ParallelismConfig` from it. Parsing changes no environment."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        value = None if values in (None, []) else values
        try:
            env = launch_env({self.dest: value})
        except ValueError as exc:
            parser.error(str(exc))
        collected = dict(getattr(namespace, "parallelism_env", None) or {})
        collected.update(env)
        namespace.parallelism_env = collected
        setattr(namespace, self.dest, True if value is None else value)


class _Refuse(argparse.Action):
    """A flag accel does not support: the parser stops with the reason and what to use."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        parser.error(f"{option} (an `accelerate launch` flag) is not supported by accel launch: {self.help}")


def add_accelerate_flags(parser: argparse.ArgumentParser) -> None:
    """Add every `accelerate launch` flag that `launch.py` does not declare itself."""
    g = parser.add_argument_group("accelerate launch compatibility (same meaning as in `accelerate launch`)")
    add_flag(g, "multi_gpu", action="store_true", help="accepted: several processes are the default on devices")
    add_flag(g, "same_network", action="store_true", help="accepted: no effect (torchrun's rendezvous)")
    add_flag(
        g,
        "gpu_ids",
        default=None,
        metavar="IDS",
        help="devices the workers see, comma-separated (the adapter's visible-devices variable); all: every one",
    )
    add_flag(g, "use_deepspeed", action="store_true", help="the deepspeed strategy (--strategy deepspeed)")
    add_flag(g, "use_fsdp", action="store_true", help="the fsdp2 strategy (--strategy fsdp2)")
    add_flag(g, "use_megatron_lm", action="store_true", help="the megatron strategy (accel-megatron)")
    add_flag(
        g,
        "dynamo_mode",
        choices=["default", "reduce-overhead", "max-autotune"],
        default=None,
        help="TorchDynamoPlugin.mode",
    )
    for name, field in zip(DYNAMO_FLAGS[1:], ("fullgraph", "dynamic", "use_regional_compilation")):
        add_flag(g, name, action="store_true", default=None, help=f"TorchDynamoPlugin.{field}")

    ds = parser.add_argument_group("DeepSpeed (with --use_deepspeed; fields of accel.DeepSpeedPlugin)")
    for name in DEEPSPEED_FLAGS:
        add_flag(ds, name, default=None, metavar="VALUE", help=DEEPSPEED_HELP.get(name, "refused: " + _DS_LAUNCHER))
    fsdp = parser.add_argument_group("FSDP (with --use_fsdp; fields of accel.FSDPConfig)")
    for name in FSDP_FLAGS:
        add_flag(fsdp, name, default=None, metavar="VALUE", help=FSDP_HELP[name])
    megatron = parser.add_argument_group(
        "Megatron-LM (with --use_megatron_lm; fields of accel_megatron.MegatronPlugin)"
    )
    for name in MEGATRON_FLAGS:
        field = name.removeprefix("megatron_lm_").replace("context_parallel_size", "cp_degree")
        add_flag(megatron, name, default=None, metavar="VALUE", help=f"MegatronPlugin.{field}")

    nd = parser.add_argument_group("N-D parallelism (accel.ParallelismConfig; docs/parallelism.md)")
    add_flag(nd, "use_parallelism_config", action=_ParallelismToEnv, nargs=0, help="build a ParallelismConfig")
    for name in LAUNCH_KEYS:
        add_flag(
            nd,
            f"parallelism_config_{name}",
            action=_ParallelismToEnv,
            metavar="VALUE",
            help=f"ParallelismConfig.{name}",
        )
    fp8 = parser.add_argument_group("fp8 (with --mixed_precision fp8; defaults of the script's fp8 recipe handler)")
    for name, help_text in FP8_FLAGS.items():
        switch = name == "fp8_use_autocast_during_eval"
        add_flag(
            fp8,
            name,
            action=_FP8ToEnv,
            nargs=0 if switch else None,
            default=None,
            metavar=None if switch else "VALUE",
            help=help_text,
        )
    refused = parser.add_argument_group("refused `accelerate launch` flags (each says what to use instead)")
    for name, (takes_value, instead) in REFUSED.items():
        add_flag(
            refused,
            name,
            action=_Refuse,
            nargs=None if takes_value else 0,
            dest=f"refused_{name}",
            default=argparse.SUPPRESS,
            metavar="VALUE" if takes_value else None,
            help=instead,
        )


def given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """The flags among `names` that were given on the command line, with their values."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
