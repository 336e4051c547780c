"""Start a training function on several processes from Python (a notebook, a test): `notebook_launcher`, `debug_launcher`.

Both fork real worker processes that meet in a process group, as `accel launch` does for a
script; each worker runs `function(*args)` and must create its `Accelerator` inside it.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from typing import Any

from .compat.environment import patch_environment


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_fresh(what: str) -> None:
    from .distributed.state import partial_state_exists

    if partial_state_exists():
        raise ValueError(
            f"To launch a multi-process run with {what}, the `Accelerator` (or `PartialState`) must only be created "
            "inside the launched function. Restart the notebook (or process) and create it inside the function."
        )


def _meets_its_peers(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` for one worker, which, when it returns without having formed the process group,
    forms it then: a peer that did form it (its `PartialState()` or `Accelerator()`) is waiting for
    every worker in the rendezvous, and would wait for one that finished without it until the
    timeout. Workers that formed the group, or whose function raised, are left as they are."""

    @functools.wraps(function)
    def worker(*args: Any) -> Any:
        result = function(*args)
        import torch.distributed as dist

        from .distributed.state import PartialState, partial_state_exists

        if not partial_state_exists() and not (dist.is_available() and dist.is_initialized()):
            PartialState()  # joins the rendezvous; the group is destroyed at exit
        return result

    return worker


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run `function(*args)` on `num_processes` forked processes per node (torch's elastic launcher).

    With `num_processes=1` the function runs in this process. `mixed_precision` becomes the
    workers' default (`ACCEL_MIXED_PRECISION`). The rendezvous arguments are torch elastic's.
    A worker whose function returns without having created its state joins the process group
    then, so a peer that created it never waits for that worker (e.g. one worker of a restarted
    round has nothing left to do while another trains).

    Raises:
        ValueError: `num_processes` missing, `node_rank >= num_nodes`, an unknown precision, or
            an Accelerator already created in this process (it must be created in `function`).
        RuntimeError: a worker failed (the message carries its error).
    """
    mixed_precision = str(mixed_precision).lower()
    if mixed_precision not in ("no", "fp16", "bf16", "fp8"):
        raise ValueError(
            f"Unknown mixed_precision mode: {mixed_precision}. Choose between ['no', 'fp8', 'fp16', 'bf16']."
        )
    if num_processes is None:
        raise ValueError(
            "You have to specify the number of devices you would like to use, add `num_processes=...` to your call."
        )
    if node_rank >= num_nodes:
        raise ValueError("The node_rank must be less than the number of nodes.")
    if num_processes <= 1:
        with patch_environment(accel_mixed_precision=mixed_precision):
            function(*args)
        return
    _check_fresh("notebook_launcher")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        conf["rank"] = node_rank
        rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=num_processes,
        run_id=rdzv_id,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend,
        rdzv_configs=conf,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method="fork",
        log_line_prefix_template=log_line_prefix_template,
    )
    print(f"Launching training on {num_processes} processes.")
    with patch_environment(accel_mixed_precision=mixed_precision, master_addr=master_addr, master_port=use_port):
        try:
            elastic_launch(config=config, entrypoint=_meets_its_peers(function))(*args)
        except ChildFailedError:
            raise
        except Exception as exc:
            raise RuntimeError(f"An issue was found when launching the training: {exc}") from exc


class _DebugWorker:
    def __init__(self, function: Callable[..., Any], world_size: int) -> None:
        self.function = function
        self.world_size = world_size

    def __call__(self, index: int, *args: Any) -> None:
        os.environ.update(RANK=str(index), LOCAL_RANK=str(index), LOCAL_WORLD_SIZE=str(self.world_size))
        self.function(*args)


def debug_launcher(function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2) -> None:
    """Run `function(*args)` on `num_processes` forked CPU processes (gloo), for tests and debugging.

    Raises:
        ValueError: an Accelerator already created in this process.
        torch.multiprocessing.ProcessRaisedException: a worker raised (with its traceback).
    """
    from torch.multiprocessing import start_processes

    _check_fresh("debug_launcher")
    env = {
        "world_size": num_processes,
        "master_addr": "127.0.0.1",
        "master_port": str(_free_port()),
        "accel_use_cpu": "1",
        "accel_mixed_precision": "no",
    }
    with patch_environment(**env):
        start_processes(_DebugWorker(function, num_processes), args=args, nprocs=num_processes, start_method="fork")


__all__ = ["debug_launcher", "notebook_launcher"]
