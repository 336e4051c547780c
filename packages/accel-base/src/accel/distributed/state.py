"""Process-wide state, shared by every instance the way Accelerate users expect.

`PartialState` holds the process group, ranks and device; `AcceleratorState` adds the
precision, the adapter and the strategy; `GradientState` tracks accumulation and the end
of data loaders. Each instance of a class shares one `__dict__` (the Borg pattern), so
`PartialState()` anywhere returns the same view. `_reset_state()` starts over (tests).
"""

from __future__ import annotations

import atexit
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, MappingView
from collections.abc import Set as AbstractSet
from datetime import timedelta
from functools import wraps
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ..adapter.base import Adapter
from ..adapter.registry import select_adapter
from ..errors import DistributedSetupError
from ..precision.base import Precision
from ..settings.env import EnvSettings
from ..settings.kwargs import InitProcessGroupKwargs
from ..settings.launch import LaunchInfo, mark_ready
from .debug import check_collective
from .distributed_type import DistributedType
from .edge import build_env, member_miss, missing_member, register_edge
from .gradient_state import GradientState
from .watchdog import install as install_watchdog
from .watchdog import uninstall as uninstall_watchdog
from .watchdog import watched

__all__ = [
    "AcceleratorState",
    "GradientState",
    "PartialState",
    "is_initialized",
    "member_miss",
    "missing_member",
    "partial_state_exists",
    "register_edge",
]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TIMEOUT = timedelta(minutes=30)


EXIT_DRAIN_SECONDS = 0.05
"""How long a process that started a group releases the GIL at exit for collective work to be freed."""


_exit_hook_registered = False


def _register_exit_hook() -> None:
    """Run `PartialState._destroy_at_exit` once at interpreter exit, whoever started the group
    (accel, or a framework such as DeepSpeed that `PartialState` adopted)."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        _exit_hook_registered = True
        atexit.register(PartialState._destroy_at_exit)


def _reset_message(cls_name: str, name: str) -> str:
    """Accelerate's message for a state attribute read after `_reset_state()` (same text, same type)."""
    return (
        f"`{cls_name}` object has no attribute `{name}`. This happens if `{cls_name}._reset_state()` was called and "
        "an `Accelerator` or `PartialState` was not reinitialized."
    )


def is_initialized() -> bool:
    """Whether the `AcceleratorState` has been set up (by an `Accelerator`); `AcceleratorState.initialized` as a
    module function, as in Accelerate."""
    return bool(AcceleratorState._shared_state.get("_initialized", False))


def partial_state_exists() -> bool:
    """Whether this process has a `PartialState` (set up, or begun: a failed setup leaves what it set), without
    building one as `PartialState()` would."""
    return bool(PartialState._shared_state)


class PartialState:
    """The process group, this process's ranks and its device.

    Args:
        cpu: force the built-in cpu adapter.
        adapter: name of the adapter to use (else `ACCEL_ADAPTER`, else auto-selection).
        emulate: run the adapter's code on the CPU with gloo (else `ACCEL_EMULATE`).
        init_kwargs: an `InitProcessGroupKwargs` (backend, timeout).
        env: the environment as `accel.settings.env.read_env` parsed it (the `Accelerator` passes the one it
            read); None: read now, after the edge's `before_state` hooks.

    Under a launcher that sets a world size above one the process group is always
    started; if it cannot be, `DistributedSetupError` says why. It never falls back to
    running each rank alone.
    """

    _shared_state: dict[str, Any] = {}
    # Attributes every initialised state has: reading one after `_reset_state()` gets Accelerate's explanation.
    _known_attrs: list[str] = [
        "_cpu",
        "_mixed_precision",
        "_shared_state",
        "backend",
        "debug",
        "device",
        "distributed_type",
        "fork_launched",
        "local_process_index",
        "num_processes",
        "process_index",
        "adapter",
        "launch",
        "emulate",
        "timeout",
        "owns_process_group",
    ]

    def __init__(
        self,
        cpu: bool = False,
        *,
        adapter: str | None = None,
        emulate: bool | None = None,
        init_kwargs: InitProcessGroupKwargs | None = None,
        adapter_options: Mapping[str, Any] | None = None,
        env: EnvSettings | None = None,
        **kwargs: Any,
    ) -> None:
        self.__dict__ = self._shared_state
        if self.initialized:
            return
        env = env or build_env()
        init_kwargs = init_kwargs or kwargs.pop("init_process_group_kwargs", None) or InitProcessGroupKwargs()
        emulate = env.emulate if emulate is None else emulate
        # The script's `cpu=` / `adapter=` win over the launcher's ACCEL_USE_CPU / ACCEL_ADAPTER.
        requested = "cpu" if cpu else (adapter or ("cpu" if env.use_cpu else env.adapter))
        adapter_cls = select_adapter(requested, emulate=emulate)
        launch = env.launch
        self.launch: LaunchInfo = launch
        self._cpu = cpu
        # Set by `notebook_launcher`'s forked workers (as in Accelerate): the launcher owns the process group.
        self.fork_launched = env.fork_launched
        self.adapter: Adapter = adapter_cls(emulate=emulate, options=adapter_options)
        self.emulate = emulate
        self.num_processes = launch.world_size
        self.process_index = launch.rank
        self.local_process_index = launch.local_rank
        self.device = self.adapter.device_for(launch.local_rank)
        self.backend = init_kwargs.backend or self.adapter.backend
        self.timeout = init_kwargs.timeout or env.timeout or DEFAULT_TIMEOUT
        self.debug = env.debug
        self.adapter.set_device(self.device)
        self.distributed_type = self.adapter.data_parallel_type(False)
        self.owns_process_group = False
        if launch.distributed or dist.is_initialized():
            self._init_process_group(launch, init_kwargs)
            self.adapter.after_process_group()
            self.distributed_type = self.adapter.data_parallel_type(True)
            if self.num_processes > 1:
                install_watchdog(warn_after=env.collective_warn_seconds, timeout=self.timeout.total_seconds())
        _register_exit_hook()
        self._initialized = True
        mark_ready(launch.local_rank)  # `accel launch`'s progress line: this worker is up

    def _init_process_group(self, launch: LaunchInfo, init_kwargs: InitProcessGroupKwargs) -> None:
        if dist.is_initialized():
            # The user (or a framework) started the group: adopt it.
            self.num_processes = dist.get_world_size()
            self.process_index = dist.get_rank()
            return
        if not dist.is_available():
            raise DistributedSetupError(
                f"The launcher asked for {launch.world_size} processes but this torch build has no torch.distributed."
            )
        self.adapter.before_process_group(self.device)
        options = self.adapter.process_group_options(self.device)
        try:
            if init_kwargs.init_method:
                dist.init_process_group(
                    self.backend,
                    init_method=init_kwargs.init_method,
                    rank=launch.rank,
                    world_size=launch.world_size,
                    timeout=self.timeout,
                    **options,
                )
            else:
                dist.init_process_group(
                    self.backend,
                    store=self._make_store(launch),
                    rank=launch.rank,
                    world_size=launch.world_size,
                    timeout=self.timeout,
                    **options,
                )
        except Exception as exc:
            raise DistributedSetupError(
                f"Could not start the {self.backend!r} process group for rank {launch.rank} of "
                f"{launch.world_size} (store {launch.master_addr}:{launch.master_port}, launcher "
                f"{launch.launcher}): {exc}. Check MASTER_ADDR/MASTER_PORT and that every rank was started."
            ) from exc
        self.owns_process_group = True

    def _make_store(self, launch: LaunchInfo) -> dist.Store:
        # Store keys are scoped to the elastic restart round: a group re-formed after
        # torchrun restarts its workers must not read the dead round's gloo addresses
        # (they cause "Gloo connectFullMesh failed ... Connection refused").
        is_server = (not launch.use_agent_store) and launch.rank == 0
        store = dist.TCPStore(
            launch.master_addr,
            launch.master_port,
            launch.world_size,
            is_master=is_server,
            timeout=self.timeout,
            wait_for_workers=False,
        )
        return dist.PrefixStore(f"accel/restart_{launch.restart_count}", store)

    @property
    def initialized(self) -> bool:
        return self._shared_state.get("_initialized", False)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes that are not set: explain the ones `_reset_state()` removed.
        if name in type(self)._known_attrs:
            raise AttributeError(_reset_message("PartialState", name))
        raise missing_member("PartialState", name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A state is one per process (Borg): unpickled in a process whose state is set up, it is that live state
        # (so `pickle.loads(pickle.dumps(s)).__dict__ == s.__dict__`, as Accelerate's tests check); elsewhere it
        # keeps the pickled values.
        _restore_shared(self, state)

    def set_device(self) -> None:
        """Set `self.device` for this process (its adapter's device for the local rank) when it is not set yet."""
        if self.__dict__.get("device") is not None:
            return
        self.device = self.adapter.device_for(self.local_process_index)
        self.adapter.set_device(self.device)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type.value}  Backend: {self.backend}\n"
            f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\nDevice: {self.device}\n"
            f"Adapter: {self.adapter.describe()}\n"
        )

    @staticmethod
    def _reset_state() -> None:
        """Forget everything (tests only). Does not destroy the process group."""
        PartialState._shared_state.clear()

    # ---- ranks -------------------------------------------------------------------------
    @property
    def use_distributed(self) -> bool:
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        return self.device

    @watched("wait_for_everyone")
    def wait_for_everyone(self) -> None:
        """Barrier across all processes (a no-op with one process); checked first in debug mode (`accel.distributed.debug`)."""
        if self.use_distributed:
            if self.debug:
                check_collective(
                    "wait_for_everyone", [], timeout_s=self.timeout.total_seconds(), device_type=self.device.type
                )
            self.adapter.barrier()

    @staticmethod
    def _destroy_at_exit() -> None:
        # A gloo group left to interpreter teardown can abort the process ("terminate called
        # without an active exception") once its peer has exited: seen in 4 of 20 restarted
        # elastic rounds here, turning a finished run into a failed one.
        if PartialState._shared_state.get("owns_process_group") and dist.is_initialized():
            dist.destroy_process_group()
        # A collective's `wait()` returns as soon as its work is marked done, but the backend's
        # worker thread still holds the work (and its tensors) for a moment. When the script has
        # dropped those tensors, that thread must take the GIL to free them; if the interpreter
        # is already finalizing, CPython ends the thread with pthread_exit, which unwinds through
        # a noexcept C++ destructor and aborts the process (core dump: ~AsyncAllgatherWork ->
        # decref_pyobject -> take_gil -> pthread_exit -> std::terminate). Releasing the GIL here,
        # while the interpreter still runs threads, lets that free finish: a script ending in a
        # `gather` aborted in 5 of 14 two-rank launches without this, 0 of 58 with it. It runs in
        # every process that built a state (a group DeepSpeed started, or one the script already
        # destroyed, leaves the same work behind); 50 ms once, at exit.
        time.sleep(EXIT_DRAIN_SECONDS)

    def destroy_process_group(self, group: Any = None) -> None:
        """Tear down `group`, or (default) the process group this state started.

        As in Accelerate, nothing happens for the default group in processes that `notebook_launcher` forked
        (`fork_launched`): the launcher owns that group.
        """
        if group is not None:
            dist.destroy_process_group(group)
            return
        if self.fork_launched:
            return
        if self.owns_process_group and dist.is_initialized():
            uninstall_watchdog()
            dist.destroy_process_group()
            self.owns_process_group = False

    # ---- helpers on processes ----------------------------------------------------------
    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Give each process its contiguous share of a list, tuple, tensor, or dict of those.

        The first `len % num_processes` processes get one item more (with fewer items than
        processes, the last processes get none). With `apply_padding` every share is filled up
        to the longest share's length by repeating the input's last item (a tensor's last row),
        so every process holds the same count, ready for `gather`; drop the repeats afterwards.
        As in Accelerate, padded tensors come back on this process's device. Dict values
        must all have the same length; they are split alike into a new dict (the input is not
        modified). A `datasets.Dataset` gets `select(indices)`; other objects are yielded
        unchanged.

        Raises:
            ValueError: dict values of different lengths.
            TypeError: a set, a dict view, a generator or another iterator (or a dict holding one): it has no
                order to split by (the message says to pass a list), with one process as with several.
        """
        _check_splittable(inputs)
        if self.num_processes == 1:
            yield inputs
            return
        yield _split(inputs, self.num_processes, self.process_index, apply_padding, self.device)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first; the others run it after it finishes."""
        yield from self._goes_first(self.is_main_process)

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """The local main process of each node runs the block first."""
        yield from self._goes_first(self.is_local_main_process)

    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    def on_main_process(self, function: F) -> F:
        """Decorator: run `function` on the main process only (others get None)."""
        return self._run_if(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run `function` on each node's local main process only."""
        return self._run_if(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run `function` on the last process only."""
        return self._run_if(lambda: self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run `function` on the process with `process_index` only."""
        if function is None:
            return lambda f: self.on_process(f, process_index=process_index)
        return self._run_if(lambda: self.process_index == process_index, function)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> Any:
        """Decorator: run `function` on the process with `local_process_index` only."""
        if function is None:
            return lambda f: self.on_local_process(f, local_process_index=local_process_index)
        return self._run_if(lambda: self.local_process_index == local_process_index, function)

    @staticmethod
    def _run_if(condition: Callable[[], bool], function: F) -> F:
        @wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if condition() else None

        return wrapper  # type: ignore[return-value]

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print`, on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)


def _restore_shared(obj: Any, state: dict[str, Any]) -> None:
    shared = type(obj)._shared_state
    if shared.get("_initialized", False):
        obj.__dict__ = shared
    else:
        obj.__dict__.update(state)


def _check_splittable(inputs: Any) -> None:
    values = inputs.values() if isinstance(inputs, dict) else (inputs,)
    for value in values:
        if isinstance(value, (AbstractSet, MappingView, Iterator)) or not hasattr(value, "__len__"):
            raise TypeError(
                f"split_between_processes cannot split a `{type(value).__name__}`: it has no length and order to "
                "share by position, so every process would get all of it. Pass a list (for example `sorted(items)` or `list(items)`), a tuple, a tensor, "
                "a dict of those, or a datasets.Dataset."
            )


def _split(inputs: Any, n: int, index: int, apply_padding: bool, device: torch.device) -> Any:
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError(
                "All values in the dictionary must have the same length: `split_between_processes` gives each "
                f"process the same slice of every value (lengths found: {sorted(lengths)})."
            )
        length = lengths.pop() if lengths else 0
    else:
        length = len(inputs)
    per, extra = divmod(length, n)
    start = index * per + min(index, extra)
    end = start + per + (1 if index < extra else 0)
    # Every share padded to the longest one, computed here rather than gathered: each rank knows the split.
    width = per + (1 if extra else 0) if apply_padding else None
    return _share(inputs, start, end, width, device)


def _share(value: Any, start: int, end: int, width: int | None, device: torch.device) -> Any:
    """`value[start:end]`, then (when `width` is given) its input's last item repeated up to `width` items."""
    if isinstance(value, dict):
        return {k: _share(v, start, end, width, device) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        share = value[start:end]
        if width is None:
            return share
        share = share.to(device)
        if share.shape[0] < width:
            last = value[-1:].to(device).expand(width - share.shape[0], *value.shape[1:])
            share = torch.cat([share, last])
        return share
    if isinstance(value, (list, tuple)):
        items = list(value[start:end])
        if width is not None and len(items) < width:
            items += [value[-1]] * (width - len(items))
        return items if isinstance(value, list) else tuple(items)  # as slicing returns them
    if type(value).__module__.split(".")[0] == "datasets" and hasattr(value, "select"):
        # A Hugging Face `datasets.Dataset`, matched by module so that `datasets` is never imported here.
        indices = list(range(min(start, len(value)), min(end, len(value))))
        if width is not None:
            indices += [len(value) - 1] * (width - len(indices))
        return value.select(indices)
    return value


class AcceleratorState:
    """`PartialState` plus the precision, the strategy and the compile settings.

    Attributes of the partial state are reachable through this one (`num_processes`,
    `device`, ...). `mixed_precision` and `strategy` default to `env`'s (`ACCEL_MIXED_PRECISION`,
    `ACCEL_STRATEGY`); `env` is read now when not given.
    """

    _shared_state: dict[str, Any] = {}
    _strategy: Any
    """The Accelerator's strategy (`attach_strategy`), for `deepspeed_plugin` / `fsdp_plugin`."""
    _torch_tp_plugin: Any
    """The deprecated `torch_tp_plugin` the Accelerator was given (`attach_strategy`), for `torch_tp_plugin`."""
    _known_attrs: list[str] = [
        *PartialState._known_attrs,
        "deepspeed_plugin",
        "fsdp_plugin",
        "megatron_lm_plugin",
        "dynamo_plugin",
        "mixed_precision",
        "strategy_name",
        "_partial",
    ]

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        *,
        adapter: str | None = None,
        emulate: bool | None = None,
        strategy: str | None = None,
        init_kwargs: InitProcessGroupKwargs | None = None,
        dynamo_plugin: Any = None,
        adapter_options: Mapping[str, Any] | None = None,
        env: EnvSettings | None = None,
        _from_accelerator: bool = False,
    ) -> None:
        self.__dict__ = self._shared_state
        if self.initialized:
            if mixed_precision is not None and _from_accelerator and mixed_precision != self.mixed_precision:
                raise ValueError(
                    f"AcceleratorState was already set up with mixed_precision={self.mixed_precision!r}; "
                    f"cannot change it to {mixed_precision!r}. Call `AcceleratorState._reset_state(True)` first "
                    "(tests) or create one Accelerator per process."
                )
            return
        env = env or build_env()
        self._partial = PartialState(
            cpu, adapter=adapter, emulate=emulate, init_kwargs=init_kwargs, adapter_options=adapter_options, env=env
        )
        self._mixed_precision: str = Precision.resolve(mixed_precision or env.mixed_precision, self._partial.adapter)
        chosen = self._partial.adapter
        name = strategy or env.strategy or chosen.default_strategy()
        self.strategy_name = chosen.strategy_aliases.get(name, name)
        self.dynamo_plugin = dynamo_plugin
        # The distributed type of a strategy comes from the strategy itself (`Strategy.distributed_type`,
        # set by the Accelerator): the core keeps no list of strategy names.
        self._initialized = True

    @property
    def initialized(self) -> bool:
        return self._shared_state.get("_initialized", False)

    @property
    def adapter(self) -> Adapter:
        """The partial state's adapter. A property, not `__getattr__`'s forwarding, because every
        training step reads it (`Accelerator.backward`)."""
        return self._partial.adapter  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set here: forward to the partial state. A miss there names this class
        # (Accelerate's message), or says why accel lacks an Accelerate member (`compat_table.UNSUPPORTED_MEMBERS`).
        if not name.startswith("__") and "_partial" in self.__dict__:
            try:
                return getattr(self.__dict__["_partial"], name)
            except AttributeError:
                if name in PartialState._known_attrs:
                    raise  # the partial state was reset: its explanation
                raise missing_member("AcceleratorState", name) from None
        if name in type(self)._known_attrs:
            raise AttributeError(_reset_message("AcceleratorState", name))
        raise missing_member("AcceleratorState", name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # See `PartialState.__setstate__`.
        _restore_shared(self, state)

    @property
    def partial(self) -> PartialState:
        """The process's `PartialState` (ranks, device, process group) this state is built on."""
        return self._partial  # type: ignore[no-any-return]

    def attach_strategy(self, strategy: Any, *, distributed_type: DistributedType, torch_tp_plugin: Any) -> None:
        """Record the Accelerator's strategy (for `deepspeed_plugin`, `fsdp_plugin`, `parallelism_config`,
        `device_mesh`), the distributed type it runs as, and the deprecated `torch_tp_plugin` it was given."""
        self._partial.distributed_type = distributed_type
        self._strategy = strategy
        self._torch_tp_plugin = torch_tp_plugin

    @property
    def mixed_precision(self) -> str:
        """The mixed precision in use: "no", "bf16", "fp16" or "fp8"."""
        return self._mixed_precision  # type: ignore[no-any-return]

    def _check_initialized(self, mixed_precision: str | None = None, cpu: bool | None = None) -> None:
        """Raise ValueError (Accelerate's message) if a set-up state is asked for another device or precision."""
        if not self.initialized:
            return
        err = (
            "AcceleratorState has already been initialized and cannot be changed, restart your runtime completely "
            "and pass `{flag}` to `Accelerator()`."
        )
        if cpu and self.device.type != "cpu":
            raise ValueError(err.format(flag="cpu=True"))
        if mixed_precision is not None and mixed_precision != self._mixed_precision:
            raise ValueError(err.format(flag=f"mixed_precision='{mixed_precision}'"))

    # Accelerate defines these on AcceleratorState itself; each is the process's `PartialState()`'s
    # (usable after `_reset_state()`, as there).
    @property
    def fork_launched(self) -> bool:
        """Whether this process was forked by `notebook_launcher` (see `PartialState.fork_launched`)."""
        return bool(PartialState().fork_launched)

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process trains together."""
        return bool(PartialState().use_distributed)

    @property
    def is_main_process(self) -> bool:
        """Whether this is the global main process."""
        return bool(PartialState().is_main_process)

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its node."""
        return bool(PartialState().is_local_main_process)

    @property
    def is_last_process(self) -> bool:
        """Whether this is the last process."""
        return bool(PartialState().is_last_process)

    def wait_for_everyone(self) -> None:
        """Barrier across all processes (`PartialState.wait_for_everyone`)."""
        PartialState().wait_for_everyone()

    def destroy_process_group(self, group: Any = None) -> None:
        """`PartialState.destroy_process_group`."""
        PartialState().destroy_process_group(group)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print`, on the local main process only."""
        PartialState().print(*args, **kwargs)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """`PartialState.split_between_processes`."""
        with PartialState().split_between_processes(inputs, apply_padding=apply_padding) as share:
            yield share

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first."""
        with PartialState().main_process_first():
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Each node's local main process runs the block first."""
        with PartialState().local_main_process_first():
            yield

    @property
    def _shards_with_fsdp(self) -> bool:
        """Whether models are sharded by the FSDP strategy (FSDP2, or FSDP1 with `fsdp_version=1`); False for
        tensor parallelism alone, which runs on that strategy without sharding (Accelerate: no FSDP plugin)."""
        return (
            str(self.__dict__.get("strategy_name", "")) == "fsdp2"
            and getattr(self, "distributed_type", None) == DistributedType.FSDP
        )

    @property
    def is_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2 (`fully_shard`): False under FSDP1 (`fsdp_version=1`) and for
        tensor parallelism alone."""
        config = getattr(self.__dict__.get("_strategy"), "config", None)
        return self._shards_with_fsdp and getattr(config, "fsdp_version", 2) == 2

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP settings in use (accel's `FSDPConfig`, Accelerate's `FullyShardedDataParallelPlugin` converted)
        when the `Accelerator` shards with FSDP (either version); else None."""
        return getattr(self.__dict__.get("_strategy"), "config", None) if self._shards_with_fsdp else None

    @property
    def deepspeed_plugin(self) -> Any:
        """The active DeepSpeed plugin (strategy "deepspeed"): the first of `deepspeed_plugins` until
        `select_deepspeed_plugin` picks another; None without DeepSpeed, as in Accelerate."""
        strategy = self._deepspeed_strategy()
        return None if strategy is None else strategy.plugin

    def _deepspeed_strategy(self) -> Any:
        if str(self.__dict__.get("strategy_name", "")) != "deepspeed":
            return None
        return self.__dict__.get("_strategy")

    # ---- parallelism and DeepSpeed plugins, read from the Accelerator's strategy ---------------
    @property
    def parallelism_config(self) -> Any:
        """The Accelerator's `ParallelismConfig` (`Accelerator.parallelism_config`), else None."""
        return getattr(self.__dict__.get("_strategy"), "parallelism", None)

    @property
    def device_mesh(self) -> Any:
        """The Accelerator's device mesh (`Accelerator.torch_device_mesh`: the ParallelismConfig's named mesh, else
        the FSDP2 strategy's 1-D mesh), else None."""
        return getattr(self.__dict__.get("_strategy"), "device_mesh", None)

    @property
    def torch_tp_plugin(self) -> Any:
        """The deprecated `TorchTensorParallelPlugin` given to the Accelerator (run as `ParallelismConfig(tp_size=)`),
        else None."""
        return self.__dict__.get("_torch_tp_plugin")

    @property
    def deepspeed_plugins(self) -> Any:
        """The DeepSpeed plugins as given to the Accelerator when it uses DeepSpeed, else None: the
        `{name: plugin}` dict of `deepspeed_plugins=`, the plugin itself for `deepspeed_plugin=plugin` (as in
        Accelerate)."""
        strategy = self._deepspeed_strategy()
        if strategy is None:
            return None
        return dict(strategy.plugins) if strategy.named_plugins else strategy.plugin

    def _require_deepspeed(self) -> Any:
        strategy = self._deepspeed_strategy()
        if strategy is None:
            raise ValueError(
                "DeepSpeed is not enabled, please make sure that an `Accelerator` is configured for `deepspeed` "
                "before calling this function."
            )
        return strategy

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed plugin named `name` in `Accelerator(deepspeed_plugins={name: plugin, ...})` (a plugin
        given alone answers to "default").

        Raises:
            ValueError: the Accelerator does not use DeepSpeed (Accelerate's message).
            KeyError: no plugin by that name (`UnknownDeepSpeedPluginError`; the message lists the names).
        """
        return self._require_deepspeed().get_plugin(name)

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Activate the DeepSpeed plugin `name` and unselect the others: the next model passed to `prepare` is
        built into its own engine from it (e.g. the frozen reference model after the actor).

        Raises:
            ValueError: the Accelerator does not use DeepSpeed (Accelerate's message).
            KeyError: no plugin by that name (`UnknownDeepSpeedPluginError`); the selection is unchanged.
        """
        self._require_deepspeed().select_plugin(name)

    def __repr__(self) -> str:
        return repr(self._partial) + f"Mixed precision type: {self.mixed_precision}\nStrategy: {self.strategy_name}\n"

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the accelerator state (tests); also the partial state when asked."""
        AcceleratorState._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()
