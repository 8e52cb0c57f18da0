"""The stand-in's Neuron Kineto plugin: what a torch.profiler session with PrivateUse1 leaves behind.

Mirrors (tnx = the TorchNeuron source named in tests/fake_torchneuronx/README.md):
- registered at import, as ``_C._register_profiler()`` is (tnx:torch_neuronx/csrc/profiler/README.md:40-41);
- the options come from ``experimental_config``'s ``custom_profiler_config`` "key:value;key:value", a pair that is
  not exactly key:value ignored (tnx:torch_neuronx/csrc/profiler/NConfigParser.cpp:112-122);
  ``profile_output_dir`` is where NRT writes (tnx:torch_neuronx/csrc/profiler/Session.cpp:65-75);
- the files are written at stop, by ``nrt_inspect_stop()`` (Session.cpp:222-242), into a
  ``<instance>_pid_<pid>/`` folder: ``.ntff`` per NeuronCore, the ``.neff`` it ran, ``trace_info.pb``,
  ``ntrace.pb`` (tnx:tests/profiler/test_profiler_integration.py:33-40); ``cpu_util.pb`` from CPU_OP
  (Session.cpp:132-134), ``host_mem.pb`` only with ``host_memory:true`` (Session.cpp:57-63);
- no device events reach torch.profiler: ``processTrace`` is a no-op (Session.cpp:249-257).
Not mirrored: NRT's default folder when no ``profile_output_dir`` is given (not in the source: nothing is written),
and the files' contents (empty here).
"""

from __future__ import annotations

import os

import torch.autograd.profiler as _autograd_profiler
from torch.profiler import ProfilerActivity

INSTANCE = "i-0fake0standin0"  # the instance id NRT puts in its folder name
NEFF_ID = "395760075800974"


def _options(config: str) -> dict[str, str]:
    pairs = [[x.strip() for x in pair.split(":")] for pair in config.split(";") if pair.strip()]
    return {kv[0]: kv[1] for kv in pairs if len(kv) == 2}


def _write(options: dict[str, str], activities: set) -> None:
    folder = os.path.join(options["profile_output_dir"], f"{INSTANCE}_pid_{os.getpid()}")
    os.makedirs(folder, exist_ok=True)
    names = [f"{NEFF_ID}_instid_0_vnc_0.ntff", f"neff_{NEFF_ID}.neff", "trace_info.pb", "ntrace.pb"]
    names += ["cpu_util.pb"] if ProfilerActivity.CPU in activities else []
    names += ["host_mem.pb"] if options.get("host_memory", "").lower() == "true" else []
    for name in names:
        open(os.path.join(folder, name), "wb").close()


def register() -> None:
    """Wrap torch's profiler start and stop: at stop, a session that had PrivateUse1 writes NRT's files."""
    cls = _autograd_profiler.profile
    if getattr(cls, "_fake_neuron_profiler", False):
        return
    start, exit_ = cls._start_trace, cls.__exit__

    def _start_trace(self) -> None:
        start(self)
        config = getattr(self.experimental_config, "custom_profiler_config", "") if self.experimental_config else ""
        options = _options(config or "")
        on = ProfilerActivity.PrivateUse1 in self.kineto_activities and "profile_output_dir" in options
        self._fake_nrt = (options, set(self.kineto_activities)) if on else None

    def __exit__(self, *exc) -> None:
        exit_(self, *exc)
        session, self._fake_nrt = getattr(self, "_fake_nrt", None), None
        if session is not None:
            _write(*session)

    cls._start_trace, cls.__exit__, cls._fake_neuron_profiler = _start_trace, __exit__, True


register()
