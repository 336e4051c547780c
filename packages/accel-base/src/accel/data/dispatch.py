"""`dispatch_batches`: rank 0 reads every batch and each rank receives its slice.

For data only one process can read (a stream, a remote source, an iterable dataset that
cannot be sharded), as in Accelerate's `DataLoaderDispatcher`:

- Rank 0 iterates the user's loader (its own batch size, sampler, collate and workers).
  With `split_batches` one batch is one step; otherwise `num_processes` batches are
  concatenated so that every rank still gets a batch of the loader's size.
- The step's batch is broadcast and every rank keeps slice r of it.
- The last batch of an epoch may not divide by the number of processes: with
  `even_batches` rank 0 completes it with the epoch's first samples so the slices are equal
  and `remainder` is the number of real samples (what `gather_for_metrics` keeps); without
  it, the slices differ in size by at most one and nothing is added.
- Resuming skips batches on rank 0 without sending them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from ..distributed import ops
from .shard import DataLoaderShard


@dataclass(frozen=True)
class _TensorInfo:
    """What a receiving rank needs to allocate one tensor of the batch (not a tuple: leaves stay leaves)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


class _DispatchPlan:
    """The shard protocol of `DataLoaderShard` for a dispatched loader."""

    def __init__(self, loader: DataLoader, *, num_processes: int, split_batches: bool, even_batches: bool) -> None:  # type: ignore[type-arg]
        self.loader = loader
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.skip_batches = 0
        self.remainder = -1

    @property
    def sampler(self) -> Any:
        return getattr(self.loader.batch_sampler, "sampler", None) or self.loader.sampler

    @property
    def total_batch_size(self) -> int:
        size = self.loader.batch_size or getattr(self.loader.batch_sampler, "batch_size", None)
        if size is None:
            return -1
        return int(size) if self.split_batches else int(size) * self.num_processes

    def set_epoch(self, epoch: int) -> None:
        targets = [self.loader.batch_sampler, self.sampler]
        if isinstance(self.loader.dataset, IterableDataset):
            targets.append(self.loader.dataset)
        for obj in targets:
            if obj is not None and hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)


class DataLoaderDispatcher(DataLoaderShard):
    """A prepared loader whose data is read on rank 0 only and sent to every rank.

    Construct it through `Accelerator.prepare` with
    `DataLoaderConfiguration(dispatch_batches=True)` (the default for iterable datasets).
    Batches are communicated on `comm_device` (the accelerator's device, which the
    collective backend needs), so they arrive there even without device placement.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        num_processes: int,
        process_index: int,
        split_batches: bool,
        even_batches: bool,
        comm_device: torch.device,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, shard=None, **kwargs)
        self._shard = _DispatchPlan(
            self, num_processes=num_processes, split_batches=split_batches, even_batches=even_batches
        )
        self.process_index = process_index
        # The reader is global rank 0 (not data shard 0): with data-parallel groups every
        # rank still receives the step's batch from one place and keeps its shard's slice.
        self._is_reader = not dist.is_initialized() or dist.get_rank() == 0
        self.comm_device = comm_device
        size = self.batch_size or getattr(self.batch_sampler, "batch_size", None)
        if split_batches and size is not None and size % num_processes != 0:
            raise ValueError(
                f"To use a `DataLoader` in `split_batches` mode, the batch size ({size}) needs to be "
                f"a round multiple of the number of processes ({num_processes})."
            )

    def __len__(self) -> int:
        whole = super().__len__()
        w = self._shard.num_processes
        if self._shard.split_batches:
            return whole
        return whole // w if self._drop_last() else math.ceil(whole / w)

    def _drop_last(self) -> bool:
        return bool(self.drop_last or getattr(self.batch_sampler, "drop_last", False))

    def _raw_batches(self) -> Iterator[Any]:
        # Per step: one small header, then every tensor of the batch packed into one byte
        # buffer. The batch's layout (shapes, dtypes, other leaves) is pickled only when it
        # changes, so a steady stream costs two broadcasts per step.
        plan = self._shard
        reader = self._read_steps(plan.skip_batches) if self._is_reader else None
        layout: Any = None
        while True:
            step = next(reader, None) if reader is not None else None
            header = torch.zeros(4, dtype=torch.int64, device=self.comm_device)
            if step is not None:
                new_layout = _structure(step[0])
                changed = new_layout != layout
                layout = new_layout
                payload = _pack(step[0], self.comm_device)
                header = torch.tensor(
                    [1, step[1], int(changed), payload.numel()], dtype=torch.int64, device=self.comm_device
                )
            ops.broadcast(header, from_process=0)
            running, remainder, changed, nbytes = (int(v) for v in header.tolist())
            if not running:
                return
            if changed:
                box: list[Any] = [layout]
                ops.broadcast_object_list(box)
                layout = box[0]
            if step is not None:
                batch = step[0]
                ops.broadcast(payload, from_process=0)
            else:
                buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.comm_device)
                batch = _unpack(layout, ops.broadcast(buffer, from_process=0))
            plan.remainder = remainder
            yield self._slice(batch)

    def _read_steps(self, skip: int) -> Iterator[tuple[Any, int]]:
        """On rank 0: (global batch, remainder) per step, the last one completed if needed."""
        w = self._shard.num_processes
        even = self._shard.even_batches
        it = DataLoader.__iter__(self)
        group = 1 if self._shard.split_batches else w

        def next_step() -> Any:
            parts = []
            for _ in range(group):
                try:
                    parts.append(next(it))
                except StopIteration:
                    break
            if not parts or (len(parts) < group and self._drop_last()):
                return None
            return _concatenate(parts)

        head = None
        current = next_step()
        index = 0
        while current is not None:
            upcoming = next_step()
            current = ops.send_to_device(current, self.comm_device)
            current = ops.recursively_apply(lambda t: t.contiguous(), current)
            if head is None:
                head = current
            n = _batch_size(current)
            remainder = 0
            if n % w and even:
                if upcoming is not None:
                    raise ValueError(
                        f"dispatch_batches got a batch of {n} samples before the end of the epoch, which does not "
                        f"split over {w} processes; only the last batch may be short. Use a batch sampler with a "
                        "fixed batch size, or DataLoaderConfiguration(even_batches=False)."
                    )
                remainder = n
                need = math.ceil(n / w) * w - n
                current = _concatenate([current, _take(head, need)])
            if index >= skip:
                yield current, remainder
            index += 1
            current = upcoming

    def _slice(self, batch: Any) -> Any:
        w, r = self._shard.num_processes, self.process_index
        n = _batch_size(batch)
        per, extra = divmod(n, w)
        # Equal slices after padding; without even_batches the first `extra` ranks take one more.
        start = r * per + min(r, extra)
        stop = start + per + (1 if r < extra else 0)
        return ops.recursively_apply(lambda t: t[start:stop] if t.ndim > 0 else t, batch)


def _batch_size(batch: Any) -> int:
    size = ops.find_batch_size(batch)
    if size is None:
        raise ValueError("dispatch_batches needs batches that contain at least one tensor with a batch dimension.")
    return size


def _concatenate(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    try:
        return ops.concatenate(parts, dim=0)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(
            f"dispatch_batches concatenates the batches of {len(parts)} loader steps into one per step, and these "
            f"cannot be concatenated ({exc}). Make every batch a nest of tensors with equal trailing dimensions, or "
            "use DataLoaderConfiguration(split_batches=True) with a global batch size."
        ) from exc


def _take(batch: Any, count: int) -> Any:
    """The first `count` samples of `batch`, starting over when it has fewer."""
    n = _batch_size(batch)
    index = torch.arange(count) % n
    return ops.recursively_apply(lambda t: t[index.to(t.device)] if t.ndim > 0 else t, batch)


def _structure(batch: Any) -> Any:
    return ops.recursively_apply(lambda t: _TensorInfo(tuple(t.shape), t.dtype, t.numel() * t.element_size()), batch)


# Every tensor starts at a multiple of this many bytes in the packed buffer, so each can be
# viewed back as its dtype without a copy.
_ALIGN = 16


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _pack(batch: Any, device: torch.device) -> torch.Tensor:
    """Every tensor of `batch`, in traversal order, as one flat byte buffer (aligned slots)."""
    tensors = ops._tensors(batch)
    buffer = torch.zeros(sum(_padded(t.numel() * t.element_size()) for t in tensors), dtype=torch.uint8, device=device)
    offset = 0
    for t in tensors:
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        buffer[offset : offset + raw.numel()] = raw
        offset += _padded(raw.numel())
    return buffer


def _unpack(layout: Any, buffer: torch.Tensor) -> Any:
    """The batch `_pack` flattened, rebuilt from `layout` (views into `buffer`)."""
    offset = 0

    def rebuild(info: Any) -> torch.Tensor:
        nonlocal offset
        chunk = buffer[offset : offset + info.nbytes]
        offset += _padded(info.nbytes)
        return chunk.view(info.dtype).reshape(info.shape)

    return ops.recursively_apply(rebuild, layout, test_type=lambda x: isinstance(x, _TensorInfo))
