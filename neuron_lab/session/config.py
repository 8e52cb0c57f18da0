"""``%config NeuronLab.*``: the workbench's settings, as a traitlets Configurable (IPython's convention)."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Enum, Float, Int, TraitError, TraitType, Unicode, default, validate
from traitlets.config import Configurable

from neuron_lab import settings

_TRAITS: dict[type, type[TraitType]] = {bool: Bool, int: Int, float: Float, str: Unicode}
_LOWERING = settings.env("NEURON_LAB_COMPILE_LOWERING")  # the emulator's; the session passes the choice on


def _trait(name: str) -> TraitType:
    """The ``%config`` trait of the registered setting ``name``: its type, default, choices and help."""
    s = settings.config(name)
    trait = Enum(list(s.choices), s.default, help=s.help) if s.choices else _TRAITS[s.type](s.default, help=s.help)
    return trait.tag(config=True)


class NeuronLab(Configurable):
    """neuron_lab settings. Set them with ``%config NeuronLab.<name> = value`` or in ipython_config.py.

    Each is registered in :mod:`neuron_lab.settings`, which holds its type, default, bounds and help.
    """

    # one trait per registered setting, under its name (a class body's namespace is the dict the class is made from)
    locals().update({name: _trait(name) for name in settings.CONFIG})

    @default("compile_lowering")
    def _lowering_from_env(self) -> str:
        return _LOWERING.choice()[0]

    @validate("device_variable")
    def _identifier(self, proposal):
        v = proposal["value"]
        if not v.isidentifier():
            raise TraitError(f"NeuronLab.device_variable must be a Python identifier, not {v!r}")
        return v

    @validate(*(s.name for s in settings.CONFIG.values() if s.minimum is not None or s.maximum is not None))
    def _in_range(self, proposal):
        problem = settings.config(proposal["trait"].name).out_of_range(proposal["value"])
        if problem:
            raise TraitError(problem)
        return proposal["value"]


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

