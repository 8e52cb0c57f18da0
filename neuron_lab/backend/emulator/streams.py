"""Streams and events of the emulated device, as TorchNeuron's ``torch_neuronx.streams`` spells them.

The emulator runs every op synchronously on one in-order queue, so these are exact rather than
approximate: work recorded before an event is complete when it is recorded; every stream is the default
one (as on TorchNeuron's April build unless host collectives are on). ``torch_neuronx.Stream`` is the class
(a positional device is fine there); ``torch.neuron.Stream`` is the keyword-only factory (``device_module``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from neuron_lab.backend.emulator.device_index import index_of


def _device(device: Any) -> torch.device:
    """A checked `neuron` device from an int, a string, a torch.device; None or a negative int: the current one."""
    return torch.device("neuron", index_of(None if isinstance(device, int) and device < 0 else device))


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._recorded_ns: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._recorded_ns = time.perf_counter_ns()

    def query(self) -> bool:
        return True

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_ns is None or end_event._recorded_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_ns - self._recorded_ns) / 1e6


class Stream:
    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = _device(kwargs.get("device_index", device))
        self.priority = priority

    @property
    def device_index(self) -> int:
        return self.device.index

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: Event) -> None:
        return None

    def wait_stream(self, stream: Stream) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


_DEFAULT_STREAM = Stream()


def current_stream(device: Any = None) -> Stream:
    _device(device)
    return _DEFAULT_STREAM


default_stream = current_stream


def set_stream(stream: Stream | None) -> None:
    return None


class StreamContext:
    """Context manager that selects ``stream`` (a class, as TorchNeuron's: subclass it, check ``isinstance``)."""

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream
        self.src_prev_stream: Stream | None = None

    def __enter__(self) -> None:
        if self.stream is not None:
            self.src_prev_stream = current_stream()
            set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        if self.src_prev_stream is not None:
            set_stream(self.src_prev_stream)
