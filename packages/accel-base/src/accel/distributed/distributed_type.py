"""`DistributedType`: how the job is spread over processes, with the names Accelerate scripts compare against.

The core names no hardware. Its own members say how work is spread (`NO`, `MULTI_CPU`,
`FSDP`, `DEEPSPEED`, `MEGATRON_LM`); the names that mention a device (Accelerate's
`MULTI_<DEVICE>` members and the like) are contributed by adapters: each adapter says which
name its data-parallel runs report (`Adapter.data_parallel_type`), so a data-parallel run
on two devices of an adapter that says `MULTI_<DEVICE>` has `accelerator.distributed_type ==
DistributedType.MULTI_<DEVICE>`.

Any other upper-case name is a member as well, created when first asked for: a script that
checks `accelerator.distributed_type == DistributedType.<DEVICE>` on a machine without that
hardware (or without its adapter installed) gets False, never AttributeError. Members are
`str`s, so they also compare equal to their names, as Accelerate's enum members do.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")


class _DistributedTypeMeta(type):
    """Makes the class behave like Accelerate's enum (iteration, `[name]`, `(value)`) with open membership."""

    _members: dict[str, DistributedType]

    def __getattr__(cls, name: str) -> DistributedType:
        if _NAME.match(name):
            return cls._member(name)
        raise AttributeError(f"type object 'DistributedType' has no attribute {name!r}")

    def __iter__(cls) -> Iterator[DistributedType]:
        return iter(list(cls._members.values()))

    def __len__(cls) -> int:
        return len(cls._members)

    def __contains__(cls, value: object) -> bool:
        return isinstance(value, str) and value in cls._members

    def __getitem__(cls, name: str) -> DistributedType:
        if not _NAME.match(name):
            raise KeyError(name)
        return cls._member(name)

    def __call__(cls, value: Any) -> DistributedType:
        if isinstance(value, cls):
            return value
        if not isinstance(value, str) or not _NAME.match(value):
            raise ValueError(f"{value!r} is not a valid DistributedType")
        return cls._member(value)

    @property
    def __members__(cls) -> dict[str, DistributedType]:
        return dict(cls._members)

    def _member(cls, name: str) -> DistributedType:
        member = cls._members.get(name)
        if member is None:
            member = str.__new__(cls, name)  # type: ignore[arg-type,call-overload]
            cls._members[name] = member
        return member


class DistributedType(str, metaclass=_DistributedTypeMeta):
    """How the job is spread over processes (Accelerate's `DistributedType`, hardware-neutral in the core).

    NO: one process. MULTI_CPU: data parallelism on CPUs. FSDP, DEEPSPEED, MEGATRON_LM:
    those strategies. Data-parallel runs on an accelerator report the adapter's name for
    them; see the module docstring.
    """

    _members: dict[str, DistributedType] = {}

    @property
    def name(self) -> str:
        return str.__str__(self)

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<DistributedType.{self.name}: {self.name!r}>"

    def __str__(self) -> str:
        return f"DistributedType.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)  # as a `str, Enum` member formats on Python 3.11

    def __reduce__(self) -> tuple[Any, ...]:
        return (DistributedType, (self.name,))

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return str.__ne__(self, other)


# The core's own members, in Accelerate's order; adapters' names join when first used.
for _name in ("NO", "MULTI_CPU", "DEEPSPEED", "FSDP", "MEGATRON_LM"):
    DistributedType[_name]
