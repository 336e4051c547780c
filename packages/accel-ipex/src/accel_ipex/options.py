"""The IPEX adapter's options: one typed dataclass, filled once from code, flags or environment.

`accel launch --ipex-weights-prepack off --ipex-level O1 --no-ipex-optimize` turns into the
`ACCEL_IPEX_*` variables below (`accel.adapter.options` generates the flags and parses the
variables); the adapter reads them in its `__init__` and nothing deeper reads the environment.
Accelerate's spellings come here too: `--ipex`, a config file's `ipex_config`, and (through the
adapter's `accelerate_env`) `ACCELERATE_USE_IPEX`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from accel.adapter.options import FALSE_WORDS, TRUE_WORDS, AdapterOptions, option

LEVELS = ("O0", "O1")


@dataclass(kw_only=True, frozen=True)
class IpexOptions(AdapterOptions):
    """How the IPEX adapter prepares models. Each field has a launch flag and an `ACCEL_IPEX_*` variable."""

    label: ClassVar[str] = "IPEX"

    optimize: bool = option(
        True,
        env="ACCEL_IPEX_OPTIMIZE",
        flag="--ipex-optimize",
        help="ipex: run ipex.optimize on prepared models (--no-ipex-optimize: do not)",
    )
    """Run `ipex.optimize` on prepared models (before any DDP wrap). Off: plain PyTorch on the
    device, with the adapter's device, backend and precision rules."""
    weights_prepack: bool | None = option(
        None,
        env="ACCEL_IPEX_WEIGHTS_PREPACK",
        flag="--ipex-weights-prepack",
        help="ipex: prepack weights into oneDNN layouts ('auto' decides from the CPU's instruction sets)",
    )
    """Prepack Linear/Conv weights into oneDNN's blocked layout (faster kernels, same results).
    None ("auto"): decided per CPU (fp32 always; bf16 only with avx_ne_convert or avx512bw/vl/dq,
    where IPEX would otherwise assert). True on a CPU that cannot prepack bf16 fails in `prepare`."""
    level: str = option(
        "O1", env="ACCEL_IPEX_LEVEL", flag="--ipex-level", choices=LEVELS, help="ipex: ipex.optimize level (O1 default)"
    )
    """`ipex.optimize` level: "O1" (fusions, prepacking, fused optimizer steps) or "O0" (only the
    dtype conversion)."""

    # ---- more of ipex.optimize's keyword arguments: unset (None, "default") leaves IPEX's default for the level --
    split_master_weight_for_bf16: bool | None = option(
        None,
        env="ACCEL_IPEX_SPLIT_MASTER_WEIGHT_FOR_BF16",
        flag="--ipex-split-master-weight-for-bf16",
        none_word="default",
        help="ipex: under bf16, keep each fp32 master as the bf16 weight plus its low 16 bits (IPEX's default); "
        "off keeps a whole fp32 copy",
    )
    """bf16 training: IPEX's split masters (the bf16 parameter is the master's top half, the low half kept
    aside: no extra memory) or, off, a whole fp32 master copy next to each bf16 parameter."""
    fuse_update_step: bool | None = option(
        None,
        env="ACCEL_IPEX_FUSE_UPDATE_STEP",
        flag="--ipex-fuse-update-step",
        none_word="default",
        help="ipex: replace the optimizer's step with IPEX's fused kernel (SGD, Adam, AdamW, Adagrad, Lamb; "
        "on by default at O1)",
    )
    """Replace the optimizer's `step` with IPEX's fused update (one kernel per parameter). Needed for split
    bf16 masters (IPEX turns splitting off without it)."""
    conv_bn_folding: bool | None = option(
        None,
        env="ACCEL_IPEX_CONV_BN_FOLDING",
        flag="--ipex-conv-bn-folding",
        none_word="default",
        help="ipex: evaluation models: fold BatchNorm into the preceding Conv (on by default at O1)",
    )
    """Evaluation-mode optimize: fold each BatchNorm into the convolution before it."""
    linear_bn_folding: bool | None = option(
        None,
        env="ACCEL_IPEX_LINEAR_BN_FOLDING",
        flag="--ipex-linear-bn-folding",
        none_word="default",
        help="ipex: evaluation models: fold BatchNorm into the preceding Linear (on by default at O1)",
    )
    """Evaluation-mode optimize: fold each BatchNorm into the Linear layer before it."""
    replace_dropout_with_identity: bool | None = option(
        None,
        env="ACCEL_IPEX_REPLACE_DROPOUT_WITH_IDENTITY",
        flag="--ipex-replace-dropout-with-identity",
        none_word="default",
        help="ipex: evaluation models: replace Dropout with Identity (on by default at O1)",
    )
    """Evaluation-mode optimize: replace dropout layers (no-ops in eval) with `nn.Identity`."""
    optimize_lstm: bool | None = option(
        None,
        env="ACCEL_IPEX_OPTIMIZE_LSTM",
        flag="--ipex-optimize-lstm",
        none_word="default",
        help="ipex: replace nn.LSTM with IPEX's LSTM (off by default)",
    )
    """Replace `nn.LSTM` with IPEX's oneDNN LSTM module."""
    auto_kernel_selection: bool | None = option(
        None,
        env="ACCEL_IPEX_AUTO_KERNEL_SELECTION",
        flag="--ipex-auto-kernel-selection",
        none_word="default",
        help="ipex: fp32 Linear: let IPEX choose oneDNN's prepacked kernel over MKL's (off by default)",
    )
    """fp32 Linear layers: oneDNN's prepacked kernels (IPEX chooses per shape) instead of MKL's."""
    graph_mode: bool | None = option(
        None,
        env="ACCEL_IPEX_GRAPH_MODE",
        flag="--ipex-graph-mode",
        none_word="default",
        help="ipex: evaluation models: run the forward as an IPEX graph (TorchScript or dynamo, IPEX's choice; "
        "off by default)",
    )
    """Evaluation-mode optimize: IPEX captures the forward as a graph (TorchScript trace, or a dynamo graph
    when tracing fails) and runs that."""
    concat_linear: bool | None = option(
        None,
        env="ACCEL_IPEX_CONCAT_LINEAR",
        flag="--ipex-concat-linear",
        none_word="default",
        help="ipex: evaluation models: concatenate Linear layers that read the same input (off by default)",
    )
    """Evaluation-mode optimize: Linear layers reading the same input are concatenated into one matmul."""

    def optimize_kwargs(self) -> dict[str, Any]:
        """`ipex.optimize`'s keyword arguments set by these options (unset ones are left to IPEX's level)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name in PASSED and getattr(self, f.name) is not None
        }


PASSED = (
    "split_master_weight_for_bf16",
    "fuse_update_step",
    "conv_bn_folding",
    "linear_bn_folding",
    "replace_dropout_with_identity",
    "optimize_lstm",
    "auto_kernel_selection",
    "graph_mode",
    "concat_linear",
)
"""The options passed to `ipex.optimize` under their own names when set."""


# ---- Accelerate's spellings: `accelerate launch --ipex` and `ipex_config: {ipex: ...}` ------------------------
OPTIMIZE_DEST = "ipex_optimize"
"""The destination of `--ipex-optimize`, which `--ipex` and a config file's `ipex_config` set too."""


class _AccelerateIpex(argparse.Action):
    """`--ipex` (Accelerate's): the ipex adapter (as `--adapter ipex`, unless another one is named, which is then
    refused naming the flag) with ipex.optimize on. With `--cpu` it runs on the CPU, as in Accelerate."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        if getattr(namespace, "adapter", None) is None:
            namespace.adapter = "ipex"
        setattr(namespace, self.dest, True)


def add_accelerate_ipex_flag(group: argparse._ArgumentGroup) -> None:
    """Accelerate's `--ipex` launch flag."""
    group.add_argument(
        "--ipex",
        action=_AccelerateIpex,
        nargs=0,
        dest="accelerate_ipex",
        default=None,
        help="Accelerate's --ipex: the ipex adapter with ipex.optimize on (--adapter ipex --ipex-optimize)",
    )


def ipex_config_settings(value: Any) -> dict[str, Any]:
    """`accel launch` settings for Accelerate's `ipex_config` mapping: `ipex: true` selects this adapter with
    ipex.optimize on (also under `use_cpu: true`); `ipex: false` turns ipex.optimize off, as Accelerate's
    `ACCELERATE_USE_IPEX=false` did (with `use_cpu: true` the built-in cpu adapter runs anyway).

    Raises:
        ValueError: not a mapping, a key other than `ipex`, or a value that is no boolean.
    """
    if value is None or value == {}:
        return {}
    if not isinstance(value, dict):
        raise ValueError("expected a mapping such as {ipex: true}")
    unknown = sorted(str(k) for k in value if k != "ipex")
    if unknown:
        raise ValueError(f"{unknown} are not ipex_config keys; Accelerate's ipex_config has only `ipex` (true/false)")
    setting = value.get("ipex")
    if setting is None:
        return {}
    if isinstance(setting, str) and setting.strip().lower() in (*TRUE_WORDS, *FALSE_WORDS):
        setting = setting.strip().lower() in TRUE_WORDS
    if not isinstance(setting, bool):
        raise ValueError(f"ipex: expected true or false, got {setting!r}")
    return {"adapter": "ipex", OPTIMIZE_DEST: True} if setting else {OPTIMIZE_DEST: False}
