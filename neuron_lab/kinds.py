"""The one vocabulary of what an op call can be: every layer, renderer and the widget's JSON read it here.

A new kind of fact (a collective, an NKI kernel) is added once, in :data:`KINDS`; reports, views,
gates and the widget pick it up from this table. The order of :data:`KINDS` is the order in which
every renderer lists them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SOURCE = "\nsource: "  # a reason's sentence for a newcomer, then where the fact comes from (an issue, a table)

NATIVE = "native"
FALLBACK = "fallback"  # CPU_FALLBACK in TorchNeuron's compatibility table
HOST = "host"  # explicit host kernels TorchNeuron runs on the CPU without reporting them
DOWNCAST = "downcast"  # a 64-bit dtype computed in 32 bits
NKI = "nki"  # a custom kernel registered with torch_neuronx.nki_op: it runs on the device
COLLECTIVE = "collective"  # a torch.distributed call on a `neuron` process group: bytes, ranks, time to completion
POSSIBLE = "possible"  # may fall back on TorchNeuron: evidence short of its documentation (source, gates, xfails)
UNSUPPORTED = "unsupported"  # a call TorchNeuron does not support (the emulator still runs it): a note, gateable
SYNC = "sync"  # a device-to-host read (.item(), print, .tolist(), .cpu(), a data-dependent shape): a note
ABORT = "abort"  # an op on a parameter that a report saw abort the process on TorchNeuron: an error, gateable


@dataclass(frozen=True)
class Kind:
    """How one kind of op call is named, counted and shown."""

    name: str
    title: str  # a report section's title: "CPU fallbacks"
    call: str  # one call, for counts: "CPU fallback call"
    off_device: bool  # it did not run on the device: it counts as a fallback call (and for fallback gates)
    reported: bool  # reports list its ops row by row (native ops are only counted)
    one_line: bool = False  # a note on calls that ran on the device: a report sums it up in one line (tables: --full)
    note: bool = False  # a note on a call that is recorded under its own kind as well: not counted as a call
    timed_as: str = "on the host"  # what a row's time measures, as a section's title says it
    why: str = ""  # one sentence every renderer shows under the section: why these calls cost on Trainium
    error: bool = False  # error-level: its section comes first, and it warns or raises as it happens

    @property
    def heading(self) -> str:
        """Its section's heading in every renderer: the title, marked as an error for error-level kinds."""
        return f"error: {self.title}" if self.error else self.title


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(FALLBACK, "CPU fallbacks", "CPU fallback call", off_device=True, reported=True),
    Kind(HOST, "host ops", "host op call", off_device=True, reported=True),
    Kind(POSSIBLE, "may fall back on TorchNeuron", "possible fallback call", off_device=False, reported=True),
    Kind(UNSUPPORTED, "not supported on TorchNeuron", "unsupported call", off_device=False, reported=True, note=True,
         timed_as="from call to completion"),
    Kind(DOWNCAST, "64-bit downcasts", "64-bit downcast", off_device=False, reported=True, one_line=True, note=True),
    Kind(NKI, "NKI kernels", "NKI kernel call", off_device=False, reported=True),
    Kind(COLLECTIVE, "collectives", "collective call", off_device=False, reported=True,
         timed_as="from call to completion"),
    Kind(SYNC, "device-to-host syncs", "sync", off_device=False, reported=True, one_line=True, note=True,
         why="On Trainium each read of device data by the host ends the Adaptive Eager fusion group and stalls "
             "the queue until the device has finished everything before it."),
    Kind(ABORT, "may abort the process on TorchNeuron", "possible abort", off_device=False, reported=True, note=True,
         error=True, why="A public report saw TorchNeuron kill the Python process (SIGABRT or SIGSEGV) on this op "
                         "applied to a parameter: the process and everything in it are lost."),
    Kind(NATIVE, "native ops", "op", off_device=False, reported=False),
)}
REPORTED = frozenset(k.name for k in KINDS.values() if k.reported)  # the kinds whose calls a report lists
OFF_DEVICE = frozenset(k.name for k in KINDS.values() if k.off_device)
NOTES = frozenset(k.name for k in KINDS.values() if k.note)
_ORDER = {name: i for i, name in enumerate(KINDS)}


def order(kind: str) -> int:
    """Where rows of ``kind`` go in every listing (unknown kinds last)."""
    return _ORDER.get(kind, len(_ORDER))


def row_order(row: Any) -> tuple[int, int, int, str]:
    """How every listing sorts a report's op rows: by section (:func:`sections`), the most host time first (what
    slowed the window), then the most calls."""
    at = SECTION_OF.get(row.kind)
    return (len(KINDS) + order(row.kind) if at is None else at), -row.host_ns, -row.count, row.op


def title(kind: str) -> str:
    return KINDS[kind].title if kind in KINDS else kind


def sections() -> tuple[tuple[Kind, frozenset[str]], ...]:
    """How reports group their rows: error-level kinds first, each in its own section, then every kind that ran off
    the device in one section (titled by the first of them: CPU fallbacks, host ops marked as such), then each other
    reported kind in its own, in table order."""
    return _SECTIONS


def section_of(kind: str) -> int | None:
    """Where in :func:`sections` the rows of ``kind`` are listed (None: in no section)."""
    return SECTION_OF.get(kind)


def _sections() -> tuple[tuple[Kind, frozenset[str]], ...]:
    errors = [(k, frozenset({k.name})) for k in KINDS.values() if k.reported and k.error]
    off = [k for k in KINDS.values() if k.off_device and k.reported]
    rest = [(k, frozenset({k.name})) for k in KINDS.values() if k.reported and not k.off_device and not k.error]
    return tuple(errors + ([(off[0], frozenset(k.name for k in off))] if off else []) + rest)


_SECTIONS = _sections()  # the table is fixed at import: every report and every sort reads these
SECTION_OF = {name: i for i, (_, members) in enumerate(_SECTIONS) for name in members}  # section_of's table


def as_json() -> list[dict[str, Any]]:
    """The table as the widget's frontend reads it, in display order."""
    return [asdict(k) for k in KINDS.values()]
