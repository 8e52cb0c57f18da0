"""``%%neuron parity`` / ``neuron_lab.parity``: the code on its device, then on a reference device, compared.

The device run is the real one: it works on the user's objects and leaves what a plain run leaves.
The reference run works on copies of everything the code reads, moved to the reference device, and
runs eagerly; afterwards every name, and every random generator, is put back. The reference run's random
ops give back what the device run's drew (:mod:`neuron_lab.checks.randomness`); where the two stop drawing
alike, the reference draws from the generator states the device run started from (``--seed S`` first seeds
every device with ``S``), with the device's generator replayed on the CPU's when the cell drew from the
device's only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_lab import backend as _backend
from neuron_lab import interrupts, modes
from neuron_lab.checks import agreement, copies, limits, randomness, runs
from neuron_lab.report.checks import ParityResult
from neuron_lab.session.devices import parse_device
from neuron_lab.trace.sites import Locator


@dataclass(frozen=True)
class ParityOptions:
    """A parity check's options, checked as they are made: a ``ValueError`` (:class:`limits.OptionError`, or
    :class:`~neuron_lab.session.devices.DeviceError` for ``against``) names the first one out of bounds."""

    against: torch.device | str = torch.device("cpu")  # the reference device; a device string is parsed
    rtol: float | None = None  # both or neither, as torch.testing.assert_close
    atol: float | None = None
    vars: tuple[str, ...] = ()  # compare only these names
    seed: int | None = None  # torch.manual_seed(seed) before the device run; None: the generators as they are

    def __post_init__(self) -> None:
        if not isinstance(self.against, torch.device):
            object.__setattr__(self, "against", parse_device(str(self.against)))
        limits.tolerances(self.rtol, self.atol)
        limits.names(self.vars)
        limits.seed(self.seed)


def downcast_emulated() -> bool:
    """Whether the device computes 64-bit ops in 32 bits (the backend knows; no backend: it does not)."""
    return _backend.is_active() and _backend.active().computes_64bit_in_32bit


@dataclass
class Downcasts:
    """The 64-bit op calls a run made (the backend reports them as downcast events)."""

    calls: int = 0
    ops: dict[str, None] = field(default_factory=dict)

    def __call__(self, event: Any, args: tuple, kwargs: dict) -> None:
        self.calls += 1
        self.ops.setdefault(event.name)

    @contextlib.contextmanager
    def watching(self):
        if not _backend.is_active():
            yield self
            return
        from neuron_lab.kinds import DOWNCAST

        unsubscribe = _backend.active().subscribe(self, frozenset({DOWNCAST}))
        try:
            yield self
        finally:
            unsubscribe()


def coverage_name() -> str | None:
    if not _backend.is_active():
        return None
    c = _backend.active().coverage
    return c.name if c is not None else None


def _op_calls() -> int:
    return _backend.active().op_calls() if _backend.is_active() else 0


@interrupts.guard
def check(subject: runs.Subject, device: torch.device, options: ParityOptions, *, locator: Locator,
          exclude: Callable[[], Any] = contextlib.nullcontext,
          keep: Callable[[ParityResult], None] | None = None) -> ParityResult:
    """Run ``subject`` on ``device`` for real, then on copies on ``options.against``; compare.

    ``keep`` gets the result as soon as it exists, also when the device run raised: that exception
    then propagates, as it would from a plain run.
    """
    __tracebackhide__ = True  # noqa: F841
    reference = options.against
    before = dict(subject.namespace)
    types = {device.type, reference.type}
    with exclude():  # the check's own work, here and after the device run: the cell's report is its code's alone
        copied = copies.copy_state(before, subject.names(), device, reference)
        if options.seed is not None:
            torch.manual_seed(options.seed)  # every device's generator
        start = runs.RngState.now(types)
    downcasts = Downcasts()
    with downcasts.watching(), randomness.recording(exclude) as recorder:
        try:
            actual = runs.run(subject, locator=locator, exclude=exclude)
        except Exception as e:
            actual = runs.Run(dict(subject.namespace), error=e)
    with exclude():
        notes: list[str] = []
        ops_before = _op_calls()
        with runs.rng_preserved(types) as after, randomness.replaying(recorder) as replayer:
            cpu_state = _replay(start, after, device, reference, notes, seeded=options.seed is not None)
            expected = runs.run(subject, rng=lambda: start.restore(cpu_state), ns={**before, **copied.values},
                                device=reference, source=device, mode=modes.EAGER, locator=locator, exclude=exclude)
        stray = _op_calls() - ops_before if reference.type != device.type and device.type == "neuron" else 0
        drawn = randomness.summary(recorder, replayer)
        a = agreement.build(subject, before, actual, expected, (str(device), str(reference)), names=options.vars,
                            rtol=options.rtol, atol=options.atol)
        a.shared = copied.shared
        if not drawn.complete:  # how the generators were lined up matters only for the draws not replayed
            a.notes += notes
        if recorder.attention:
            a.notes.append(_attention_note(recorder, device, reference))
        if stray:
            var = f"the `{subject.device_variable}` variable" if subject.device_variable else "its arguments"
            a.notes.append(f"the {reference} run still ran {stray:,} ops on {device.type}: the code names that device "
                           f"itself instead of using {var}")
        result = ParityResult(str(device), str(reference), options.seed, a, options.rtol, options.atol, actual.seconds,
                              expected.seconds, downcast_emulated(), downcasts.calls, list(downcasts.ops),
                              coverage_name(), randomness=drawn)
    if keep is not None:
        keep(result)
    if actual.error is not None:
        outcome = f"raised too: {a.expected_error}" if expected.error is not None else "ran without error"
        actual.error.add_note(f"neuron_lab parity: the {device} run raised; the {reference} reference run {outcome}")
        raise actual.error
    return result


def _attention_note(recorder: randomness.Recorder, device: torch.device, reference: torch.device) -> str:
    return (f"the {device} run computed attention with {', '.join(recorder.attention)}, a fused kernel; the "
            f"{reference} run with the kernel its SDPA picks there (on the CPU: flash without dropout, math with): "
            f"what follows attention can differ by the fused kernel's rounding" + _attention_dropout(recorder))


def _attention_dropout(recorder: randomness.Recorder) -> str:
    """What became of the fused attention kernel's dropout: handed to the reference's math kernel, or not."""
    draws = [d for d in recorder.draws if d.op in recorder.attention]
    if not draws:
        return ""
    if all(d.is_dropout for d in draws):
        return ", and the reference's math kernel was given the dropout masks the fused kernel drew"
    return ", and its dropout was drawn inside the kernel, so the reference could not replay it"


def _replay(start: runs.RngState, after: runs.RngState, device: torch.device, reference: torch.device,
            notes: list[str], seeded: bool) -> torch.Tensor | None:
    """The CPU generator state that lets a CPU reference draw what the device run drew.

    Draws from the device's generator in the device run come from the CPU generator in a CPU reference
    run, so that one starts where the device's did, when only the device's was drawn from.
    """
    cpu_drawn, devs = start.drawn(after)
    if reference.type != "cpu" or device.type not in devs:
        return None
    if cpu_drawn:
        if not seeded:
            notes.append(f"the cell drew random numbers from both the CPU's and {device.type}'s generators; the "
                         f"{reference} run replays the CPU's only (`--seed S` starts both from one seed)")
        return None
    state = start.devices[device.type]
    try:
        with runs.rng_preserved(set()):
            torch.set_rng_state(state)
    except (RuntimeError, TypeError, ValueError):
        notes.append(f"{device.type}'s random generator cannot be replayed on the CPU: random draws differ")
        return None
    return state


def device_of(ns: dict[str, Any], default: torch.device) -> torch.device:
    """The first non-CPU device among the tensors ``ns`` holds, else ``default``."""
    for obj in ns.values():
        for t in copies.tensors(obj):
            if t.device.type != "cpu":
                return t.device
    return default
