"""``torch_neuronx.profiling`` on the emulator: TorchNeuron's ``NeuronConfig``, ``ProfileMode`` and ``NeuronProfiler``
with its documented usage, writing what the emulator can measure as a Chrome/Perfetto trace::

    from torch.profiler import ProfilerActivity, profile, schedule
    from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode

    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir="./output")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                 schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=NeuronProfiler(cfg).export_trace):
        ...

Each ``export_trace`` (each active cycle of a schedule) writes ``neuron_trace_rank{R}_{n}.json`` into
``profile_output_dir`` (created if missing): ``R`` is the process's distributed rank (0 outside
``torch.distributed``), ``n`` the smallest index not yet taken there, so re-runs never overwrite a trace. It is
``torch.profiler``'s Chrome trace, which on the compiled core carries a lane per ``neuron:i`` (native ops as
kernels, copies as memcpys) besides the host's CPU ops and CPU fallbacks; only the lanes of the devices in
``capture_enabled_for_nc`` are kept (host work stays: it ran on the host). It opens in ui.perfetto.dev or
chrome://tracing; its top-level ``neuron_lab`` key records that it is emulated, the rank, the modes and the
capture spec. On the pure-Python core the trace has the host side only.

What TorchNeuron writes into ``profile_output_dir`` on a Trn instance and the emulator does not: per mode,
``DEVICE``: ``neff_*.neff`` and ``*_vnc_*.ntff`` device profiles (engine-level instruction timelines);
``RUNTIME``: ``trace_info.pb`` and ``ntrace.pb`` (the Neuron Runtime system trace); ``CPU_UTIL``: ``cpu_util.pb``;
``HOST_MEMORY``: ``host_mem.pb``. Those are Neuron Explorer's inputs; the emulator has no NeuronCore engines or
Neuron Runtime to measure, so each export warns (a ``UserWarning``, shown once under Python's default filter)
naming the files of the chosen modes that it does not produce, rather than pretend.
"""

from __future__ import annotations

import enum
import json
import os
import re
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig

from neuron_lab import settings

TRACE_NAME = "neuron_trace_rank{rank}_{n}.json"
_NOT_PRODUCED = {"DEVICE": ".neff/.ntff", "RUNTIME": "trace_info.pb/ntrace.pb", "CPU_UTIL": "cpu_util.pb",
                 "HOST_MEMORY": "host_mem.pb"}
_DEVICE_LANE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_CORE_SPEC = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
_DEVICE_NAME = re.compile(r"neuron:(\d+)")


class ProfileMode(enum.Enum):
    """What TorchNeuron captures; each mode is a set of files for Neuron Explorer (see the module docstring)."""

    DEVICE = "device"
    RUNTIME = "runtime"
    CPU_UTIL = "cpu_util"
    HOST_MEMORY = "host_memory"


def parse_cores(spec: str) -> frozenset[int]:
    """The NeuronCore indices of a ``capture_enabled_for_nc`` spec such as ``"0,1,2-5"`` (ranges inclusive)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"capture_enabled_for_nc must be a string of core indices and ranges such as '0,1,2-5', "
                         f"got {spec!r}")
    cores: set[int] = set()
    for part in spec.split(","):
        match = _CORE_SPEC.fullmatch(part)
        if match is None:
            raise ValueError(f"capture_enabled_for_nc: {part.strip()!r} in {spec!r} is neither a core index nor a "
                             "range like '2-5'")
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if first > last:
            raise ValueError(f"capture_enabled_for_nc: range {part.strip()!r} in {spec!r} runs backwards")
        cores.update(range(first, last + 1))
    return frozenset(cores)


def _path(value: Any, name: str) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise TypeError(f"NeuronConfig {name} must be a non-empty path (str or os.PathLike), got {value!r}")
    return os.fspath(value)


class NeuronConfig(_ExperimentalConfig):
    """TorchNeuron's profiling settings, passed both as ``experimental_config=`` to ``torch.profiler.profile`` (it is
    a ``torch._C._profiler._ExperimentalConfig`` whose ``custom_profiler_config`` string has TorchNeuron's keys) and
    to :class:`NeuronProfiler`. On the emulator ``capture_enabled_for_nc`` and ``profile_output_dir`` take effect;
    ``max_events_per_nc``, ``neff_cache_dir`` and ``precache_node_info`` are validated and kept (they tune NRT
    capture and NEFF lookup, which the emulator does not have)."""

    def __init__(self, modes: Iterable[ProfileMode] | None = None, max_events_per_nc: int | None = None,
                 capture_enabled_for_nc: str | None = None, profile_output_dir: str | os.PathLike[str] = "./output",
                 neff_cache_dir: str | os.PathLike[str] | None = None, precache_node_info: bool = False) -> None:
        chosen = (ProfileMode.DEVICE, ProfileMode.RUNTIME) if modes is None else tuple(modes)
        bad = [m for m in chosen if not isinstance(m, ProfileMode)]
        if bad or not chosen:
            raise ValueError(f"NeuronConfig modes must be a non-empty list of ProfileMode members "
                             f"({', '.join('ProfileMode.' + m.name for m in ProfileMode)}), got {modes!r}")
        if max_events_per_nc is not None and (isinstance(max_events_per_nc, bool)
                                              or not isinstance(max_events_per_nc, int) or max_events_per_nc <= 0):
            raise ValueError(f"NeuronConfig max_events_per_nc must be a positive int, got {max_events_per_nc!r}")
        if not isinstance(precache_node_info, bool):
            raise TypeError(f"NeuronConfig precache_node_info must be a bool, got {precache_node_info!r}")
        self.modes: tuple[ProfileMode, ...] = tuple(dict.fromkeys(chosen))
        self.max_events_per_nc = max_events_per_nc
        self.capture_enabled_for_nc = capture_enabled_for_nc
        self.cores: frozenset[int] | None = None if capture_enabled_for_nc is None else parse_cores(
            capture_enabled_for_nc)
        self.profile_output_dir = _path(profile_output_dir, "profile_output_dir")
        self.neff_cache_dir = None if neff_cache_dir is None else _path(neff_cache_dir, "neff_cache_dir")
        self.precache_node_info = precache_node_info
        super().__init__(custom_profiler_config=self._custom_config())

    def _custom_config(self) -> str:
        """The ``key:value;...`` string TorchNeuron's Kineto plugin reads (research notes, next-steps §5.1)."""
        items = {"max_events_per_nc": self.max_events_per_nc, "capture_enabled_for_nc": self.capture_enabled_for_nc,
                 "host_memory": "true" if ProfileMode.HOST_MEMORY in self.modes else None,
                 "profile_output_dir": self.profile_output_dir}
        return ";".join(f"{key}:{value}" for key, value in items.items() if value is not None)

    def __repr__(self) -> str:
        modes = ", ".join(f"ProfileMode.{m.name}" for m in self.modes)
        return (f"NeuronConfig(modes=[{modes}], max_events_per_nc={self.max_events_per_nc!r}, "
                f"capture_enabled_for_nc={self.capture_enabled_for_nc!r}, "
                f"profile_output_dir={self.profile_output_dir!r}, neff_cache_dir={self.neff_cache_dir!r}, "
                f"precache_node_info={self.precache_node_info!r})")


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(settings.env("RANK").raw() or "0")


def _device_index(name: Any) -> int | None:
    match = _DEVICE_NAME.fullmatch(name) if isinstance(name, str) else None
    return int(match[1]) if match else None


def keep_cores(events: list[dict[str, Any]], cores: frozenset[int], host_pid: int) -> list[dict[str, Any]]:
    """``events`` without the device lanes (``pid`` = device index, named ``neuron:i``) of devices not in ``cores``;
    the host's events stay, CPU fallbacks included."""
    lanes = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and _device_index(e.get("args", {}).get("name")) is not None}
    dropped = {pid for pid in lanes if pid not in cores and pid != host_pid}

    def on_dropped_lane(event: dict[str, Any]) -> bool:
        if event.get("cat") in _DEVICE_LANE_CATEGORIES:
            index = _device_index(event.get("args", {}).get("device"))
            if index is not None:
                return index not in cores
        return event.get("pid") in dropped

    return [e for e in events if not on_dropped_lane(e)]


class NeuronProfiler:
    """``on_trace_ready=NeuronProfiler(cfg).export_trace``: writes each finished profile of ``torch.profiler`` into
    ``cfg.profile_output_dir`` as ``neuron_trace_rank{R}_{n}.json`` (see the module docstring)."""

    def __init__(self, config: NeuronConfig | None = None) -> None:
        if config is not None and not isinstance(config, NeuronConfig):
            raise TypeError(f"NeuronProfiler takes a torch_neuronx.profiling.NeuronConfig, got {type(config).__name__}")
        self.config = NeuronConfig() if config is None else config

    def export_trace(self, prof: torch.profiler.profile) -> Path:
        """Write ``prof``'s Chrome trace, keeping only the captured devices' lanes; return the file written."""
        out = Path(self.config.profile_output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out, prefix=".neuron_trace_") as scratch:
            raw = Path(scratch) / "trace.json"
            prof.export_chrome_trace(str(raw))
            trace = json.loads(raw.read_text())
        if self.config.cores is not None:
            trace["traceEvents"] = keep_cores(trace["traceEvents"], self.config.cores, os.getpid())
        rank = _rank()
        trace["neuron_lab"] = {"emulated": True, "rank": rank, "modes": [m.name for m in self.config.modes],
                               "capture_enabled_for_nc": self.config.capture_enabled_for_nc}
        path = self._write(out, rank, json.dumps(trace))
        missing = [f"{_NOT_PRODUCED[m.name]} ({m.name})" for m in self.config.modes]
        warnings.warn("neuron_lab's emulator writes a Chrome/Perfetto trace (neuron_trace_rank*_*.json) into "
                      f"profile_output_dir; it does not produce Neuron Explorer's {', '.join(missing)}",
                      UserWarning, stacklevel=2)
        return path

    @staticmethod
    def _write(out: Path, rank: int, text: str) -> Path:
        """Create the next free ``neuron_trace_rank{R}_{n}.json`` (exclusive create: a file never overwrites one)."""
        n = 0
        while True:
            path = out / TRACE_NAME.format(rank=rank, n=n)
            try:
                with path.open("x") as f:
                    f.write(text)
                return path
            except FileExistsError:
                n += 1


__all__ = ["NeuronConfig", "NeuronProfiler", "ProfileMode"]
