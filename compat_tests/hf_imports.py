"""What transformers, peft and trl import from `accelerate`, and how each name resolves under the alias.

`HF_IMPORTS` is the list (module, name) found in their installed source, every `from accelerate... import`
and `import accelerate...` (inside functions too) plus `accelerate.<attribute>` reads; `scan()` recomputes
it and test_hf_imports.py checks the two agree. `resolve_all()` runs under `accel.as_accelerate` (in a
fresh interpreter) and says where each name came from; gen_compat_table.py puts that in
docs/accelerate_compat.md.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

LIBRARIES = ("transformers", "peft", "trl")

# (module, name or "" for the module itself), as scan() finds them in transformers 5.24.0, peft 0.21.2, trl 1.16.0.
HF_IMPORTS: tuple[tuple[str, str], ...] = (
    ("accelerate", ""),
    ("accelerate", "Accelerator"),
    ("accelerate", "FullyShardedDataParallelPlugin"),
    ("accelerate", "ParallelismConfig"),
    ("accelerate", "PartialState"),
    ("accelerate", "__version__"),
    ("accelerate", "cpu_offload_with_hook"),
    ("accelerate", "dispatch_model"),
    ("accelerate", "infer_auto_device_map"),
    ("accelerate", "init_empty_weights"),
    ("accelerate", "skip_first_batches"),
    ("accelerate.big_modeling", ""),
    ("accelerate.big_modeling", "check_device_map"),
    ("accelerate.commands.config", "default_config_file"),
    ("accelerate.commands.config", "load_config_from_file"),
    ("accelerate.commands.launch", "launch_command"),
    ("accelerate.commands.launch", "launch_command_parser"),
    ("accelerate.hooks", ""),
    ("accelerate.hooks", "AlignDevicesHook"),
    ("accelerate.hooks", "add_hook_to_module"),
    ("accelerate.hooks", "remove_hook_from_module"),
    ("accelerate.hooks", "remove_hook_from_submodules"),
    ("accelerate.logging", "get_logger"),
    ("accelerate.parallelism_config", "ParallelismConfig"),
    ("accelerate.state", "AcceleratorState"),
    ("accelerate.state", "PartialState"),
    ("accelerate.utils", "DataLoaderConfiguration"),
    ("accelerate.utils", "DeepSpeedPlugin"),
    ("accelerate.utils", "DeepSpeedSchedulerWrapper"),
    ("accelerate.utils", "DistributedDataParallelKwargs"),
    ("accelerate.utils", "DistributedType"),
    ("accelerate.utils", "DummyOptim"),
    ("accelerate.utils", "DummyScheduler"),
    ("accelerate.utils", "FullyShardedDataParallelPlugin"),
    ("accelerate.utils", "GradientAccumulationPlugin"),
    ("accelerate.utils", "TorchDynamoPlugin"),
    ("accelerate.utils", "broadcast_object_list"),
    ("accelerate.utils", "extract_model_from_parallel"),
    ("accelerate.utils", "find_executable_batch_size"),
    ("accelerate.utils", "gather"),
    ("accelerate.utils", "gather_object"),
    ("accelerate.utils", "get_balanced_memory"),
    ("accelerate.utils", "get_max_memory"),
    ("accelerate.utils", "infer_auto_device_map"),
    ("accelerate.utils", "is_mlu_available"),
    ("accelerate.utils", "is_npu_available"),
    ("accelerate.utils", "is_peft_model"),
    ("accelerate.utils", "is_wandb_available"),
    ("accelerate.utils", "is_xpu_available"),
    ("accelerate.utils", "load_fsdp_model"),
    ("accelerate.utils", "load_fsdp_optimizer"),
    ("accelerate.utils", "named_module_tensors"),
    ("accelerate.utils", "offload_state_dict"),
    ("accelerate.utils", "reduce"),
    ("accelerate.utils", "release_memory"),
    ("accelerate.utils", "save_fsdp_model"),
    ("accelerate.utils", "save_fsdp_optimizer"),
    ("accelerate.utils", "set_seed"),
    ("accelerate.utils", "tqdm"),
    ("accelerate.utils.constants", "FSDP_AUTO_WRAP_POLICY"),
    ("accelerate.utils.constants", "FSDP_SHARDING_STRATEGY"),
    ("accelerate.utils.dataclasses", "get_module_class_from_name"),
    ("accelerate.utils.deepspeed", "HfDeepSpeedConfig"),
    ("accelerate.utils.fsdp_utils", "get_parameters_from_modules"),
    ("accelerate.utils.imports", "is_bf16_available"),
    ("accelerate.utils.imports", "is_fp8_available"),
    ("accelerate.utils.imports", "is_xpu_available"),
    ("accelerate.utils.memory", "clear_device_cache"),
    ("accelerate.utils.memory", "release_memory"),
    ("accelerate.utils.memory", "should_reduce_batch_size"),
    ("accelerate.utils.modeling", "clean_device_map"),
    ("accelerate.utils.modeling", "get_max_layer_size"),
    ("accelerate.utils.versions", "is_torch_version"),
)


def _visit(tree: ast.AST, found: set[tuple[str, str]]) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "accelerate" or node.module.startswith("accelerate."):
                found.update((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            found.update((a.name, "") for a in node.names if a.name.split(".")[0] == "accelerate")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "accelerate":
            # `accelerate.__version__`, `accelerate.hooks`: an attribute of the package itself.
            found.add(("accelerate", node.attr) if node.attr.startswith("__") else (f"accelerate.{node.attr}", ""))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner = node.value
            if isinstance(inner.value, ast.Name) and inner.value.id == "accelerate":
                found.add((f"accelerate.{inner.attr}", node.attr))


def scan() -> tuple[tuple[str, str], ...]:
    """(module, name) for every `accelerate` import and attribute read in the installed libraries' source."""
    found: set[tuple[str, str]] = set()
    for library in LIBRARIES:
        spec = importlib.util.find_spec(library)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"{library} is not installed")
        for path in Path(next(iter(spec.submodule_search_locations))).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "accelerate" in text:  # parsing only these keeps the scan to a second or two
                _visit(ast.parse(text), found)
    return tuple(sorted(found))


_RESOLVE = r"""
import importlib, json, sys
from accel.as_accelerate import install
install()
from accel.compat import borrowed
from accel.compat.table import Unsupported
out = {}
for module, name in json.loads(sys.argv[1]):
    try:
        view = importlib.import_module(module)
        value = getattr(view, name) if name else view
    except Exception as exc:
        out[f"{module}:{name}"] = f"error: {type(exc).__name__}: {exc}"
        continue
    target = getattr(view, "_target", view)  # the accel module behind an alias view
    if not name:
        out[f"{module}:"] = f"module: alias of {target.__name__}"
        continue
    if name == "__version__":
        out[f"{module}:{name}"] = f"value: {value}"
        continue
    try:
        own = getattr(target, name)
    except AttributeError:
        own = None
    if isinstance(value, Unsupported):
        out[f"{module}:{name}"] = "stand-in: raises NotImplementedError when used"
    elif own is value or (getattr(value, "__module__", None) or "").startswith("accel."):
        out[f"{module}:{name}"] = f"accel: {getattr(value, '__module__', None) or target.__name__}"
    else:
        out[f"{module}:{name}"] = f"borrowed: {'.'.join(borrowed.home_of(module, name))}"
out["__borrowed_modules__"] = borrowed.borrowed_modules()
print(json.dumps(out))
"""


def resolve_all(names: tuple[tuple[str, str], ...] = HF_IMPORTS) -> dict[str, object]:
    """Import each name under the alias in a fresh interpreter: `"module:name" -> "<kind>: <origin module>"`,
    kind one of accel / borrowed / stand-in / value / error; plus `__borrowed_modules__`."""
    proc = subprocess.run(
        [sys.executable, "-c", _RESOLVE, json.dumps(names)], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])
