"""``%config NeuronLab.*``: the workbench's settings, as a traitlets Configurable (IPython's convention)."""

from __future__ import annotations

import os
from typing import Any

from traitlets import Bool, Enum, Float, Int, TraitError, Unicode, default, validate
from traitlets.config import Configurable

_LOWERINGS = ("eager", "inductor")  # the emulator's (backend/emulator/compile.py); the session passes the choice on


class NeuronLab(Configurable):
    """neuron_lab settings. Set them with ``%config NeuronLab.<name> = value`` or in ipython_config.py."""

    auto_report = Bool(True, help="Show a report after every cell that touched the device.").tag(config=True)
    report_detail = Enum(["summary", "table", "full"], "table",
                         help="How much an automatic report shows: one line, tables, or tables with stacks.",
                         ).tag(config=True)
    callsites = Bool(True, help="Find the cell line behind each CPU fallback (a frame walk per fallback call).",
                     ).tag(config=True)
    callsite_stacks = Int(3, help="Stacks captured for the first K calls of each (op, line); 0 captures none.",
                          ).tag(config=True)
    stack_depth = Int(8, help="Frames kept per captured stack.").tag(config=True)
    device_variable = Unicode("device", help="The user-namespace variable that holds the notebook's device.",
                              ).tag(config=True)
    history_size = Int(500, help="Cell reports kept for `%neuron report`; the oldest go first.").tag(config=True)
    widget_refresh_hz = Float(4.0, help="How often live widgets refresh while a cell runs.").tag(config=True)
    auto_dashboard = Bool(False, help="Show a compact live strip (memory bar, fallback count, mode) under each "
                          "cell while it runs (widget frontends).").tag(config=True)
    display_as = Enum(["auto", "widget", "static"], "auto",
                      help="How the live views show: widgets (auto: under a kernel) or static text/HTML updated "
                           "after each cell (auto: elsewhere).").tag(config=True)
    oom_traceback = Enum(["short", "full"], "short",
                         help="After the device's out-of-memory error: 'short' ends the traceback in your code and "
                              "frees what the failing frames held once the report lists it; 'full' keeps the "
                              "emulator's frames and their tensors (for %debug; `%neuron free` drops them).",
                         ).tag(config=True)
    compile_backend = Unicode("neuron", help="The torch.compile backend of compile mode when none is given.",
                              ).tag(config=True)
    compile_lowering = Enum(_LOWERINGS, "eager",
                            help="How the emulator runs torch.compile(backend='neuron') graphs: eager runs each graph "
                                 "op by op on the device (fast compiles, per-op reports and CPU fallbacks inside "
                                 "graphs); inductor compiles them with host Inductor (compiled speed, slow compiles). "
                                 "Default: NEURON_LAB_COMPILE_LOWERING, else eager.").tag(config=True)

    @default("compile_lowering")
    def _lowering_from_env(self) -> str:
        env = os.environ.get("NEURON_LAB_COMPILE_LOWERING", "")
        return env if env in _LOWERINGS else "eager"

    @validate("device_variable")
    def _identifier(self, proposal):
        v = proposal["value"]
        if not v.isidentifier():
            raise TraitError(f"NeuronLab.device_variable must be a Python identifier, not {v!r}")
        return v

    @validate("callsite_stacks", "stack_depth", "history_size")
    def _non_negative(self, proposal):
        if proposal["value"] < 0:
            raise TraitError(f"NeuronLab.{proposal['trait'].name} must be >= 0, not {proposal['value']}")
        return proposal["value"]

    @validate("widget_refresh_hz")
    def _rate(self, proposal):
        v = proposal["value"]
        if not 0.1 <= v <= 60:
            raise TraitError(f"NeuronLab.widget_refresh_hz must be between 0.1 and 60, not {v}")
        return v


def settings_of(shell: Any) -> tuple[NeuronLab, list[str]]:
    """The shell's ``NeuronLab`` settings, and what was wrong with them.

    A value that does not validate (``%config NeuronLab.report_detail = 'bogus'``, a typo in
    ipython_config.py) is dropped from the shell's config with a message, instead of failing the load.
    """
    section = shell.config.get("NeuronLab", {})
    probe = NeuronLab()
    problems = []
    for name in list(section):
        try:
            setattr(probe, name, section[name])
        except (TraitError, AttributeError) as e:
            problems.append(f"NeuronLab.{name} = {section[name]!r} ignored: {e}")
            del section[name]
    return NeuronLab(parent=shell), problems

