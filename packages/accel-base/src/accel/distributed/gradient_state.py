"""`GradientState`: gradient accumulation bookkeeping and the data loaders being iterated, shared by every
instance (the Borg pattern) as Accelerate users expect. A leaf of the engine: the prepared optimizer, scheduler
and loaders read it without reaching the process state."""

from __future__ import annotations

from typing import Any

from .edge import member_miss


class GradientState:
    """Gradient accumulation bookkeeping and the data loaders being iterated.

    `sync_gradients` is True on steps where gradients are synchronised and the optimizer
    really steps; `end_of_dataloader` is True while the last batch of the active loader is
    in use; `remainder` is how many samples of the last gathered batch are real (-1 when
    unknown or when nothing was padded).
    """

    _shared_state: dict[str, Any] = {}

    def __init__(self, gradient_accumulation_plugin: Any = None) -> None:
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            self.active_dataloader: Any = None
            self.dataloader_references: list[Any] = [None]
            self.plugin_kwargs: dict[str, Any] = {
                "num_steps": 1,
                "sync_with_dataloader": True,
                "sync_each_batch": False,
                "adjust_scheduler": True,
            }
            self._initialized = True
        if gradient_accumulation_plugin is not None:
            self.plugin_kwargs = {
                "num_steps": gradient_accumulation_plugin.num_steps,
                "sync_with_dataloader": gradient_accumulation_plugin.sync_with_dataloader,
                "sync_each_batch": gradient_accumulation_plugin.sync_each_batch,
                "adjust_scheduler": gradient_accumulation_plugin.adjust_scheduler,
            }

    @property
    def initialized(self) -> bool:
        return self._shared_state.get("_initialized", False)

    def __getattr__(self, name: str) -> Any:
        # Only reached on a miss: an Accelerate member accel lacks says why (`compat_table.UNSUPPORTED_MEMBERS`).
        raise member_miss(self, "GradientState", name)

    @property
    def num_steps(self) -> int:
        return int(self.plugin_kwargs["num_steps"])

    @property
    def sync_with_dataloader(self) -> bool:
        return bool(self.plugin_kwargs["sync_with_dataloader"])

    @property
    def sync_each_batch(self) -> bool:
        return bool(self.plugin_kwargs["sync_each_batch"])

    @property
    def adjust_scheduler(self) -> bool:
        return bool(self.plugin_kwargs["adjust_scheduler"])

    @property
    def end_of_dataloader(self) -> bool:
        return bool(self.active_dataloader is not None and self.active_dataloader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        return int(self.active_dataloader.remainder) if self.active_dataloader is not None else -1

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    def set_sync_gradients(self, sync_gradients: bool) -> None:
        """Whether this step synchronises gradients (the Accelerator decides, under `accumulate`)."""
        self.sync_gradients = sync_gradients

    def add_dataloader(self, dataloader: Any) -> None:
        """A prepared loader starts iterating: it becomes the active one."""
        self.active_dataloader = dataloader
        self.dataloader_references.append(dataloader)

    def remove_dataloader(self, dataloader: Any) -> None:
        """A prepared loader finished iterating: the one it interrupted (if any) is active again."""
        if dataloader in self.dataloader_references:
            self.dataloader_references.remove(dataloader)
        self.active_dataloader = self.dataloader_references[-1]

    # Accelerate's names (transformers' Trainer calls `_set_sync_gradients`).
    _set_sync_gradients = set_sync_gradients
    _add_dataloader = add_dataloader
    _remove_dataloader = remove_dataloader

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n"
        )

    @staticmethod
    def _reset_state() -> None:
        GradientState._shared_state.clear()
