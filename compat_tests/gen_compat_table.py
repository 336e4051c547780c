"""Generate docs/accelerate_compat.md: every public name of Accelerate 1.15.0 and where accel stands.

    python compat_tests/gen_compat_table.py          # rewrite the file
    python compat_tests/gen_compat_table.py --check  # exit 1 if it is out of date

The status of each name is read from accel itself (import the counterpart module, look the
name up, instantiate an Accelerator for its members), so the table follows the code:
supported, supported differently (how: NOTES below), provided by the hardware adapter
packages, not supported (why: accel's own reason, `accel.compat.table`), or missing.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from accelerate_names import ACCELERATE_NAMES

OUT = Path(__file__).parent.parent / "docs" / "accelerate_compat.md"
HARDWARE = re.compile(
    r"cuda|nccl|hpu|gaudi|habana|xla|tpu|ipex|npu|xpu|mlu|musa|sdaa|neuron|rocm|mps|amdsmi|nvml|xccl", re.I
)
MEMBER_OWNERS = ("Accelerator", "PartialState", "AcceleratorState", "GradientState")
# Accelerate modules without an accel counterpart, and why.
NO_MODULE = {
    "accelerate.checkpointing": "checkpoint internals: use `Accelerator.save_state` / `load_state` (accel.checkpoint)",
    "accelerate.big_modeling": "big-model inference is outside accel's scope",
    "accelerate.hooks": "big-model inference hooks (offloading, device maps) are outside accel's scope",
    "accelerate.inference": "pipeline-parallel inference (PiPPy) is outside accel's scope",
}
# Names accel has with a difference worth knowing.
NOTES = {
    "select_deepspeed_plugin": "an unknown name raises KeyError before any plugin is unselected; a second model with the active plugin is refused (AssertionError) instead of getting an engine `backward` never steps",
    "device_mesh": "the same mesh as `torch_device_mesh`",
    "load_state": "`load_kwargs` takes `map_location` ('cpu', 'on_device') and `weights_only=True`; anything that would unpickle code is refused",
    "DistributedType": "members naming hardware (MULTI_GPU, XLA, ...) come from the installed adapter packages",
    "FullyShardedDataParallelPlugin": "accel's `FSDPConfig`: FSDP2 by default, FSDP1 with `fsdp_version=1` (Accelerate's default)",
    "DeepSpeedPlugin": "the DeepSpeed strategy's config (`pip install accel-base[deepspeed]`)",
    "prepare_data_loader": "same signature; `slice_fn_for_dispatch` raises NotImplementedError; extra keyword-only "
    "arguments (gradient_state, comm_device, extra_kwargs)",
    "SeedableRandomSampler": "also takes `seed=`; same permutation for the same seed and epoch",
    "get_logger": "also reads `ACCEL_LOG_LEVEL`",
    "notebook_launcher": "forks its workers (no TPU/Colab special cases)",
    "debug_launcher": "forks its workers on CPUs with gloo",
    "synchronize_rng_state": "a name other than torch/generator means the adapter's device generator",
    "synchronize_rng_states": "a name other than torch/generator means the adapter's device generator",
    "RNGType": "TORCH and GENERATOR; device generators by any other name",
    "DynamoBackend": "hardware-specific backends come from the adapters; torch.compile accepts any name",
    "FP8RecipeKwargs": "`backend` 'TE' (the default, else `ACCELERATE_FP8_BACKEND`) or 'AO' (accel's addition); "
    "each field reaches the fp8 adapter's recipe or is refused by name (`accel.errors.FP8RecipeError`); MS-AMP "
    "(`backend='msamp'`, `opt_level`) refused; no deprecation warning",
    "TERecipeKwargs": "each field reaches the fp8 adapter's recipe or is refused by name (`accel.errors."
    "FP8RecipeError`); a field left None takes `ACCELERATE_FP8_*` / `--fp8_*` / `fp8_config`, else the backend's "
    "default; building it needs no TransformerEngine",
    "AORecipeKwargs": "the adapter builds torchao's Float8LinearConfig from `pad_inner_dim` / "
    "`enable_fsdp_float8_all_gather` (on unless set off, as in Accelerate) when no `config` is given, so `.config` "
    "stays None on the handler; building it needs no torchao",
    "TorchDynamoPlugin": "`disable=True` prepares the model without compiling it (no OptimizedModule wrapper)",
    "get_gpu_info": "answered by `torch.accelerator` for any device backend; `([], 0)` without one (Accelerate "
    "fails without nvidia-smi)",
    "is_bf16_available": "the adapter in use answers; `ignore_tpu` is accepted and left to the adapter",
    "SAFE_WEIGHTS_NAME": "written by `save_model`",
    "SAFE_WEIGHTS_INDEX_NAME": "written by `save_model` when sharding",
    "SAFE_WEIGHTS_PATTERN_NAME": "`save_model`'s shards (suffix `-00001-of-00002`)",
    "SAFE_MODEL_NAME": "`save_state` writes `model.safetensors`",
    "OPTIMIZER_NAME": "`save_state` writes `optimizer.bin`",
    "SCHEDULER_NAME": "`save_state` writes `scheduler.bin`",
    "SCALER_NAME": "`save_state` writes it with a grad scaler",
    "RNG_STATE_NAME": "`save_state` writes `random_states_<rank>.pt` (Accelerate: `.pkl`)",
    "MODEL_NAME": "Accelerate's value; accel never writes `pytorch_model*` files (`safe_serialization=False` "
    "writes `model.bin`)",
    "WEIGHTS_NAME": "Accelerate's value; accel never writes it (`save_model(safe_serialization=False)` writes "
    "`model.bin`)",
    "WEIGHTS_INDEX_NAME": "Accelerate's value; accel never writes it (its index is `model.bin.index.json`)",
    "WEIGHTS_PATTERN_NAME": "Accelerate's value; accel never writes it (its shards are `model-*.bin`)",
    "SAMPLER_NAME": "Accelerate's value; accel never writes it (loader positions are in `dataloaders.json`)",
    "PROFILE_PATTERN_NAME": "Accelerate's value: `Accelerator.profile` writes `profile_<rank>.json`",
    "reduce": "`accel.utils.reduce` defaults to mean and adds max/min; `Accelerator.reduce` defaults to sum",
    "save_fsdp_model": "FSDP2 only; Accelerate's files (`pytorch_model_fsdp.bin` or `pytorch_model_fsdp_<i>/` by "
    "`state_dict_type`), which Accelerate's loader reads; what `Trainer` saves its FSDP checkpoints with",
    "load_fsdp_model": "FSDP2 only; reads Accelerate's files with restricted readers (nothing in them runs code)",
    "save_fsdp_optimizer": "FSDP2 only; Accelerate's files (`optimizer.bin` keyed by name, or `optimizer_<i>/`)",
    "load_fsdp_optimizer": "FSDP2 only; reads Accelerate's files with restricted readers (nothing in them runs code)",
    "merge_fsdp_weights": "merges a torch.distributed.checkpoint directory; accel's own checkpoints hold full weights",
    "fp8_backend": "returns 'AO', 'TE', 'MSAMP' or 'NO' (a string, not Accelerate's FP8BackendType): the backend the recipe handler or the launcher named; 'NO' when the adapter picks",
    "parallelism_config": "the ParallelismConfig given (or built from a launcher's settings): sharded sizes compose on FSDP2, replicate-only configs run as DDP",
    "torch_device_mesh": "the ParallelismConfig's named mesh, else the FSDP2 strategy's 1-D mesh, else None",
    "multi_device": "True for data-parallel runs on accelerator devices (False on CPUs, as in Accelerate)",
    "join_uneven_inputs": "DDP models join on every device (not only GPUs); other models warn and do nothing",
    "maybe_context_parallel": "with ParallelismConfig(cp_size>1) on an adapter that claims context parallelism "
    "(cuda), torch's context_parallel over the `cp` mesh dimension (in CI on emulated CUDA, the host's flash "
    "kernel in torch's ring; Accelerate's attention-mask hooks are not reproduced); refused at construction "
    "elsewhere; without cp it warns and does nothing, as in Accelerate",
    "lomo_backward": "raises NotImplementedError: LOMO optimizers are not supported",
    "deepspeed_ulysses_dl_adapter": "raises NotImplementedError: no Ulysses sequence parallelism",
    "use_seedable_sampler": "False by default as in Accelerate; mid-epoch resume is exact either way",
    "save_state": "safetensors and a manifest; mid-epoch resume is exact; ranks passing different `output_dir`s "
    "share the main process's (the checkpoint stays whole in one directory)",
    "fsdp_plugin": "accel's `FSDPConfig` (the FSDP2 settings in use) when sharding with FSDP2, else None",
    "tqdm": "needs tqdm installed",
    "DataLoaderDispatcher": "in accel.data.dispatch; re-exported",
    "GeneralTracker": "in accel.trackers; re-exported by accel.tracking",
}


def accel_module(name: str) -> str | None:
    module = "accel" + name[len("accelerate") :]
    try:
        importlib.import_module(module)
    except ImportError:
        return None
    return module


def status(owner: str, name: str, objects: dict[str, Any]) -> tuple[str, str]:
    from accel.compat.table import Unsupported, reason_for

    if owner in NO_MODULE:
        return "not supported", reason_for(name) or NO_MODULE[owner]
    target = objects.get(owner)
    value: Any = None
    found = False
    if target is not None:
        try:
            value = getattr(target, name)
            found = True
        except (AttributeError, NotImplementedError, RuntimeError):
            found = False
    if found and isinstance(value, Unsupported):
        return "not supported", reason_for(name) or ""
    if HARDWARE.search(name):
        # Present or not depending on the adapters installed: one answer for every environment.
        return "from adapters", "hardware-specific: answered by that hardware's adapter package"
    if found:
        note = NOTES.get(name, "")
        return ("supported differently" if note else "supported"), note
    reason = reason_for(name)
    if reason:
        return "not supported", reason
    return "missing", ""


def render() -> str:
    os.environ.setdefault("ACCEL_USE_CPU", "1")
    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState, PartialState

    accelerator = Accelerator()
    objects: dict[str, Any] = {
        "Accelerator": accelerator,
        "PartialState": PartialState(),
        "AcceleratorState": AcceleratorState(),
        "GradientState": GradientState(),
    }
    for owner in ACCELERATE_NAMES:
        if owner not in MEMBER_OWNERS and owner not in NO_MODULE:
            module = accel_module(owner)
            if module is not None:
                objects[owner] = importlib.import_module(module)
    rows: dict[str, list[tuple[str, str, str]]] = {}
    counts: dict[str, int] = {}
    for owner, names in ACCELERATE_NAMES.items():
        for name in names:
            state, note = status(owner, name, objects)
            rows.setdefault(owner, []).append((name, state, note))
            counts[state] = counts.get(state, 0) + 1
    total = sum(counts.values())
    lines = [
        "# Accelerate compatibility",
        "",
        "Every public name of Accelerate 1.15.0's training-loop modules and of its `Accelerator` and state",
        "objects, and where accel stands, generated from the code by `compat_tests/gen_compat_table.py`",
        "(`nox -s compat` checks it is current). Change `accelerate` to `accel` in an import and the",
        "name is found where this table says. A name marked *not supported* still imports where",
        "Accelerate has it; using it raises `NotImplementedError` saying why and what to use.",
        "",
        "To run an Accelerate script without editing it: `python -m accel.as_accelerate train.py`",
        "(or `accel launch -m accel.as_accelerate train.py`).",
        "",
        "| status | names |",
        "| --- | --- |",
        *(f"| {state} | {counts[state]} |" for state in sorted(counts)),
        f"| total | {total} |",
        "",
    ]
    lines += hf_section()
    for owner, entries in rows.items():
        where = owner if owner in MEMBER_OWNERS else f"`{owner}`"
        title = f"members of `{owner}`" if owner in MEMBER_OWNERS else where
        lines += [f"## {title}", "", "| name | status | how / why |", "| --- | --- | --- |"]
        lines += [f"| `{name}` | {state} | {note} |" for name, state, note in entries]
        lines.append("")
    return "\n".join(lines)


def hf_section() -> list[str]:
    """What transformers, peft and trl import from `accelerate`, and where each name comes from under the alias."""
    from accel.compat.borrowed import HELPER_MODULES, HELPER_NAMES
    from hf_imports import HF_IMPORTS, LIBRARIES, resolve_all

    resolved = resolve_all()
    resolved.pop("__borrowed_modules__")
    lines = [
        f"## What {', '.join(LIBRARIES)} import from `accelerate`",
        "",
        "Run with Accelerate installed (transformers' Trainer needs it), these libraries import Accelerate's",
        "internals; under `accel.as_accelerate` each resolves as listed (`compat_tests/hf_imports.py` scans",
        "their installed source, `test_hf_imports.py` imports every name). The rule, in order:",
        "",
        "1. **accel's own object** where accel has the name: state, `Accelerator`, data loaders, checkpoints,",
        "   parallelism plugins, collectives, trackers, memory helpers.",
        "2. **borrowed**: where accel has no counterpart (or only a stand-in) and Accelerate defines the name in",
        "   one of the stateless helper modules below, the real Accelerate's object. Its module is executed",
        "   under its own name with its imports going through the alias, so the state it reads is accel's;",
        "   no other module of Accelerate (`accelerate.state`, `accelerator`, `data_loader`, ...) is ever",
        "   executed, and there is one `AcceleratorState` in the process.",
        "3. otherwise accel's **stand-in**, which imports and raises `NotImplementedError` saying why when used.",
        "   Trainer's FSDP checkpoint functions (`save_fsdp_model`, `load_fsdp_model`, `save_fsdp_optimizer`,",
        "   `load_fsdp_optimizer`) are accel's own, with Accelerate's signatures and files (rule 1).",
        "",
        "`accelerate.__version__` is `1.15.0` under the alias, the API accel mirrors (peft and trl gate code",
        "paths on it). `accelerate.commands.launch.launch_command`/`launch_command_parser` (trl's CLI) run",
        "`accel launch`.",
        "",
        "Helper modules (borrowed whole):",
        "",
        *(f"- `accelerate.{m}`: {why}" for m, why in HELPER_MODULES.items()),
        *(
            f"- `accelerate.{m}`: only {', '.join(f'`{n}`' for n in sorted(names))}"
            for m, names in HELPER_NAMES.items()
        ),
        "",
        "| imported as | resolves to |",
        "| --- | --- |",
    ]
    for module, name in HF_IMPORTS:
        kind, _, origin = str(resolved[f"{module}:{name}"]).partition(": ")
        what = f"`{module}`" if not name else f"`{module}.{name}`"
        shown = origin if kind in ("stand-in", "module") else f"`{origin}`"
        lines.append(f"| {what} | {kind}: {shown} |")
    return [*lines, ""]


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python compat_tests/gen_compat_table.py")
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
