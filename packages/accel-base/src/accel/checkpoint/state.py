"""`save_state` / `load_state`: checkpoints that are verified, never half-written, and never half-loaded.

- Files: see `accel.checkpoint.io` (safetensors weights, weights-only torch files, a SHA-256
  per file recorded in the manifest and checked on load).
- Layout and replacement: see `accel.checkpoint.layout` (a save replaces only the files accel
  wrote; a kill at any instant leaves the old or the new checkpoint loadable).
- Every rank agrees at each phase: a save or load that fails on one rank raises the same
  `CheckpointError` on all of them instead of leaving the others waiting in a collective.
  A failed save removes its staging directory; a failed load changes none of the live
  objects, because everything is read and checked before anything is applied
  (`accel.checkpoint.validate`), what can be restored from a snapshot is applied next, and
  the models, which cannot, last.
"""

from __future__ import annotations

import collections
import copy
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..distributed.tree import send_to_device
from ..errors import CheckpointError
from ..prepare.wrappers import strip_compile
from . import accelerate_layout, background, layout
from .io import (
    MappedWeights,
    SharedHashing,
    check_shared,
    hash_file,
    load_safetensors,
    load_torch,
    parse_size,
    save_json,
    save_safetensors,
    save_torch,
    write_model_files,
    write_weights,
)
from .layout import MANIFEST, OLD_SUFFIX, TMP_SUFFIX, file_name, is_complete
from .lock import CheckpointLocks
from .rotation import checkpoint_number, list_checkpoints, prune
from .validate import read_and_check, warn_if_unverified

if TYPE_CHECKING:
    from ..prepare.prepared import Prepared, RunContext

__all__ = [
    "MANIFEST",
    "OLD_SUFFIX",
    "TMP_SUFFIX",
    "checkpoint_number",
    "is_complete",
    "list_checkpoints",
    "load_safetensors",
    "load_state",
    "load_torch",
    "parse_size",
    "prune",
    "run_on_every_rank",
    "save_safetensors",
    "save_state",
    "save_torch",
    "write_model_files",
]


# ---- agreement between ranks ----------------------------------------------------------------
def _agree(ctx: RunContext, error: Exception | None, payload: Any = None) -> list[tuple[str | None, Any]]:
    """Every rank's (error message or None, payload), on every rank."""
    mine = (None if error is None else f"{type(error).__name__}: {error}", payload)
    if not ctx.use_distributed:
        return [mine]
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.num_processes
    dist.all_gather_object(out, mine)
    return out


def _first_round(
    ctx: RunContext, directory: Path, error: Exception | None, payload: Any = None
) -> tuple[Path, list[tuple[str | None, Any]], list[int]]:
    """One collective: every rank's path, error and payload. Returns this rank's shared directory, for
    every rank its (error message or None, payload) as `_agree` does, and every rank's local index.

    Accelerate lets every rank pass its own `output_dir` (a per-rank temporary directory, say). accel keeps a
    checkpoint whole in one directory (one manifest, one atomic commit), so ranks that disagree all use their
    writer's path: the main process's, or with `save_on_each_node` their node's local main process's. Ranks
    that agree (the usual case) keep their own path unchanged. A writer's directory is always its own path,
    so it may lock and open it before this round.
    """
    mine = None if error is None else f"{type(error).__name__}: {error}"
    if not ctx.use_distributed:
        return directory, [(mine, payload)], [ctx.local_process_index]
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.num_processes
    dist.all_gather_object(out, (str(directory), ctx.local_process_index, mine, payload))
    results = [(msg, load) for _, _, msg, load in out]
    local_indexes = [local for _, local, _, _ in out]
    if len({path for path, *_ in out}) == 1:
        return directory, results, local_indexes
    return Path(out[_owner(ctx, local_indexes, ctx.process_index)][0]), results, local_indexes


def _owner(ctx: RunContext, local_indexes: list[int], rank: int) -> int:
    """The rank that writes `rank`'s checkpoint: rank 0, or with `save_on_each_node` its node's local main
    (ranks are numbered node by node: the nearest local main at or below it)."""
    return _node(local_indexes, rank)[0] if ctx.save_on_each_node else 0


def _node(local_indexes: list[int], rank: int) -> list[int]:
    """The ranks on `rank`'s node (ranks are numbered node by node, each node's from local index 0)."""
    start = max(r for r in range(rank + 1) if local_indexes[r] == 0)
    end = next((r for r in range(start + 1, len(local_indexes)) if local_indexes[r] == 0), len(local_indexes))
    return list(range(start, end))


def _check_nodes(results: list[tuple[str | None, Any]], local_indexes: list[int]) -> dict[int, CheckpointError]:
    """The ranks of every node whose shared hashing (`check_shared`) failed, each with its node's error."""
    failed: dict[int, CheckpointError] = {}
    for start in (r for r, local in enumerate(local_indexes) if local == 0):
        ranks = _node(local_indexes, start)
        error = check_shared([results[r][1] for r in ranks]) if len(ranks) > 1 else None
        if error is not None:
            failed.update(dict.fromkeys(ranks, error))
    return failed


def _raise_if_failed(results: list[tuple[str | None, Any]], error: Exception | None, what: str) -> None:
    if error is not None:
        if isinstance(error, CheckpointError):
            raise error
        raise CheckpointError(f"{what} failed: {type(error).__name__}: {error}") from error
    failed = [(rank, msg) for rank, (msg, _) in enumerate(results) if msg is not None]
    if failed:
        rank, msg = failed[0]
        raise CheckpointError(f"{what} failed on rank {rank}: {msg}")


def _attempt(fn: Callable[[], Any]) -> tuple[Any, Exception | None]:
    try:
        return fn(), None
    except Exception as exc:  # reported to every rank by _agree, re-raised there
        return None, exc


# ---- save --------------------------------------------------------------------------------
def save_state(
    prepared: Prepared,
    ctx: RunContext,
    output_dir: str | os.PathLike[str],
    *,
    step: int = 0,
    safe_serialization: bool = True,
    async_save: bool = False,
    after_commit: Callable[[], Any] | None = None,
) -> Path:
    """Write every prepared object's state to `output_dir`. Runs on all ranks.

    Files in `output_dir` that accel did not write are kept; the previous checkpoint there is
    replaced only once the new one is complete. Ranks may pass different `output_dir`s (as
    Accelerate allows); the checkpoint is then written whole to the main process's (with
    `save_on_each_node`, each node's local main process's) directory, and `load_state` with the
    same per-rank paths reads it from there.

    `async_save`: return once every state is copied to host memory; the writing rank writes, hashes
    and commits the files on a background thread (`accel.checkpoint.background`). `after_commit`
    runs on the writing rank once the checkpoint is committed (pruning older ones).

    Raises:
        CheckpointError: `output_dir` is a file, a write failed on any rank (disk full, read-only),
            or a new file would overwrite one accel did not write; or the previous asynchronous save
            failed (naming it). The previous checkpoint and the user's files are intact, and no
            staging directory is left behind.
    """
    own = Path(output_dir)
    writer = _writes(ctx)
    # Only the writer locks (the other ranks follow it through the rounds, so no rank waits for
    # another's lock): the save lock for the whole save, the files lock while files change. A writer's
    # directory is its own `output_dir`, so it begins before the first round.
    locks = CheckpointLocks(own, f"save_state({own})") if writer else None
    from ..strategies.base import Strategy

    # A strategy that writes no files of its own (DDP, one process): every rank's share (its random
    # states) travels in the first round and the writer writes everything; one round more for the
    # outcome of a synchronous save, none for an asynchronous one. A strategy writing its own files
    # (sharded ones) writes them into the staging directory, so it waits for the first round, and its
    # shares are agreed on in a second one.
    default = type(ctx.strategy).save_checkpoint_state is Strategy.save_checkpoint_state
    began = sealed = handed_over = False
    staging = own / layout.STAGING
    try:
        error: Exception | None = background.finish() if writer else None
        if locks is not None and error is None:
            _, error = _attempt(lambda: _begin(locks, own))
            began = error is None
        snapshot: dict[str, Any] | None = None
        written: dict[str, str] = {}
        if default:
            # Hooks and gathers run on every rank whatever the writer found: the ranks stay in step. A
            # synchronous writer then writes its own files (its directory is its own path), before the round.
            snapshot, failure = _attempt(
                lambda: _snapshot(prepared, ctx, staging, writer, safe_serialization, async_save or not writer)
            )
            error = error or failure
            if writer and not async_save and error is None and snapshot is not None:
                jobs = snapshot["jobs"]
                written, error = _attempt(lambda: _write_jobs(staging, jobs))
                snapshot["jobs"] = [job for job in jobs if job[0] not in (written or {})]
                snapshot["names"] = [name for name, _, _ in jobs if not name.startswith("random_states_")]
        share = None if writer or snapshot is None else snapshot["jobs"]
        final, results, local_indexes = _first_round(ctx, own, error, share)
        staging = final / layout.STAGING
        what = f"save_state({final})"
        if any(msg is not None for msg, _ in results) and began:
            _remove(staging)
        _raise_if_failed(results, error, what)

        if default:
            assert snapshot is not None
            mine = f"random_states_{ctx.process_index}.pt"
            # This writer's checkpoint holds the random states of every rank it writes for.
            later = list(snapshot["jobs"])
            later += [
                job
                for rank, (_, jobs) in enumerate(results)
                if rank != ctx.process_index and _owner(ctx, local_indexes, rank) == ctx.process_index
                for job in jobs
                if job[0].startswith("random_states_") and job[0] != mine
            ]
            names = snapshot.get("names") or [name for name, _, _ in later if not name.startswith("random_states_")]
            shares = [{"files": names, "custom": [], "hashes": dict(written or {})}]
            at = 0
        else:
            snapshot, error = _attempt(
                lambda: _snapshot(prepared, ctx, staging, writer, safe_serialization, async_save)
            )
            later = []
            if snapshot is not None and async_save and writer:
                # The writer's own files are written in the background; its random states, like every other
                # rank's, now (they are tiny, and every rank's must be on disk before the writer seals).
                jobs = snapshot["jobs"]
                later = [job for job in jobs if not job[0].startswith("random_states_")]
                snapshot["jobs"] = [job for job in jobs if job[0].startswith("random_states_")]
                snapshot["later"] = [name for name, _, _ in later]
            share_written, error = (None, error) if error else _attempt(lambda: _write_share(staging, snapshot))
            results = _agree(ctx, error, share_written)
            if any(msg is not None for msg, _ in results) and writer:
                _remove(staging)
            _raise_if_failed(results, error, what)
            shares, at = [payload for _, payload in results], ctx.process_index

        error = None
        if locks is not None:
            if async_save:
                background.start(
                    what, lambda: _finish_save(ctx, locks, staging, final, shares, at, later, step, after_commit)
                )
                handed_over = True
                return final
            sealed = True  # from here on `_finish_save` removes what it staged if it fails before sealing
            _, error = _attempt(lambda: _finish_save(ctx, locks, staging, final, shares, at, later, step, None))
        if async_save:
            return final  # the other ranks are done: the writer reports its outcome at the next save or load
        _raise_if_failed(_agree(ctx, error), error, what)
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C (or SystemExit) on the writer: remove what this save staged, then let it through as it is.
        if began and not sealed and not handed_over:
            _remove(staging)
        raise
    finally:
        if locks is not None and not handed_over:
            locks.release()
    if after_commit is not None and writer:
        after_commit()
    return final


def _finish_save(
    ctx: RunContext,
    locks: CheckpointLocks,
    staging: Path,
    final: Path,
    shares: list[dict[str, Any]],
    at: int,
    later: list[tuple[str, str, Any]],
    step: int,
    after_commit: Callable[[], Any] | None,
) -> None:
    """On the writer: write `later`'s files, seal the manifest and commit; releases the locks.

    A failure before sealing removes the staging directory; once sealed, the staged checkpoint is
    complete and loadable, and a failure from there on is finished by the next save (layout.recover).
    """
    sealed = False
    try:
        hashes = _write_jobs(staging, later)
        shares[at]["hashes"].update(hashes)
        manifest = _manifest(ctx, staging, shares, step)
        locks.change_files()
        layout.seal(staging, final, manifest)
        sealed = True
        layout.commit(staging, final)
    except BaseException:
        if not sealed:
            _remove(staging)
        raise
    finally:
        locks.release()
    if after_commit is not None:
        after_commit()


def _writes(ctx: RunContext) -> bool:
    """Whether this rank writes (and so locks) the checkpoint directory."""
    return ctx.is_main_process or (ctx.save_on_each_node and ctx.is_local_main_process)


def _begin(locks: CheckpointLocks, final: Path) -> None:
    layout.make_directory(final)
    locks.for_save()
    locks.change_files()
    try:
        layout.begin(final)
    finally:
        locks.done_changing()


def _snapshot(
    prepared: Prepared, ctx: RunContext, staging: Path, writer: bool, safe: bool, copy_off: bool
) -> dict[str, Any]:
    """What this rank writes: each file's name, how it is written and the state it holds.

    `copy_off`: every state is copied to host memory, so that training may change the live objects
    while the files are written."""
    for hook in prepared.save_state_pre_hooks.values():
        hook(prepared.models, [], str(staging))
    # A sharding strategy writes models and optimizers its own way (None: the default files).
    custom = ctx.strategy.save_checkpoint_state(prepared, ctx, staging, writer=writer, safe_serialization=safe)
    # Gathers (collectives) first, on every rank; then writes, on the writer only, so that a
    # failed write cannot leave the other ranks waiting in a gather.
    models = [] if custom is not None else [ctx.strategy.full_state_dict(strip_compile(m)) for m in prepared.models]
    to_host = ctx.adapter.checkpoint_on_host

    def host(obj: Any) -> Any:  # (a copy off the device is made below, for all of them)
        return send_to_device(obj, torch.device("cpu")) if to_host and not copy_off else obj

    # Each state is taken when its file is written (`_Later`), in the order the files are written,
    # unless `copy_off` takes them all now.
    def on_host(obj: Any) -> _Later:
        return _Later(lambda: host(obj.state_dict()))

    jobs: list[tuple[str, str, Any]] = []
    if writer:
        for i, sd in enumerate(models):
            jobs.append(
                (file_name("model", i, "safetensors" if safe else "bin"), "safetensors" if safe else "weights", sd)
            )
        optimizers = prepared.optimizers if custom is None else []
        jobs += [(file_name("optimizer", i, "bin"), "torch", on_host(opt)) for i, opt in enumerate(optimizers)]
        jobs += [
            (file_name("scheduler", i, "bin"), "torch", _Later(sched.state_dict))
            for i, sched in enumerate(prepared.schedulers)
        ]
        if prepared.scaler is not None:
            jobs.append(("scaler.pt", "torch", _Later(prepared.scaler.state_dict)))
        loaders = prepared.dataloaders
        jobs.append(("dataloaders.json", "json", _Later(lambda: [dl.state_dict() for dl in loaders])))
        jobs += [(f"custom_checkpoint_{i}.bin", "torch", on_host(obj)) for i, obj in enumerate(prepared.custom_objects)]
    # Every rank's RNG: dropout and every other consumer must continue exactly per rank.
    jobs.append((f"random_states_{ctx.process_index}.pt", "torch", _Later(ctx.adapter.get_rng_state)))
    if copy_off:
        jobs = [(name, how, _copied(_taken(state))) for name, how, state in jobs]
    return {"custom": list(custom or []), "jobs": jobs, "writer": writer}


class _Later:
    """A state taken only when its file is written."""

    def __init__(self, take: Callable[[], Any]) -> None:
        self.take = take


def _taken(state: Any) -> Any:
    return state.take() if isinstance(state, _Later) else state


def _copied(state: Any) -> Any:
    """`state` with every tensor copied to host memory and every container and value copied."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        items = [(k, _copied(v)) for k, v in state.items()]
        return collections.OrderedDict(items) if isinstance(state, collections.OrderedDict) else dict(items)
    if type(state) in (list, tuple):
        return type(state)(_copied(v) for v in state)
    return copy.deepcopy(state)


_WRITERS: dict[str, Callable[[Any, Path], str]] = {
    "safetensors": lambda state, path: write_weights(state, path, True),
    "weights": lambda state, path: write_weights(state, path, False),
    "torch": lambda state, path: save_torch(state, path, zip_crc=False),  # the manifest's digests cover them
    "json": save_json,
}


def _write_jobs(staging: Path, jobs: list[tuple[str, str, Any]]) -> dict[str, str]:
    return {name: _WRITERS[how](_taken(state), staging / name) for name, how, state in jobs}


def _write_share(staging: Path, snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """Write this rank's files now; returns the names this rank contributes and the digests written."""
    assert snapshot is not None
    custom: list[str] = snapshot["custom"]
    hashes = _write_jobs(staging, snapshot["jobs"])
    files = list(custom)
    if snapshot["writer"]:
        # Every file the writer writes, those the background writes too, in the order they are written.
        files += [n for n in (*hashes, *snapshot.get("later", ())) if n not in files and not n.startswith("random_")]
    return {"files": files, "custom": custom, "hashes": hashes}


def _manifest(ctx: RunContext, staging: Path, shares: list[dict[str, Any]], step: int) -> dict[str, Any]:
    hashes: dict[str, str] = {}
    files: list[str] = []
    custom: list[str] = []
    for share in shares:
        hashes.update(share["hashes"])
        files += [n for n in share["files"] if n not in files]
        custom += [n for n in share["custom"] if n not in custom]
    # Files a strategy wrote itself (sharded checkpoints: one per rank) are hashed here, once
    # every rank has finished writing them.
    for name in custom:
        hashes.update(_hash_tree(staging, name))
    return layout.new_manifest(
        files,
        [f"random_states_{r}.pt" for r in range(ctx.num_processes)],
        hashes,
        num_processes=ctx.num_processes,
        step=step,
        strategy_files=custom,
    )


def _hash_tree(root: Path, name: str) -> dict[str, str]:
    target = root / name
    if target.is_file():
        return {name: hash_file(target)}
    return {path.relative_to(root).as_posix(): hash_file(path) for path in sorted(target.rglob("*")) if path.is_file()}


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# ---- load --------------------------------------------------------------------------------
def load_state(
    prepared: Prepared, ctx: RunContext, input_dir: str | os.PathLike[str], *, strict: bool = True
) -> dict[str, Any]:
    """Restore what `save_state` wrote into the prepared objects. Returns the manifest.

    Everything is read, verified against the recorded hashes and checked against the live
    objects before anything is applied, on every rank. A checkpoint without recorded hashes
    loads unverified, with one `UserWarning` saying so.

    Raises:
        CheckpointError: no complete checkpoint at `input_dir`, or any file is missing, damaged,
            changed since saving or does not fit the prepared objects (naming the file). The
            live model, optimizer and every other prepared object are then unchanged.
        UnsafeCheckpointError: a file would execute code to load.
    """
    from ..strategies.base import Strategy

    # Where the strategy copies a full state dict into the model, the weights are read in place from the
    # page cache under read leases, which end once the models are loaded (or the load fails).
    mapped: list[MappedWeights] | None = (
        [] if type(ctx.strategy).load_full_state_dict is Strategy.load_full_state_dict else None
    )
    try:
        return _load_state(prepared, ctx, Path(input_dir), strict, mapped)
    finally:
        for lease in mapped or []:
            lease.release()


def _load_state(
    prepared: Prepared, ctx: RunContext, own: Path, strict: bool, mapped: list[MappedWeights] | None
) -> dict[str, Any]:
    from ..strategies.base import Strategy

    # The rank that writes the directory holds its files lock (shared) until every rank has read
    # everything, so that no save moves a file meanwhile; the other ranks follow it through the rounds.
    # Two rounds where the strategy loads nothing itself (three where it does): the first for the
    # directory and the lock, the second once every rank has read, checked and applied what can be undone.
    locks = CheckpointLocks(own, f"load_state({own})") if _writes(ctx) else None
    undo: list[tuple[Any, Any]] = []
    try:
        # An asynchronous save still writing finishes first (its failure is this load's, on every rank).
        error: Exception | None = background.finish() if locks is not None else None
        if locks is not None and error is None:
            _, error = _attempt(lambda: _open_for_reading(locks, own))
        directory, results, local_indexes = _first_round(ctx, own, error)
        what = f"load_state({directory})"
        _raise_if_failed(results, error, what)
        node = _node(local_indexes, ctx.process_index)
        share = SharedHashing(node.index(ctx.process_index), len(node)) if len(node) > 1 else None

        def read_check_apply() -> tuple[layout.Located, dict[str, Any]]:
            found = _locate(directory, ctx, prepared)
            for hook in prepared.load_state_pre_hooks.values():
                hook(prepared.models, str(directory))
            custom = list(found.manifest.get("strategy_files", []))
            if ctx.is_main_process:
                warn_if_unverified(found)
            plan = read_and_check(prepared, ctx, found, strict, custom, mapped, share)
            # Everything that can be undone first; then a strategy's models and optimizers (it checks them
            # before it changes anything); the default models last, once every rank has got this far.
            applied, failure = _apply_undoable(ctx, plan)
            undo.extend(applied)
            if failure is not None:
                raise failure
            return found, plan

        done, error = _attempt(read_check_apply)
        results = _agree(ctx, error, share.hashed if share is not None else None)
        if share is not None and not any(msg is not None for msg, _ in results):
            # Every process has hashed its part of the files its node reads: each process puts every node's
            # parts together, so that all of them reach the same verdict.
            for rank, late in _check_nodes(results, local_indexes).items():
                results[rank] = (f"{type(late).__name__}: {late}", None)
                if rank == ctx.process_index:
                    error = late
        if any(msg is not None for msg, _ in results):
            _undo(ctx, undo)
        _raise_if_failed(results, error, what)
        found, plan = done
        handled = False
        if type(ctx.strategy).load_checkpoint_state is not Strategy.load_checkpoint_state:
            handled, error = _attempt(
                lambda: ctx.strategy.load_checkpoint_state(prepared, ctx, found.directory, strict=strict)
            )
            # Every rank has read its files once this returns: the lock can go.
            results = _agree(ctx, error)
    finally:
        if locks is not None:
            locks.release()
    if error is not None or any(msg is not None for msg, _ in results):
        _undo(ctx, undo)
        if error is None or isinstance(error, CheckpointError):
            _raise_if_failed(results, error, what)
        raise CheckpointError(
            f"{what} failed in the {type(ctx.strategy).__name__} strategy's loader ({type(error).__name__}: {error}). "
            "The schedulers, data loaders, registered objects and random states were restored; the models and "
            "optimizers are as that strategy's loader left them."
        ) from error
    if not handled and ctx.strategy.loads_checkpoint_models(prepared):
        _undo(ctx, undo)
        raise CheckpointError(
            f"{what}: the {type(ctx.strategy).__name__} strategy said it loads the models and optimizers itself but "
            "its loader loaded none (a loader that may decline must say so in loads_checkpoint_models). The schedulers, "
            "data loaders, registered objects and random states were restored."
        )
    if not handled:
        for model, sd in plan["models"]:
            ctx.strategy.load_full_state_dict(strip_compile(model), sd, strict=strict)
        for lease in mapped or []:
            lease.check_unchanged(applied=True)
    return dict(found.manifest)


def _open_for_reading(locks: CheckpointLocks, directory: Path) -> None:
    """Take the files lock shared, finishing first a commit a crash interrupted (exclusively, moving only
    accel's own files), so that every reader, a strategy's included, finds the checkpoint in one directory."""
    locks.for_reading()
    if layout.interrupted(directory):
        locks.done_changing()
        locks.change_files()
        try:
            if layout.interrupted(directory):
                layout.recover(directory)
        finally:
            locks.done_changing()
        locks.for_reading()


def run_on_every_rank(ctx: RunContext, fn: Callable[[], Any], what: str) -> Any:
    """`fn()` on every rank; if it raised on any, the same `CheckpointError` on all of them.

    For the read-and-check phase of a strategy's loader: no rank goes on to a collective that
    applies a checkpoint another rank found unusable.
    """
    result, error = _attempt(fn)
    _raise_if_failed(_agree(ctx, error), error, what)
    return result


def _locate(directory: Path, ctx: RunContext, prepared: Prepared) -> layout.Located:
    found = layout.locate(directory)
    if found is not None:
        return found
    if not directory.is_dir():
        raise CheckpointError(f"No checkpoint at {directory}: the directory does not exist.")
    if accelerate_layout.is_accelerate_checkpoint(directory):
        epochs = [getattr(dl, "epoch", 0) for dl in prepared.dataloaders]
        return accelerate_layout.locate(
            directory, ctx.process_index, ctx.device, announce=ctx.is_main_process, loader_epochs=epochs
        )
    raise CheckpointError(
        f"{directory} is not a complete accel checkpoint ({MANIFEST} is missing): it was never finished "
        "or is not an accel checkpoint. Load an earlier checkpoint."
    )


def _apply_undoable(ctx: RunContext, plan: dict[str, Any]) -> tuple[list[tuple[Any, Any]], Exception | None]:
    """Apply the optimizers, schedulers, scaler, loaders, registered objects and RNG of a checked plan.

    Returns what restores each one (for `_undo`) and the error that stopped it, a
    `CheckpointError` naming the file; on an error, what was applied is already restored.
    """
    undo: list[tuple[Any, Any]] = [(None, ctx.adapter.get_rng_state())]
    steps = [(opt, state, path, "optimizer") for opt, state, path in plan["optimizers"]] + plan["objects"]
    if plan["rng"] is not None:
        steps.append((None, *plan["rng"], "random number generators"))
    step: tuple[Any, Any, Path, str] | None = None
    try:
        for step in steps:
            obj, state, _, what = step
            if obj is None:
                ctx.adapter.set_rng_state(state)
                continue
            # An optimizer's state_dict references its tensors, and loading replaces them rather
            # than writing into them: its snapshot needs no copy.
            undo.append((obj, obj.state_dict() if what == "optimizer" else copy.deepcopy(obj.state_dict())))
            obj.load_state_dict(state)
    except Exception as exc:
        _undo(ctx, undo)
        assert step is not None
        error = CheckpointError(
            f"Checkpoint file {step[2]} could not be loaded into the {step[3]} ({type(exc).__name__}: {exc}). "
            "Nothing was loaded: the optimizers, schedulers, data loaders, registered objects and random states "
            "were restored to their state before the call, and the models were not changed."
        )
        error.__cause__ = exc
        return [], error
    return undo, None


def _undo(ctx: RunContext, undo: list[tuple[Any, Any]]) -> None:
    """Restore every snapshot, newest first; one that cannot be restored does not stop the others."""
    failed: list[str] = []
    for obj, before in reversed(undo):
        try:
            if obj is None:
                ctx.adapter.set_rng_state(before)
            else:
                obj.load_state_dict(before)
        except Exception as exc:
            failed.append(f"{type(obj).__name__ if obj is not None else 'random states'} ({type(exc).__name__}: {exc})")
    if failed:
        warnings.warn(
            f"load_state could not restore {', '.join(failed)} to its state before the failed load.",
            UserWarning,
            stacklevel=2,
        )
