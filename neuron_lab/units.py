"""Human-readable sizes, durations and counts, shared by every layer's messages and renderers, and the one way
an object shows as its text in IPython (:class:`ShownAsText`)."""

from __future__ import annotations

import functools
import math

# Binary multiples for every spelling, as NEURON_LAB_DEVICE_MEMORY has always read them ("2GB" is 2 GiB).
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
          "g": 1024**3, "gb": 1024**3, "gib": 1024**3, "t": 1024**4, "tb": 1024**4, "tib": 1024**4}


def format_size(n: int) -> str:
    """Binary units, two decimals: ``format_size(3 * 2**20) == "3.00 MiB"``."""
    a = abs(n)  # an if per unit, not a loop: every report's memory line formats a handful
    if a < 1024:
        return f"{n} B"
    if a < 1048576:
        return f"{n / 1024:.2f} KiB"
    if a < 1073741824:
        return f"{n / 1048576:.2f} MiB"
    return f"{n / 1073741824:.2f} GiB"


# What every view says for a capacity not known yet: TorchNeuron reads it from the Neuron runtime, which
# neuron_lab never starts itself (the user's first device use does), so the cores stay free for ranks.
CAPACITY_UNKNOWN = "after first device use"


def format_capacity(n: int | None) -> str:
    """A device's memory size, or :data:`CAPACITY_UNKNOWN` where it is not known without starting the runtime."""
    return CAPACITY_UNKNOWN if n is None else format_size(n)


def format_delta(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_size(abs(n))


def _seconds_unit(s: float) -> tuple[float, int, str]:
    """How :func:`format_seconds` shows ``s``: (scale, decimals, unit)."""
    return (1.0, 2, "s") if s >= 1 else (1e3, 1, "ms") if s >= 1e-3 else (1e6, 0, "µs")


@functools.lru_cache(maxsize=1024)  # a report's text and HTML each show its rows' times
def format_seconds(s: float) -> str:
    scale, decimals, unit = _seconds_unit(s)
    return f"{s * scale:.{decimals}f} {unit}"


def seconds_as_shown(s: float) -> float:
    """``s`` rounded as :func:`format_seconds` shows it: figures compared as a reader reads them (two shown alike
    are equal)."""
    scale, decimals, _ = _seconds_unit(s)
    return round(s * scale, decimals) / scale


def count(n: int, noun: str) -> str:
    """``count(1, "graph break") == "1 graph break"``, ``count(3, "op") == "3 ops"``."""
    if type(n) is int and 0 <= n < 1000:  # nothing to group: the cheaper format (every report makes a dozen)
        return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def parse_size(text: str) -> int:
    """``"24GiB"``, ``"512m"``, ``"1048576"`` -> bytes; ValueError for anything else, ``inf`` and ``1e999`` included."""
    bad = ValueError(f"cannot read {text!r} as a size (examples: 24GiB, 512MiB, 1048576)")
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    if not num or unit not in _UNITS:
        raise bad
    try:
        value = float(num) * _UNITS[unit]
    except ValueError:
        raise bad from None
    if not math.isfinite(value):
        raise bad
    return int(value)


class ShownAsText:
    """IPython shows the object as its ``str()``: a report or a message, never a quoted or generated repr.

    IPython's pretty printer uses the first class of the MRO whose own ``__dict__`` has ``_repr_pretty_`` or
    ``__repr__``; a dataclass or a subclass defines ``__repr__`` itself, so every subclass gets the method too.
    """

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._repr_pretty_ = ShownAsText._repr_pretty_
