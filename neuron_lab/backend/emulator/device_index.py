"""A `neuron` device index from what users pass: an int, a string, a torch.device, or None for the current one."""

from __future__ import annotations

from typing import Any

import torch

from neuron_lab.backend.emulator import runtime as _rt


def index_of(device: Any = None) -> int:
    """A device index from an int, a string or a torch.device; None is the current device."""
    devices = _rt.get().devices
    if device is None:
        return devices.current_device()
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != "neuron":
            raise ValueError(f"Expected a neuron device, got {d}")
        idx = devices.current_device() if d.index is None else d.index
    return devices.check(idx)
