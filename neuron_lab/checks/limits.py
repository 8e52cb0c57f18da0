"""The bounds of the options, enforced once, where the option objects are made.

``ParityOptions`` and ``CompareOptions`` call these from ``__post_init__``, so ``%%neuron parity``,
``%%neuron compare``, ``neuron_lab.parity()`` and ``neuron_lab.compare()`` refuse the same values with
the same words; :func:`compile_options` does the same for compile mode (``%neuron mode compile``,
``%%neuron compile``). The bounds keep a check meaningful and finite: a NaN tolerance passes everything, an
astronomical ``--runs`` never ends, a seed outside what ``torch.manual_seed`` keeps fails half way, and an
unknown ``torch.compile`` backend fails only at the first compiled call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from neuron_lab import modes
from neuron_lab.trace import compiles

MAX_RUNS = 10_000
MAX_WARMUP = 10_000
MAX_SEED = 2**64 - 1  # torch.manual_seed keeps seeds in [0, 2**64 - 1] (it remaps negative ones into that range)
BUILTIN_BACKENDS = ("inductor", "eager", "aot_eager")  # torch.compile's own, registered lazily by dynamo


class OptionError(ValueError):
    """An option outside its bounds. The message names options as ``{rtol}`` so each caller spells them its own
    way: ``rtol`` for ``neuron_lab.parity(...)`` (``str(e)``), ``--rtol`` for ``%%neuron parity``."""

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell: Callable[[str], str]) -> str:
        return self.template.format_map(_Names(spell))


class _Names(dict):
    """Every ``{name}`` of a template, spelled by the caller."""

    def __init__(self, spell: Callable[[str], str]) -> None:
        super().__init__()
        self.spell = spell

    def __missing__(self, name: str) -> str:
        return self.spell(name)


class SettingError(OptionError):
    """A value out of bounds that came from a setting (``%config NeuronLab.compile_backend``), not from an option
    of the command: the message names the setting, and no usage of options the user never gave follows it."""


def _shown(value: Any) -> str:
    """``repr(value)`` inside a template: its braces doubled, so they are not read as option names."""
    return repr(value).replace("{", "{{").replace("}", "}}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def count(name: str, value: Any, low: int, high: int) -> None:
    if not _is_int(value) or not low <= value <= high:
        raise OptionError(f"{{{name}}} must be a whole number from {low} to {high:,} (got {_shown(value)})")


def tolerances(rtol: Any, atol: Any) -> None:
    if (rtol is None) != (atol is None):
        raise OptionError("give both {rtol} and {atol}, or neither (as torch.testing.assert_close)")
    for name, value in (("rtol", rtol), ("atol", atol)):
        ok = value is None or ((_is_int(value) or isinstance(value, float)) and math.isfinite(value) and value >= 0)
        if not ok:
            raise OptionError(f"{{{name}}} must be a finite number >= 0 (got {_shown(value)})")


def seed(value: Any) -> None:
    if value is not None and (not _is_int(value) or not 0 <= value <= MAX_SEED):
        raise OptionError(f"{{seed}} must be a whole number from 0 to 2**64-1 = {MAX_SEED} (got {_shown(value)}), "
                          "as torch.manual_seed keeps it")


def names(values: Iterable[Any]) -> None:
    """Variable names (``--vars``): identifiers only."""
    odd = [v for v in values if not (isinstance(v, str) and v.isidentifier())]
    if odd:
        raise OptionError(f"{{vars}} takes variable names, not {', '.join(_shown(v) for v in odd)}")


def compile_backend(name: Any, setting: str | None = None) -> None:
    """A backend ``torch.compile`` knows: dynamo's registry, and its built-in names. ``setting`` names the setting
    the value came from, when no option gave it: the list loads dynamo (a second), so ``%config`` cannot check it."""
    from torch._dynamo.backends.registry import list_backends

    with compiles.loading_compiler():
        known = set(list_backends(exclude_tags=())) | set(BUILTIN_BACKENDS)
        listed = set(list_backends()) | set(BUILTIN_BACKENDS)  # dynamo's debug and experimental ones go unnamed
    if name not in known:
        why = f"unknown torch.compile backend {_shown(name)}; known: {', '.join(sorted(listed))}"
        if setting is None:
            raise OptionError(why)
        raise SettingError(f"{setting} = {_shown(name)}: {why} (`%config {setting} = NAME` sets another)")


def compile_options(backend: str, fullgraph: bool = False, dynamic: bool | None = None,
                    setting: str | None = None) -> modes.CompileOptions:
    """Compile mode's options, checked: no ``dynamic=True`` with ``backend="neuron"`` (before the backend, whose
    check loads the compiler: a refused option costs no second of loading), and a known backend (from ``setting``
    when no option gave it)."""
    if dynamic and backend == "neuron":
        raise OptionError("torch.compile(backend='neuron') rejects dynamic=True, as TorchNeuron does; {dynamic} needs "
                          "another {backend} (inductor, eager)")
    compile_backend(backend, setting)
    return modes.CompileOptions(backend, bool(fullgraph), True if dynamic else None)
