"""Where an arena lives: the device a config names, checked, and its multiprocessor count."""

from __future__ import annotations

import torch

from staticattn.errors import ConfigError

__all__ = ["check_device", "device_sm_count"]

#: Multiprocessors assumed off CUDA: an H100 / H200's count.
DEFAULT_SMS = 132


def check_device(device: str) -> None:
    """Raise a :class:`ConfigError` unless ``device`` ("cuda", "cuda:1", "cpu") is a CUDA
    device that is available or the CPU."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} asks for CUDA, but CUDA is not available")
    if dev.type not in ("cuda", "cpu"):
        raise ConfigError(f"device={device!r}: only 'cuda' and 'cpu' are supported")


def device_sm_count(device: torch.device) -> int:
    """The device's multiprocessors on CUDA, :data:`DEFAULT_SMS` elsewhere."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SMS
