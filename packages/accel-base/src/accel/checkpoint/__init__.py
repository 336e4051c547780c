"""Checkpoints: `save_state`/`load_state` (`state`), single files written atomically and hashed (`io`), where
files live and how a new checkpoint replaces an old one (`layout`), the checks a load passes before
anything changes (`validate`), sharded torch.distributed.checkpoint folders read safely (`dcp`), and optimizer
state re-keyed between layouts (`optimizer_keys`)."""

from .state import load_state, save_state

__all__ = ["load_state", "save_state"]
