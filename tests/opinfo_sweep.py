"""OpInfo conformance sweep: PyTorch's own ``op_db`` in float32 on `neuron`, compared with the CPU.

Each OpInfo entry that supports float32 on the CPU runs its CPU sample inputs (up to MAX_SAMPLES) on
the CPU, then the same values on `neuron` under the same seed, and compares outputs and the input after
the call (in-place ops) with assert_close at the OpInfo's own float32 tolerances. The device copies
keep each tensor's storage, offset and strides, and arguments that the entry's own `neuron` samples keep
on the CPU (tensor_split's indices) stay there. An entry is ``cpu_error`` when no sample runs on the
CPU (outside the rate's denominator), ``pass`` when every sample agrees, ``fail`` on a mismatch and
``error`` when the device raises. ``tests/test_opinfo_conformance.py`` runs it in shards; for the
full report::

    python tests/opinfo_sweep.py --out out/opinfo.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import os
import random
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from time_limit import time_limit  # noqa: E402  (tools/ is not a package: one deadline for every sweep)

MAX_SAMPLES = 200  # per entry: all samples of all but a few entries (max_pool2d has 1440)
SAMPLE_TIMEOUT_S = 20.0
SEED = 1234
DTYPE = torch.float32
KNOWN_FAILURES = Path(__file__).with_name("opinfo_known_failures.txt")
STATUSES = ("pass", "fail", "error", "cpu_error")
# Ops whose result is uninitialised memory by definition: only shape, dtype and strides can agree.
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                           "empty_permuted"})


@dataclass
class EntryResult:
    """The verdict on one OpInfo entry."""

    key: str
    status: str  # one of STATUSES
    detail: str = ""  # exception type and first message line, or the mismatch summary
    samples: int = 0  # samples compared on the device
    seconds: float = 0.0


class SampleTimeout(Exception):
    """A sample ran past SAMPLE_TIMEOUT_S."""


def entry_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def entries() -> list:
    """The OpInfo entries that declare float32 support on the CPU, in op_db's (stable) order."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if DTYPE in op.supported_dtypes("cpu")]


def shard_of(ops: list, shard: int, nshards: int) -> list:
    """Every ``nshards``-th entry from ``shard``: neighbours in op_db (similar cost) spread out."""
    return ops[shard::nshards]


def load_known_failures(path: Path = KNOWN_FAILURES) -> dict[str, str]:
    """``key  # reason`` lines -> {key: reason}; blank lines and whole-line comments are ignored."""
    known: dict[str, str] = {}
    for line in path.read_text().splitlines():
        body, _, reason = line.partition("#")
        key = body.strip()
        if key:
            if not reason.strip():
                raise ValueError(f"{path.name}: {key!r} has no reason")
            known[key] = reason.strip()
    return known


def _time_limit(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Raise SampleTimeout in a sample still running past ``seconds``."""
    return time_limit(seconds, SampleTimeout, "sample")


def _map(x: Any, fn, key: str | None = None) -> Any:
    """Apply ``fn(value, key)`` to the leaves of nested lists, tuples and dicts."""
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        items = [_map(v, fn) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        return {k: _map(v, fn, k) for k, v in x.items()}
    return fn(x, key)


def _same_layout(t: torch.Tensor) -> torch.Tensor:
    """``t`` on `neuron` with its whole storage, offset and strides, so views and as_strided see the same bytes."""
    if t.layout != torch.strided or t.is_conj() or t.is_neg():
        return t.to("neuron")
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
    return whole.to("neuron").as_strided(t.shape, t.stride(), t.storage_offset())


def _to_device(x: Any, like: Any, key: str | None = None) -> Any:
    """The CPU sample value ``x`` for `neuron`; ``like`` is the same leaf of the sample generated for `neuron`.

    Values always come from the CPU sample, so both runs see identical inputs; placement follows the
    device's own sample, which keeps on the CPU what an op requires there (tensor_split's indices).
    """
    if isinstance(x, torch.Tensor):
        if isinstance(like, torch.Tensor) and like.device.type == "cpu":
            return x.clone()
        return _same_layout(x)
    if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
        likes = like if isinstance(like, (list, tuple)) and len(like) == len(x) else [None] * len(x)
        items = [_to_device(v, lv) for v, lv in zip(x, likes)]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    if isinstance(x, dict):
        likes = like if isinstance(like, dict) else {}
        return {k: _to_device(v, likes.get(k), k) for k, v in x.items()}
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("neuron")
    if key == "device" and x == "cpu":
        return "neuron"
    return x


def _sample_to_device(s, like):
    c = copy.copy(s)
    c.input = _to_device(s.input, getattr(like, "input", None))
    c.args = _to_device(s.args, getattr(like, "args", None))
    c.kwargs = _to_device(s.kwargs, getattr(like, "kwargs", None))
    return c


def _cpu_leaf(v: Any, key: str | None) -> Any:
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, torch.device):
        return v.type  # compared by kind; the device itself necessarily differs
    return v


def _meta_leaf(v: Any, key: str | None) -> Any:
    return (tuple(v.shape), v.dtype, v.stride()) if isinstance(v, torch.Tensor) else _cpu_leaf(v, key)


# assert_close's default (atol, rtol) per dtype.
DEFAULT_TOLERANCES = {torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7)}


def tolerances(op, dtype: torch.dtype = DTYPE) -> tuple[float, float]:
    """(atol, rtol): assert_close's defaults for ``dtype``, widened by the OpInfo's own device-independent overrides."""
    from torch.testing._internal.common_device_type import toleranceOverride

    atol, rtol = DEFAULT_TOLERANCES[dtype]
    for info in op.decorators:
        if getattr(info, "device_type", None) is not None or dtype not in (getattr(info, "dtypes", None) or [dtype]):
            continue
        for dec in getattr(info, "decorators", [info]):
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                atol, rtol = max(atol, dec.d[dtype].atol), max(rtol, dec.d[dtype].rtol)
    return atol, rtol


def _seed() -> None:
    """What ``torch.manual_seed`` does here (CPU and `neuron` generators), at a fraction of its cost.

    On a build without CUDA, every ``torch.manual_seed`` formats the caller's stack for CUDA's, XPU's and MTIA's
    lazy-init queues: milliseconds under pytest's deep stacks, and the sweep seeds about 40,000 times. Python's
    ``random`` too: some sample generators draw from it (hinge_embedding_loss's margin), and runs must see the same.
    """
    random.seed(SEED)
    _manual_seed(SEED)


def _manual_seed(seed: int) -> torch.Generator:
    """``torch.manual_seed`` for the generators this process has: the CPU's and every `neuron` device's."""
    torch.neuron.manual_seed_all(seed)
    return torch.default_generator.manual_seed(seed)


def _call(op, sample) -> tuple[Any, Any]:
    """(output, the input after the call): in-place and out-writing ops are judged by both."""
    _seed()
    with _time_limit(SAMPLE_TIMEOUT_S):
        out = op(sample.input, *sample.args, **sample.kwargs)
    return out, sample.input


def _compare(op, sample, got: tuple[Any, Any], want: tuple[Any, Any], dtype: torch.dtype = DTYPE) -> None:
    """Raise unless ``got`` agrees with ``want`` at ``dtype``'s tolerances for ``op``."""
    if op.name in UNINITIALISED:
        got_meta, want_meta = _map(got, _meta_leaf), _map(want, _meta_leaf)
        assert got_meta == want_meta, f"metadata differs: {got_meta} != {want_meta}"
        return
    process = sample.output_process_fn_grad
    got = (process(_map(got[0], _cpu_leaf)), _map(got[1], _cpu_leaf))
    want = (process(want[0]), want[1])
    atol, rtol = tolerances(op, dtype)
    torch.testing.assert_close(_map(got, _cpu_leaf), _map(want, _cpu_leaf), atol=atol, rtol=rtol, equal_nan=True)


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300] if msg else ''}"


def _samples(op, device: str, max_samples: int, dtype: torch.dtype = DTYPE) -> list:
    """The first ``max_samples`` of what ``op.sample_inputs(device, dtype, set_seed=False)`` yields.

    Its generator is called directly: ``sample_inputs`` wraps it in an iterator that looks for a unittest
    test function up the caller's stack (``inspect.stack()``, which walks every module in ``sys.modules`` per frame):
    two thirds of a shard's CPU time under pytest, for samples that are the same without it.
    """
    _seed()
    with _time_limit(SAMPLE_TIMEOUT_S):
        return list(itertools.islice(op.sample_inputs_func(op, device, dtype, False), max_samples))


def run_entry(op, max_samples: int = MAX_SAMPLES) -> EntryResult:
    """Compare the first ``max_samples`` CPU samples of ``op`` on `neuron` against the CPU."""
    key = entry_key(op)
    t0 = time.perf_counter()

    def result(status: str, detail: str = "", n: int = 0) -> EntryResult:
        return EntryResult(key, status, detail, n, round(time.perf_counter() - t0, 4))

    try:
        samples = _samples(op, "cpu", max_samples)
    except Exception as e:  # noqa: BLE001  (the generator failing on the CPU is a CPU-side verdict)
        return result("cpu_error", "sample_inputs: " + _first_line(e))
    try:
        likes = _samples(op, "neuron", max_samples)
    except Exception as e:  # noqa: BLE001  (making the same samples on the device is part of conformance)
        return result("error", "sample_inputs on neuron: " + _first_line(e))
    likes += [None] * (len(samples) - len(likes))
    pairs, cpu_failure = [], ""
    for s, like in zip(samples, likes):
        try:
            device_sample = _sample_to_device(s, like)  # before the CPU call, which may mutate its inputs
        except Exception as e:  # noqa: BLE001
            return result("error", "moving the sample to neuron: " + _first_line(e), len(pairs))
        try:
            pairs.append((s, device_sample, _call(op, s)))
        except Exception as e:  # noqa: BLE001
            cpu_failure = _first_line(e)
    if not pairs:
        return result("cpu_error", cpu_failure or "no samples")
    for i, (s, device_sample, want) in enumerate(pairs):
        try:
            got = _call(op, device_sample)
        except Exception as e:  # noqa: BLE001
            return result("error", f"sample {i}: {_first_line(e)}", i)
        try:
            _compare(op, s, got, want)
        except Exception as e:  # noqa: BLE001  (a mismatch, or results of different structure)
            return result("fail", f"sample {i}: {_first_line(e)}", i)
    return result("pass", "", len(pairs))


def single_threaded(run: Callable[[Any], EntryResult], items: list) -> list[EntryResult]:
    """``run`` over ``items`` single-threaded (deterministic reductions, no oversubscription under xdist)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # OpInfo's random ops seed with torch.manual_seed on every call (wrapper_set_seed): the same seeding, cheaper
    seeding, torch.manual_seed = torch.manual_seed, _manual_seed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [run(item) for item in items]
    finally:
        torch.manual_seed = seeding
        torch.set_num_threads(threads)


def sweep(ops: list, max_samples: int = MAX_SAMPLES) -> list[EntryResult]:
    """Every entry's verdict, in order."""
    return single_threaded(lambda op: run_entry(op, max_samples), ops)


def summarize(results: list[EntryResult]) -> dict[str, Any]:
    """Counts, the rate over entries that pass on the CPU, and every non-passing entry."""
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    cpu_ok = len(results) - counts["cpu_error"]
    return {
        "total": len(results),
        "cpu_ok": cpu_ok,
        "pass": counts["pass"],
        "fail": counts["fail"],
        "error": counts["error"],
        "cpu_error": counts["cpu_error"],
        "rate": counts["pass"] / cpu_ok if cpu_ok else 0.0,
        "seconds": round(sum(r.seconds for r in results), 2),
        "entries": {r.key: {"status": r.status, "detail": r.detail}
                    for r in results if r.status != "pass"},
    }


Summary = Callable[[list[EntryResult]], dict[str, Any]]  # a sweep's report of its results


def problems(results: list[EntryResult], known: dict[str, str], known_file: str,
             expected_cpu_errors: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Every way ``results`` differ from the lists: an unlisted failure, a listed entry that passes, an unexpected
    CPU error and an expected one that ran. Only the entries swept are judged, so shards can check their share."""
    keys = {r.key for r in results}
    failing = {r.key: f"{r.status}: {r.detail}" for r in results if r.status in ("fail", "error")}
    cpu_errors = {r.key: r.detail for r in results if r.status == "cpu_error"}
    found = [f"unexpected {k} -- {v}" for k, v in failing.items() if k not in known]
    found += [f"listed in {known_file} but passes now: {k}" for k in known if k in keys and k not in failing]
    found += [f"unexpected CPU error {k} -- {v}" for k, v in cpu_errors.items() if k not in expected_cpu_errors]
    found += [f"expected a CPU error, but it ran: {k}" for k in expected_cpu_errors
              if k in keys and k not in cpu_errors]
    return found


def check_lists(ops: list, known: dict[str, str], expected_cpu_errors: dict[str, str], floor: float,
                minimum: int) -> None:
    """A sweep's lists name real entries, each once, and fix a rate at or over ``floor`` (of more than ``minimum``
    entries that run on the CPU)."""
    keys = {entry_key(op) for op in ops}
    assert sorted(set(known) - keys) == []
    assert sorted(set(expected_cpu_errors) - keys) == []
    assert sorted(set(known) & set(expected_cpu_errors)) == []
    cpu_ok = len(ops) - len(expected_cpu_errors)
    assert cpu_ok > minimum
    assert (cpu_ok - len(known)) / cpu_ok >= floor


def sweep_shard(run: Callable[[list], list[EntryResult]], entries: list, path: Path, known: dict[str, str],
                known_file: str, expected_cpu_errors: dict[str, str], summary: Summary = summarize,
                **facts: Any) -> None:
    """Sweep a shard's ``entries`` with ``run`` and write its report (``summary``'s, with ``facts`` and its wall time)
    to ``path``; fail unless its verdicts are exactly the lists' (see ``problems``)."""
    t0 = time.perf_counter()
    results = run(entries)
    report = summary(results)
    report.update(facts, wall_seconds=round(time.perf_counter() - t0, 2))
    write_json(path, report)
    found = problems(results, known, known_file, set(expected_cpu_errors))
    assert not found, "\n".join(found)
    assert report["pass"] == report["cpu_ok"] - sum(r.key in known for r in results)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so a reader in another process never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def run_cli(argv: list[str] | None, doc: str, default_out: str, all_entries: Callable[[], list],
            run: Callable[[list, int], list[EntryResult]], max_samples: int, known_file: Path,
            summary: Summary = summarize) -> dict[str, Any]:
    """A sweep's command line: --out, --samples, --only; runs the entries chosen, publishes and returns the report."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(default_out))
    p.add_argument("--samples", type=int, default=max_samples)
    p.add_argument("--only", nargs="*", help="entry keys to run (default: all)")
    a = p.parse_args(argv)
    ops = [op for op in all_entries() if not a.only or entry_key(op) in a.only]
    t0 = time.perf_counter()
    report = summary(run(ops, a.samples))
    report["wall_seconds"] = round(time.perf_counter() - t0, 2)
    known = load_known_failures(known_file)
    report["unexpected"] = sorted(k for k, v in report["entries"].items()
                                  if v["status"] in ("fail", "error") and k not in known)
    publish(a.out, report)
    return report


def main(argv: list[str] | None = None) -> int:
    run_cli(argv, __doc__, "out/opinfo.json", entries, sweep, MAX_SAMPLES, KNOWN_FAILURES)
    return 0


def publish(path: Path, report: dict[str, Any]) -> None:
    """Write a sweep's report and print its verdicts and counts."""
    write_json(path, report)
    for k, v in sorted(report["entries"].items()):
        print(f"{v['status']:9} {k}: {v['detail']}")
    print({k: report[k] for k in ("total", "cpu_ok", "pass", "fail", "error", "cpu_error", "rate", "wall_seconds")})


if __name__ == "__main__":
    raise SystemExit(main())
