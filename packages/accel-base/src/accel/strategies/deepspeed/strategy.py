"""DeepSpeed: ZeRO stages 0-3 and offload through `deepspeed.initialize`, on any hardware DeepSpeed runs on.

Installed with `pip install accel-base[deepspeed]`. The model, optimizer and scheduler of
one `prepare` call go through `deepspeed.initialize` together; afterwards the prepared
model is the engine, `Accelerator.backward` runs the engine's backward and step (the
engine's accumulation boundary is set from `sync_gradients`), and the prepared optimizer
and scheduler are thin views whose `step()` does nothing: the engine stepped them.

The hardware comes from the adapter: DeepSpeed's accelerator is chosen by the device type
(`DS_ACCELERATOR`, set before DeepSpeed is imported when the user has not), and the
engine reuses the process group the Accelerator created, with its backend (gloo on CPU
even where DeepSpeed would prefer oneCCL).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ...checkpoint import layout
from ...errors import CheckpointError
from ..base import Strategy
from .checkpoint import ENGINE_CHECKPOINT_GLOBALS, verify_engine_checkpoint
from .config import (
    AUTO,
    AcceleratorValues,
    DeepSpeedConfigError,
    DeepSpeedPlugin,
    DummyOptim,
    DummyScheduler,
    HfDeepSpeedConfig,
    model_hidden_size,
    offloads_to_cpu_optimizer,
    resolve_config,
)
from .optim import DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper, map_pytorch_optim_to_deepspeed
from .plugins import DEFAULT_PLUGIN, EngineRecord, UnknownDeepSpeedPluginError, plugins_from_config

if TYPE_CHECKING:
    from ...distributed.distributed_type import DistributedType
    from ...prepare.context import RunContext
    from ...prepare.group import PrepareGroup
    from ...prepare.prepared import Prepared
    from ..parallelism_config import MeshFacts

__all__ = [
    "DEFAULT_PLUGIN",
    "ENGINE_CHECKPOINT_GLOBALS",
    "DeepSpeedConfigError",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",
    "DeepSpeedStrategy",
    "DummyOptim",
    "DummyScheduler",
    "EngineRecord",
    "HfDeepSpeedConfig",
    "UnknownDeepSpeedPluginError",
    "map_pytorch_optim_to_deepspeed",
    "verify_engine_checkpoint",
]

MULTIPLE_MODELS = "You can't use same `Accelerator()` instance with multiple models when using DeepSpeed"
DEVICE_PLACEMENT = "You can't customize device placements with DeepSpeed or Megatron-LM."
CHECKPOINT_TAG = "pytorch_model"


def import_deepspeed(device_type: str) -> Any:
    """Import DeepSpeed with its accelerator matching the adapter's device type.

    Raises:
        ModuleNotFoundError: DeepSpeed is not installed (the message names the pip extra).
        RuntimeError: DeepSpeed was already set up for another device type.
    """
    # DeepSpeed picks its accelerator once, at first use; tell it which before that.
    os.environ.setdefault("DS_ACCELERATOR", device_type)
    try:
        import deepspeed
    except ModuleNotFoundError as exc:
        if exc.name != "deepspeed":
            raise
        raise ModuleNotFoundError(
            "DeepSpeed is not installed => run `pip install 'accel-base[deepspeed]'` (or `pip install deepspeed`), "
            "or choose another strategy.",
            name="deepspeed",
        ) from None
    from deepspeed.accelerator import get_accelerator

    name = get_accelerator().device_name()
    if name != device_type:
        raise RuntimeError(
            f"DeepSpeed uses its {name!r} accelerator but accel runs on {device_type!r}. "
            f"Set DS_ACCELERATOR={device_type} (or leave it unset) before DeepSpeed is imported."
        )
    return deepspeed


class ZeRO3Awareness:
    """What transformers' DeepSpeed hook reads (an `HfDeepSpeedConfig` stand-in that needs no
    Accelerate): `is_zero3()` says whether models are built partitioned, `config` is the
    DeepSpeed config transformers hands to `deepspeed.zero.Init` in `from_pretrained`/`from_config`.

    transformers keeps only a weak reference: the strategy holds this object for the Accelerator's life.
    """

    def __init__(self, strategy: DeepSpeedStrategy) -> None:
        self.strategy = strategy

    def is_zero3(self) -> bool:
        return self.strategy.plugin.is_zero3_init_enabled()

    @property
    def config(self) -> dict[str, Any]:
        """Asked by transformers right before `deepspeed.zero.Init`: DeepSpeed joins the Accelerator's
        process group (and device) first, as for `zero3_init`.

        Raises:
            RuntimeError: the strategy was not built by an `Accelerator` (it knows no run yet).
        """
        run = self.strategy.run
        if run is None:
            raise RuntimeError(
                "A ZeRO-3 model is being built before an Accelerator set up the DeepSpeed strategy: create the "
                "`Accelerator` (with the DeepSpeed plugin) before the model."
            )
        self.strategy._init_distributed(run.backend)
        return self.strategy._zero_init_config(run.mixed_precision)


def register_zero3_awareness(awareness: ZeRO3Awareness) -> bool:
    """Hand `awareness` to transformers' DeepSpeed hook; False when transformers is not installed."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return False
    from transformers.integrations import deepspeed as hf_deepspeed

    hf_deepspeed.set_hf_deepspeed_config(awareness)
    return True


class DeepSpeedStrategy(Strategy):
    """Train through DeepSpeed engines. Config: a `DeepSpeedPlugin`, a config dict, a path, or several
    plugins by name (`{name: DeepSpeedPlugin}`: one engine per plugin, e.g. an RLHF actor and its frozen
    reference model; the first is active until `select_plugin` picks another)."""

    name: ClassVar[str] = "deepspeed"
    takes_save_kwargs: ClassVar[bool] = True
    reserved_save_kwargs: ClassVar[tuple[str, ...]] = ("save_dir", "tag", "save_latest")
    takes_load_kwargs: ClassVar[frozenset[str]] = frozenset(
        {
            "load_module_strict",
            "load_optimizer_states",
            "load_lr_scheduler_states",
            "load_module_only",
            "custom_load_fn",
        }
    )
    scales_loss_for_accumulation: ClassVar[bool] = False
    owns_loss_scaling: ClassVar[bool] = True
    compiles_model: ClassVar[bool] = True

    def __init__(self, config: Any = None) -> None:
        plugins, named = plugins_from_config(config)
        super().__init__(config)
        self.plugins: dict[str, DeepSpeedPlugin] = plugins
        """Every plugin by name (`DEFAULT_PLUGIN` for one given alone)."""
        self.named_plugins = named
        """Whether the plugins were given by name (`deepspeed_plugins={name: plugin}`)."""
        self._active = next(iter(plugins))
        for plugin in plugins.values():
            plugin.unselect()
        plugins[self._active].select(_from_accelerator_state=True)
        self.engines: list[EngineRecord] = []
        """Every engine built, in the order their models were prepared."""
        self._stepped: Any = None
        self._accumulation_steps: int | None = None
        self._warned_clipping = False
        self._device_type = "cpu"
        self.run: MeshFacts | None = None
        """The run's facts, from the Accelerator (`learn_run`), before anything is prepared."""
        # ZeRO-3 aware construction of transformers models (zero3_init_flag); kept alive here. It reads
        # the active plugin, so selecting another plugin switches it too.
        self.zero3_awareness = ZeRO3Awareness(self)
        if any(p.zero_stage_resolved == 3 for p in plugins.values()):
            register_zero3_awareness(self.zero3_awareness)

    # ---- plugins and engines ------------------------------------------------------------
    def learn_run(self, run: MeshFacts) -> None:
        """The Accelerator hands over the run's device, backend and precision right after building the strategy
        (transformers may build a ZeRO-3 model before `prepare`). With DeepSpeed's AutoTP
        (`tensor_parallel.autotp_size` in the config) the `tp` mesh is built here, on every process.

        Raises:
            DeepSpeedConfigError: an `autotp_size` other than the number of processes (as in Accelerate, one `tp`
                mesh spans every process).
        """
        self.run = run
        self._device_type = run.device_type
        size = self.autotp_size
        if size > 1 and run.use_distributed:
            if size != run.num_processes:
                raise DeepSpeedConfigError(
                    f"tensor_parallel.autotp_size={size} must equal the number of processes ({run.num_processes}): "
                    "as in Accelerate, DeepSpeed's AutoTP splits the model over one 'tp' mesh of every process. "
                    f"Launch {size} processes, or set autotp_size to {run.num_processes}."
                )
            from torch.distributed.device_mesh import init_device_mesh

            self.device_mesh = init_device_mesh(run.device_type, (size,), mesh_dim_names=("tp",))
            # Every process holds a slice of the same model and reads the same batches: one data shard each.
            self._own_group, _ = torch.distributed.new_subgroups(group_size=1)

    @property
    def autotp_size(self) -> int:
        """DeepSpeed AutoTP's tensor-parallel size from the active config (`tensor_parallel.autotp_size`; 0: off)."""
        size = self.plugin.deepspeed_config.get("tensor_parallel", {}).get("autotp_size", 0)
        return int(size) if size not in (None, AUTO) else 0

    def data_parallel_group(self) -> Any:
        """Under AutoTP every process reads the same batches (the `tp` mesh spans them all), as Accelerate shards
        loaders over the mesh's data-parallel part; otherwise every process is its own shard."""
        return getattr(self, "_own_group", None) if self.device_mesh is not None else None

    @property
    def plugin(self) -> DeepSpeedPlugin:
        """The active plugin: the next model `prepare` sees goes into an engine built from it."""
        return self.plugins[self._active]

    @property
    def active_plugin_name(self) -> str:
        """The active plugin's name (`DEFAULT_PLUGIN` for a plugin given alone)."""
        return self._active

    def get_plugin(self, name: str | None) -> DeepSpeedPlugin:
        """The plugin called `name` (for a plugin given alone: None or `DEFAULT_PLUGIN`).

        Raises:
            UnknownDeepSpeedPluginError: (a KeyError) no plugin by that name; the message lists the names.
        """
        key = DEFAULT_PLUGIN if name is None and not self.named_plugins else name
        if key not in self.plugins:
            given = (
                f"the names {list(self.plugins)}" if self.named_plugins else "one plugin, given as deepspeed_plugin="
            )
            raise UnknownDeepSpeedPluginError(
                f"No DeepSpeed plugin named {name!r}: this Accelerator has {given}. Pass one of those names, or give "
                "every plugin a name in `Accelerator(deepspeed_plugins={name: DeepSpeedPlugin(...), ...})`."
            )
        return self.plugins[key]

    def select_plugin(self, name: str | None) -> None:
        """Make the plugin called `name` the active one (the others are unselected).

        Raises:
            UnknownDeepSpeedPluginError: no plugin by that name (nothing changes).
        """
        chosen = self.get_plugin(name)
        for plugin in self.plugins.values():
            plugin.unselect()
        chosen.select(_from_accelerator_state=True)
        self._active = next(k for k, v in self.plugins.items() if v is chosen)

    def _record(self, model: Any) -> EngineRecord | None:
        return next((r for r in self.engines if r.engine is model), None)

    @property
    def engine(self) -> Any:
        """The engine `Accelerator.backward` runs: the first one prepared with an optimizer, else the first one
        (None before any). Accelerate uses the first engine whatever it is; with the frozen reference model
        prepared first that would step the wrong engine."""
        return self._stepped

    @property
    def ds_config(self) -> dict[str, Any] | None:
        """The resolved config of `engine` (None before any engine)."""
        record = self._record(self.engine)
        return None if record is None else record.config

    def engine_config(self, model: Any) -> dict[str, Any]:
        """The resolved config of the engine `model` (a prepared model).

        Raises:
            ValueError: `model` is not an engine this strategy built.
        """
        record = self._record(model)
        if record is None:
            raise ValueError("engine_config takes a model returned by `accelerator.prepare` under DeepSpeed.")
        return record.config

    def distributed_type(self, use_distributed: bool) -> DistributedType:
        from ...distributed.distributed_type import DistributedType

        return DistributedType.DEEPSPEED

    # ---- prepare ------------------------------------------------------------------------
    def validate_device_placement(self, device_placement: list[bool]) -> None:
        raise ValueError(DEVICE_PLACEMENT)

    def validate_prepare(self, objects: tuple[Any, ...], ctx: RunContext) -> None:
        models = [o for o in objects if isinstance(o, torch.nn.Module) and not self.is_wrapped(o)]
        if len(models) > 1:
            # Accelerate 1.15 raises AssertionError here (not ValueError); scripts catch that type.
            raise AssertionError(MULTIPLE_MODELS)
        if models and any(r.plugin_name == self._active for r in self.engines):
            # Accelerate would build a second engine from the same plugin and keep stepping the first one in
            # `backward`; accel refuses, with Accelerate's text first and then what to do.
            raise AssertionError(
                f"{MULTIPLE_MODELS}: the active DeepSpeed plugin ({self._active!r}) already has an engine. Give each "
                "further model a plugin of its own, `Accelerator(deepspeed_plugins={'actor': plugin, 'reference': "
                "other})`, and call `accelerator.state.select_deepspeed_plugin('reference')` before preparing it."
            )
        has_optimizer = any(isinstance(o, torch.optim.Optimizer) for o in objects)
        if has_optimizer and not models:
            raise ValueError(
                "With DeepSpeed, pass the model and its optimizer (and scheduler) to the same `prepare` call: "
                "they go through `deepspeed.initialize` together."
            )

    def optimizer_on_host(self) -> bool:
        """Under ZeRO-Offload a torch optimizer is replaced by DeepSpeed's CPU optimizer
        (`DeepSpeedPlugin.maps_client_optimizer`)."""
        return bool(self.plugin.maps_client_optimizer)

    def wrap_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        # The engine is built in `setup`, with the model's optimizer and scheduler.
        self._device_type = ctx.device.type
        return model

    def setup(self, group: PrepareGroup, prepared: Prepared, ctx: RunContext) -> PrepareGroup:
        """`deepspeed.initialize` on the group's model, optimizer and scheduler; the engine replaces the model.

        The optimizer and scheduler come back as views on the engine's (`step` does nothing:
        `Accelerator.backward` runs the engine's step).
        """
        model = group.model
        if model is None or self.is_wrapped(model):
            return group
        plugin = self.plugin
        client_opt = group.optimizers[0] if group.optimizers else None
        client_sched = group.schedulers[0] if group.schedulers else None
        dummy_opt = client_opt if isinstance(client_opt, DummyOptim) else None
        dummy_sched = client_sched if isinstance(client_sched, DummyScheduler) else None
        config = resolve_config(
            plugin,
            AcceleratorValues(
                micro_batch_size=_micro_batch_size(prepared, ctx.num_processes, plugin.is_train_batch_min),
                gradient_accumulation_steps=ctx.gradient_accumulation_steps,
                num_processes=ctx.num_processes,
                mixed_precision=ctx.mixed_precision,
                has_client_optimizer=client_opt is not None and dummy_opt is None,
                dummy_optimizer=dummy_opt,
                dummy_scheduler=dummy_sched,
                hidden_size=model_hidden_size(model),
                model_has_config=hasattr(model, "config"),
                split_batches=ctx.split_batches,
            ),
            adapter_defaults=ctx.adapter_defaults,
        )
        scheduler_arg = _scheduler_argument(config, client_sched, dummy_sched, dummy_opt)

        deepspeed = self._init_distributed(ctx.adapter.backend)
        leaves = plugin.moe_leaf_classes(model)
        if leaves:  # ZeRO-3 gathers each mixture-of-experts layer whole (Accelerate's `set_moe_leaf_modules`)
            from deepspeed.utils import set_z3_leaf_modules

            set_z3_leaf_modules(model, leaves)
        ds_client_optimizer = client_opt
        if client_opt is not None and dummy_opt is None and offloads_to_cpu_optimizer(config):
            # ZeRO-Offload steps on the host with DeepSpeed's CPU optimizer (Accelerate's mapping).
            ds_client_optimizer = map_pytorch_optim_to_deepspeed(client_opt)
            if type(ds_client_optimizer).__name__ == "DeepSpeedCPUAdagrad":
                # DeepSpeed's client-optimizer check knows only its CPU Adam and Lion, though it builds
                # CPU Adagrad itself for a config's Adagrad under offload: accept the mapped one.
                config["zero_force_ds_cpu_optimizer"] = False
        engine, engine_opt, _, engine_sched = deepspeed.initialize(
            model=model,
            optimizer=None if dummy_opt is not None else ds_client_optimizer,
            model_parameters=dummy_opt.params if dummy_opt else None,
            lr_scheduler=scheduler_arg,
            config=config,
            dist_init_required=False,
        )
        previous = self._record(self._stepped)
        self.engines.append(
            EngineRecord(
                engine=engine, plugin_name=self._active, plugin=plugin, config=config, trains=client_opt is not None
            )
        )
        # As in Accelerate, the plugin's `deepspeed_config` is now the engine's complete config.
        plugin.user_config.clear()
        plugin.user_config.update(copy.deepcopy(config))
        if previous is None or (client_opt is not None and not previous.trains):
            self._stepped = engine
            # `accumulate` must reach a boundary exactly when the engine `backward` steps does.
            self._accumulation_steps = int(config["gradient_accumulation_steps"])
        if previous is not None and client_opt is not None:
            logging.getLogger("accel").warning(
                "A wrapped DeepSpeed engine reference is currently tied for this `Accelerator()` instance. If you "
                "want to call `accelerator.backward()` referencing a new model/engine, please create a separate "
                "`Accelerator()` instance and call `accelerator.prepare()` on it."
            )
        self._compile_engine(engine, ctx)
        optimizers = [DeepSpeedOptimizerWrapper(engine_opt)] if client_opt is not None else []
        schedulers = [DeepSpeedSchedulerWrapper(engine_sched, engine_opt)] if client_sched is not None else []
        return group.replace(model=engine, optimizers=optimizers, schedulers=schedulers)

    def _compile_engine(self, engine: Any, ctx: RunContext) -> None:
        """Compile the engine's module once DeepSpeed has built it, as Accelerate does: `engine.compile` with
        the run's backend and settings, or each repeated block in place under regional compilation."""
        from ...prepare.wrappers import compile_kwargs, compile_regions_in_place, compile_settings

        plugin = compile_settings(ctx.adapter, ctx.dynamo_plugin)
        if plugin is None:
            return
        kwargs = compile_kwargs(plugin, default_backend=str(plugin.backend))
        if plugin.use_regional_compilation:
            compile_regions_in_place(engine.module, **kwargs)
            return
        backend = kwargs.pop("backend")
        extra = {"compiled_autograd_enabled": True} if ctx.adapter.compiled_autograd() else {}
        engine.compile(backend=backend, compile_kwargs=kwargs, **extra)

    def accumulation_steps(self) -> int | None:
        """The config's `gradient_accumulation_steps` of the engine `backward` steps, once built (it wins over
        the Accelerator's)."""
        return self._accumulation_steps

    def _init_distributed(self, backend: str) -> Any:
        deepspeed = import_deepspeed(self._device_type)
        if not torch.distributed.is_initialized():
            # One process without a launcher: DeepSpeed still needs a (world-of-one) group.
            for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
                os.environ.setdefault(key, value)
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        else:
            # Reuse the Accelerator's group and its backend: DeepSpeed's CPU accelerator would
            # otherwise ask for oneCCL wherever its bindings are installed.
            deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)
        return deepspeed

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if self.is_wrapped(model) else model  # type: ignore[return-value]

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        return any(r.engine is model for r in self.engines)

    # ---- the step -----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *, sync: bool, **kwargs: Any) -> bool:
        if self.engine is None:
            return super().backward(loss, sync=sync, **kwargs)
        self.engine.set_gradient_accumulation_boundary(sync)
        self.engine.backward(loss, **kwargs)
        # The engine steps (and zeroes) only at the boundary; between, it counts micro-steps.
        self.engine.step()
        return True

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor | None:
        if self.engine is None:
            return None
        clipping = float(self.engine.gradient_clipping())
        if float(max_norm) != clipping and not self._warned_clipping:
            # Accelerate returns the engine's norm whatever max_norm is; say once that it did not clip.
            self._warned_clipping = True
            logging.getLogger("accel").warning(
                "clip_grad_norm_(max_norm=%s) under DeepSpeed: the engine clips at gradient_clipping=%s (0 = off) "
                "inside its step, which already ran in `backward`; max_norm is not applied. Set "
                "DeepSpeedPlugin(gradient_clipping=%s) or the config's `gradient_clipping` to clip there.",
                max_norm,
                clipping,
                max_norm,
            )
        norm = self.engine.get_global_grad_norm()
        return torch.as_tensor(float("nan") if norm is None else float(norm))

    # ---- weights and checkpoints --------------------------------------------------------
    def _is_zero3(self, engine: Any) -> bool:
        return engine is not None and engine.zero_optimization_stage() == 3

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full weights on CPU: gathered from the shards under ZeRO-3 (collective: call on every rank).

        In the training dtype when `zero3_save_16bit_model` (the default); otherwise the
        fp32 master weights from the optimizer.
        """
        module = self.unwrap(model)
        if not self.is_wrapped(model):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        deepspeed = import_deepspeed(self._device_type)
        record = self._record(model)
        plugin = self.plugin if record is None else record.plugin
        if plugin.zero3_save_16bit_model is False:
            from deepspeed.utils import safe_get_full_fp32_param

            names = dict(module.named_parameters())
            state = {}
            for key, value in module.state_dict(keep_vars=True).items():
                param = names.get(key)
                full = safe_get_full_fp32_param(param) if param is not None else value
                state[key] = full.detach().cpu().clone()
            return state
        if self.device_mesh is not None and hasattr(model, "_consolidated_16bit_state_dict"):
            # AutoTP: the engine gathers the tensor-parallel slices (Accelerate's path; collective), onto the main
            # process (the others get `{}`).
            state = getattr(model, "_consolidated_16bit_state_dict")() or {}  # noqa: B009
            return {k: v.detach().cpu().clone() for k, v in state.items()}
        params = list(module.parameters()) if self._is_zero3(model) else []
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=bool(params)):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}

    def _checkpointed(self) -> list[tuple[str, Any]]:
        """(tag, engine) for each engine DeepSpeed can checkpoint, tagged as Accelerate tags them
        (`pytorch_model`, then `pytorch_model_<i>` for the i-th engine). A ZeRO-3 engine built without an
        optimizer (a frozen reference model) has no checkpoint engine in DeepSpeed: its weights never
        change, so it is left out of `save_state` and kept as built by `load_state`."""
        return [
            (CHECKPOINT_TAG if i == 0 else f"{CHECKPOINT_TAG}_{i}", r.engine)
            for i, r in enumerate(self.engines)
            if getattr(r.engine, "checkpoint_engine", None) is not None
        ]

    def save_checkpoint_state(
        self, prepared: Prepared, ctx: RunContext, directory: Path, *, writer: bool, safe_serialization: bool
    ) -> list[str] | None:
        if not self.engines:
            return None
        # The engine's own format: each rank writes its ZeRO shard next to rank 0's module states.
        tags = []
        for tag, engine in self._checkpointed():
            # The user's `save_state(**kwargs)` (e.g. exclude_frozen_parameters, client_state), as in Accelerate.
            engine.save_checkpoint(str(directory), tag=tag, save_latest=False, **ctx.save_model_kwargs)
            tags.append(tag)
        return tags

    def loads_checkpoint_models(self, prepared: Prepared) -> bool:
        return bool(self.engines)

    def load_checkpoint_state(self, prepared: Prepared, ctx: RunContext, directory: Path, *, strict: bool) -> bool:
        if not self.engines:
            return False
        engines = self._checkpointed()
        for tag, _ in engines:
            verify_engine_checkpoint(directory / tag)
        # Accelerate keeps a torch scheduler out of its engines and saves it as `scheduler.bin` (restored
        # before this): its engine checkpoints hold none, which DeepSpeed would load over the user's scheduler.
        found = layout.locate(directory)
        from_accelerate = found is not None and found.manifest.get("written_by") == "accelerate"
        engine_schedulers = not (from_accelerate and any(directory.glob("scheduler*.bin")))
        for tag, engine in engines:
            # `load_state(**kwargs)` go to the engine's load, as in Accelerate (they win over accel's choices).
            kwargs = {"load_module_strict": strict, "load_lr_scheduler_states": engine_schedulers}
            path, _ = engine.load_checkpoint(str(directory), tag=tag, **{**kwargs, **ctx.load_model_kwargs})
            if path is None:
                raise CheckpointError(f"DeepSpeed could not load the checkpoint in {directory / tag}.")
        return True

    # ---- building large models ----------------------------------------------------------
    def zero3_init(self, accelerator: Any, enabled: bool = True) -> contextlib.AbstractContextManager[Any]:
        """A context in which models are built already sharded over the processes (ZeRO-3 only).

        `with accelerator.strategy.zero3_init(accelerator): model = Net()`; then prepare it as usual.

        Raises:
            ValueError: the configured ZeRO stage is not 3.
        """
        stage = self.plugin.zero_stage_resolved
        if stage != 3:
            raise ValueError(f"zero3_init needs ZeRO stage 3; this DeepSpeedPlugin resolves to stage {stage}.")
        self._device_type = accelerator.device.type
        deepspeed = self._init_distributed(accelerator.adapter.backend)
        config = self._zero_init_config(accelerator.mixed_precision)
        return deepspeed.zero.Init(config_dict_or_path=config, enabled=enabled)  # type: ignore[no-any-return]

    def _zero_init_config(self, mixed_precision: str) -> dict[str, Any]:
        """The config `deepspeed.zero.Init` partitions with: stage 3, the run's 16-bit dtype, parameter offload."""
        config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
        if mixed_precision in ("bf16", "fp16"):
            config[mixed_precision] = {"enabled": True}
        offload = self.plugin.offload_param_device
        if offload is None:
            offload = self.plugin.user_config.get("zero_optimization", {}).get("offload_param", {}).get("device")
        if offload not in (None, "none", "auto"):
            config["zero_optimization"]["offload_param"] = {"device": offload}
        return config


def _micro_batch_size(prepared: Prepared, num_processes: int, smallest: bool = True) -> int | None:
    """Per-process batch size of the prepared data loaders: the smallest (`is_train_batch_min`, Accelerate's
    default) or the largest when there are several (train and eval)."""
    sizes = [int(t) // num_processes for t in (getattr(d, "total_batch_size", None) for d in prepared.dataloaders) if t]
    if not sizes:
        return None
    return min(sizes) if smallest else max(sizes)


def _scheduler_argument(
    config: dict[str, Any], client: Any, dummy: DummyScheduler | None, dummy_opt: DummyOptim | None = None
) -> Any:
    if dummy_opt is not None and client is not None and dummy is None:
        # Accelerate's rule and text: a torch scheduler cannot drive the optimizer DeepSpeed builds.
        raise DeepSpeedConfigError("You can only specify `DummyScheduler` in the code when using `DummyOptim`.")
    if client is not None and dummy is None and "scheduler" in config:
        raise DeepSpeedConfigError(
            "You cannot specify a scheduler in the config file and in the code at the same time. "
            "Please remove the scheduler from the config file or create `DummyScheduler` in the code."
        )
    if dummy is None:
        return client
    if "scheduler" in config:
        return None
    if dummy.lr_scheduler_callable is None:
        raise DeepSpeedConfigError(
            "Either specify a scheduler in the config file or pass in the `lr_scheduler_callable` parameter "
            "when using `DummyScheduler`."
        )
    return dummy.lr_scheduler_callable


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
