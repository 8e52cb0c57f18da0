"""The settings registry is complete and is the one home of each fact: every variable the package reads is
registered, nobody reads the environment around it, and the modules' own names for choices and defaults are the
registry's."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from neuron_lab import settings
from neuron_lab.backend import coverage, selection
from neuron_lab.backend.emulator import cpp_core, lowering, topology
from neuron_lab.session.config import NeuronLab

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for p in (ROOT / "neuron_lab").rglob("*.py")]


def test_every_neuron_lab_variable_the_code_names_is_registered():
    named = {m for p in [*SOURCES, ROOT / "setup.py"] for m in re.findall(r"\bNEURON_LAB_[A-Z_]+\b", p.read_text())}
    assert named and named <= set(settings.ENV), sorted(named - set(settings.ENV))


def test_only_the_registry_reads_the_environment():
    reads = re.compile(r"os\.environ\.get\(|os\.environ\.setdefault\(|os\.getenv\(|os\.environ\[")
    offenders = [str(p.relative_to(ROOT)) for p in SOURCES
                 if p.name != "settings.py" and reads.search(p.read_text())]
    assert offenders == []


def test_every_reader_exists():
    for var in settings.ENV.values():
        for reader in var.readers:
            assert reader == "setup.py" or importlib.util.find_spec(reader), (var.name, reader)


def test_torchneurons_settings_shown_apart_are_the_ones_neuron_lab_never_reads():
    """Doctor heads them "not read by the emulator"; one the emulator reads is listed with neuron_lab's own."""
    assert [v.name for v in settings.torchneuron() if v.readers] == []
    assert not settings.env("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION").torchneuron  # unlowered.py reads it


def test_the_modules_choices_and_defaults_are_the_registrys():
    assert tuple(topology.INSTANCES) == settings.env("NEURON_LAB_INSTANCE").choices
    assert topology.DEFAULT_INSTANCE == settings.env("NEURON_LAB_INSTANCE").default
    assert selection.CHOICES == settings.env("NEURON_LAB_BACKEND").choices
    assert cpp_core.CORE_CHOICES == settings.env("NEURON_LAB_CORE").choices
    assert lowering.LOWERINGS == settings.config("compile_lowering").choices
    assert coverage.DEFAULT_COVERAGE in coverage.bundled()
    assert set(NeuronLab.class_traits(config=True)) == set(settings.CONFIG)
    for name, trait in NeuronLab.class_traits(config=True).items():
        assert trait.help == settings.config(name).help


@pytest.mark.parametrize(("raw", "want"), [
    (None, ("auto", None)), ("", ("auto", None)), (" Emulator ", ("emulator", None)),
    ("cuda", ("auto", "NEURON_LAB_BACKEND='cuda' is not one of auto, emulator, off; using auto")),
])
def test_a_choice_reads_blank_as_the_default_and_names_a_bad_value(raw, want):
    env = {} if raw is None else {"NEURON_LAB_BACKEND": raw}
    assert settings.env("NEURON_LAB_BACKEND").choice(env) == want


@pytest.mark.parametrize(("raw", "want"), [
    (None, (True, None)), (" ", (True, None)), ("0", (False, None)), ("FALSE", (False, None)), ("True", (True, None)),
    ("maybe", (True, "NEURON_LAB_EMULATE_DOWNCAST='maybe' is not one of 1, true, 0, false; using 1")),
])
def test_a_switch_reads_blank_as_the_default_and_names_a_bad_value(raw, want):
    env = {} if raw is None else {"NEURON_LAB_EMULATE_DOWNCAST": raw}
    assert settings.env("NEURON_LAB_EMULATE_DOWNCAST").switch(env) == want


def test_an_unregistered_name_is_an_error_not_none():
    with pytest.raises(KeyError):
        settings.env("NEURON_LAB_NO_SUCH_THING")
    with pytest.raises(ValueError, match="registered twice"):
        settings.register_env("NEURON_LAB_CORE", "again")
