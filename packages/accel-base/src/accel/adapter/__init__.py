"""The hardware side: the adapter contract (`base`), adapter options (`options`), finding adapters and
strategies through entry points (`registry`), and the built-in cpu adapter (`cpu`)."""

from .base import (
    ADAPTER_API_VERSION,
    DEPRECATED_ADAPTER_API_VERSIONS,
    LEGACY_PREPARE_HOOKS,
    PRECISIONS,
    REMOVED_ADAPTER_HOOKS,
    SUPPORTED_ADAPTER_API_VERSIONS,
    Adapter,
    Availability,
    Capabilities,
)

__all__ = [
    "ADAPTER_API_VERSION",
    "DEPRECATED_ADAPTER_API_VERSIONS",
    "LEGACY_PREPARE_HOOKS",
    "PRECISIONS",
    "REMOVED_ADAPTER_HOOKS",
    "SUPPORTED_ADAPTER_API_VERSIONS",
    "Adapter",
    "Availability",
    "Capabilities",
]
