"""A script run under `accelerate launch` trains as asked: its ACCELERATE_* variables become accel's.

The variable sets are what Accelerate 1.15.0's launcher gives a worker (fixtures/accelerate).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from accel.compat import env as accelerate_env
from accel.compat.env import apply_accelerate_env, launch_defaults
from accel.compat.settings import SettingError
from accel.strategies.fsdp import FSDPConfig

FIXTURES = Path(__file__).parent / "fixtures" / "accelerate"


def fixture_env(name: str) -> dict[str, str]:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher variables in, none out: `apply_accelerate_env` writes into os.environ itself."""
    monkeypatch.setattr(accelerate_env, "_warned", False)
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("ACCEL_", "ACCELERATE_", "FSDP_", "MEGATRON_LM_")):
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_precision_dynamo_and_debug_from_accelerate_launch() -> None:
    env = fixture_env("launch_env_multi_bf16_dynamo.json")
    assert apply_accelerate_env(env) == []
    assert env["ACCEL_MIXED_PRECISION"] == "bf16"
    assert env["ACCEL_DYNAMO_BACKEND"] == "inductor"
    assert env["ACCEL_DYNAMO_MODE"] == "max-autotune"
    assert env["ACCEL_DYNAMO_USE_FULLGRAPH"] == "true"
    assert env["ACCEL_DEBUG_MODE"] == "1"
    assert "ACCEL_USE_CPU" not in env  # ACCELERATE_USE_CPU=False asks for nothing


def test_fsdp_selection_and_config_from_accelerate_launch() -> None:
    env = fixture_env("launch_env_fsdp.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_accelerate_env(env)
    assert env["ACCEL_STRATEGY"] == "fsdp2"
    assert env["ACCEL_MIXED_PRECISION"] == "fp16"
    config = FSDPConfig(**json.loads(env["ACCEL_STRATEGY_CONFIG"]))
    assert (config.cpu_offload, config.reshard_after_forward, config.state_dict_type) == (
        True,
        False,
        "SHARDED_STATE_DICT",
    )
    assert (config.auto_wrap_policy, config.min_num_params) == ("size_based_wrap", 1000)
    # cpu_ram_efficient_loading starts every rank from rank 0's weights: what sync_module_states asks for.
    assert config.cpu_ram_efficient_loading is True
    assert not any("fsdp_sync_module_states" in str(w.message) for w in caught)


def test_deepspeed_selection_and_plugin_fields() -> None:
    env = fixture_env("launch_env_deepspeed.json")
    apply_accelerate_env(env)
    assert env["ACCEL_STRATEGY"] == "deepspeed"
    assert env["ACCEL_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert json.loads(env["ACCEL_STRATEGY_CONFIG"]) == {
        "offload_optimizer_device": "cpu",
        "zero3_init_flag": False,
        "zero_stage": 2,
        "gradient_clipping": 1.0,
    }


def test_deepspeed_moe_leaves_and_accelerates_config_file_rule() -> None:
    """`ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES` becomes the plugin's `transformer_moe_cls_names`; with a
    `deepspeed_config_file`, plugin-level keys listed in `ACCELERATE_CONFIG_DS_FIELDS` (from Accelerate's config
    file) are refused with Accelerate's message, and the same keys in that file's `deepspeed_config` too."""
    from accel.compat.settings import SettingError, deepspeed_file_kwargs

    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "MixtralSparseMoeBlock"}
    apply_accelerate_env(env)
    assert json.loads(env["ACCEL_STRATEGY_CONFIG"]) == {"transformer_moe_cls_names": "MixtralSparseMoeBlock"}
    env = {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds.json",
        "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file,zero_stage,zero3_init_flag",
    }
    with pytest.raises(SettingError, match=r"ACCELERATE_CONFIG_DS_FIELDS: When using `deepspeed_config_file`, the fol"):
        apply_accelerate_env(env)
    env["ACCELERATE_CONFIG_DS_FIELDS"] = "deepspeed_config_file,zero3_init_flag"
    apply_accelerate_env(env)
    assert json.loads(env["ACCEL_STRATEGY_CONFIG"])["hf_ds_config"] == "ds.json"
    with pytest.raises(SettingError, match=r"^gradient_clipping: When using `deepspeed_config_file`"):
        deepspeed_file_kwargs({"deepspeed_config_file": "ds.json", "gradient_clipping": 1.0})
    assert deepspeed_file_kwargs({"deepspeed_config_file": "ds.json", "zero3_init_flag": True})[0] == {
        "hf_ds_config": "ds.json",
        "zero3_init_flag": True,
    }


def test_accel_variables_win_over_accelerate_ones() -> None:
    env = {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCEL_MIXED_PRECISION": "bf16"}
    apply_accelerate_env(env)
    assert env["ACCEL_MIXED_PRECISION"] == "bf16"


def test_fp8_variables_become_the_recipe_defaults() -> None:
    env = {"ACCELERATE_FP8_BACKEND": "ao", "ACCELERATE_FP8_PAD_INNER_DIM": "false", "ACCEL_FP8_MARGIN": "1"}
    env["ACCELERATE_FP8_MARGIN"] = "3"
    assert apply_accelerate_env(env) == []
    assert (env["ACCEL_FP8_BACKEND"], env["ACCEL_FP8_PAD_INNER_DIM"], env["ACCEL_FP8_MARGIN"]) == ("ao", "false", "1")


def test_unhonoured_variables_are_named_in_one_warning() -> None:
    env = {"ACCELERATE_DOWNCAST_BF16": "yes", "MEGATRON_LM_TP_DEGREE": "2", "ACCELERATE_USE_SAGEMAKER": "false"}
    with pytest.warns(UserWarning, match=r"ACCELERATE_DOWNCAST_BF16, MEGATRON_LM_TP_DEGREE\. See docs/launching") as w:
        assert apply_accelerate_env(env) == ["ACCELERATE_DOWNCAST_BF16", "MEGATRON_LM_TP_DEGREE"]
    assert len(w) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_accelerate_env(dict(env))  # once per process


def test_fsdp1_sharding_accel_cannot_do_names_the_variable() -> None:
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "HYBRID_SHARD"}
    with pytest.raises(SettingError, match=r"FSDP_SHARDING_STRATEGY: hybrid sharding"):
        apply_accelerate_env(env)


def test_launch_defaults_build_the_strategy_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in fixture_env("launch_env_fsdp.json").items():
        monkeypatch.setenv(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy, config, dynamo = launch_defaults(None, None, False, None, None)
    assert strategy is None  # the Accelerator reads ACCEL_STRATEGY itself
    assert isinstance(config, FSDPConfig) and config.cpu_offload is True
    assert dynamo is not None and dynamo.backend == "no"
    # A config the script passes wins.
    mine = FSDPConfig()
    assert launch_defaults(None, mine, False, None, None)[1] is mine


def test_script_under_accelerate_variables_trains_as_asked(tmp_path: Path) -> None:
    """The issue's case: a script started by `accelerate launch --mixed_precision bf16 --dynamo_backend ...`."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import json\nfrom accel import Accelerator\nacc = Accelerator()\n"
        "print(json.dumps([acc.mixed_precision, acc.state.dynamo_plugin.backend, acc.state.debug]))\n"
    )
    env = {**fixture_env("launch_env_multi_bf16_dynamo.json"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, check=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == ["bf16", "inductor", True]


def test_script_that_builds_only_a_partial_state_gets_the_accelerate_variables(tmp_path: Path) -> None:
    """The engine never imports accel.compat: the translation reaches `PartialState()` through the hook that
    `accel/__init__.py` registers (any `import accel.x` runs it first)."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os\nfrom accel.distributed.state import PartialState\nstate = PartialState()\n"
        "print(json.dumps([state.debug, os.environ.get('ACCEL_MIXED_PRECISION')]))\n"
    )
    env = {**fixture_env("launch_env_multi_bf16_dynamo.json"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, check=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [True, "bf16"]


@pytest.fixture
def megatron_plugin(monkeypatch: pytest.MonkeyPatch):
    """accel-megatron's real `MegatronPlugin` (its plugin module needs nothing but accel), imported from the
    repository when the package is not installed in this environment, and then registered as the config class
    of a stand-in "megatron" strategy: the core reaches it only through the strategy registry."""
    try:
        from accel_megatron.plugin import MegatronPlugin
    except ImportError:
        import importlib.util
        import types

        source = Path(__file__).parents[2] / "accel-megatron" / "src" / "accel_megatron"
        package = types.ModuleType("accel_megatron")
        package.__path__ = [str(source)]
        monkeypatch.setitem(sys.modules, "accel_megatron", package)
        spec = importlib.util.spec_from_file_location("accel_megatron.plugin", source / "plugin.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "accel_megatron.plugin", module)
        spec.loader.exec_module(module)
        MegatronPlugin = module.MegatronPlugin
        from accel.adapter import registry

        records = dict(registry.strategy_records())
        stand_in = type("MegatronStrategy", (), {"config_class": MegatronPlugin})
        records["megatron"] = registry.PluginRecord(
            name="megatron", value="accel_megatron:MegatronStrategy", distribution="accel-megatron", loaded=stand_in
        )
        monkeypatch.setattr(registry, "strategy_records", lambda: records)
    return MegatronPlugin


def test_megatron_degrees_from_accelerate_launch_become_the_plugin(megatron_plugin) -> None:
    """`accelerate launch --use_megatron_lm --megatron_lm_tp_degree 2 --megatron_lm_pp_degree 2 ...` sets
    MEGATRON_LM_* for its workers: they reach accel-megatron's options, not a warning and TP=PP=1."""
    env = {
        "ACCELERATE_USE_MEGATRON_LM": "true",
        "MEGATRON_LM_TP_DEGREE": "2",
        "MEGATRON_LM_PP_DEGREE": "2",
        "MEGATRON_LM_NUM_MICRO_BATCHES": "4",
        "MEGATRON_LM_SEQUENCE_PARALLELISM": "true",
        "MEGATRON_LM_RECOMPUTE_ACTIVATIONS": "False",
        "MEGATRON_LM_GRADIENT_CLIPPING": "1.0",
        "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER": "None",  # Accelerate writes str(None) for an unset option
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every variable honoured: no warning
        assert apply_accelerate_env(env) == []
    assert env["ACCEL_STRATEGY"] == "megatron"
    kwargs = json.loads(env["ACCEL_STRATEGY_CONFIG"])
    assert kwargs == {
        "tp_degree": 2,
        "pp_degree": 2,
        "num_micro_batches": 4,
        "sequence_parallelism": True,
        "recompute_activations": False,
        "gradient_clipping": 1.0,
    }
    from accel.compat.env import strategy_config_from_json

    plugin = strategy_config_from_json("megatron", env["ACCEL_STRATEGY_CONFIG"])
    assert isinstance(plugin, megatron_plugin) and (plugin.tp_degree, plugin.pp_degree) == (2, 2)


def test_megatron_variables_without_an_option_are_named(megatron_plugin) -> None:
    # Megatron-LM's DDP_impl: Accelerate's plugin derives it; accel-megatron has no such option.
    env = {"ACCELERATE_USE_MEGATRON_LM": "true", "MEGATRON_LM_TP_DEGREE": "2", "MEGATRON_LM_DDP_IMPL": "local"}
    with pytest.warns(UserWarning, match=r"cannot honour these `accelerate launch` settings .*MEGATRON_LM_DDP_IMPL"):
        assert apply_accelerate_env(env) == ["MEGATRON_LM_DDP_IMPL"]
    assert json.loads(env["ACCEL_STRATEGY_CONFIG"]) == {"tp_degree": 2}
    with pytest.raises(SettingError, match=r"MEGATRON_LM_PP_DEGREE: expected an integer, got 'two'"):
        apply_accelerate_env({"ACCELERATE_USE_MEGATRON_LM": "true", "MEGATRON_LM_PP_DEGREE": "two"})
