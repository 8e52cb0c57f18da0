"""How good the fallback predictions are, measured by running: TorchNeuron's expected upstream failures on the emulator.

TorchNeuron expects 708 PyTorch upstream tests of six device-generic classes to fail on `neuron` (bundled in
``coverage/evidence/torchneuron-src-2026-04.json``). This script runs those classes on the emulator's `neuron`
as PyTorch runs them for a PrivateUse1 device (``instantiate_device_type_tests`` makes ``<Class>PRIVATEUSE1``
with tests named ``…_neuron…``), one subprocess per chunk of tests with a deadline, and records per test what the
backend's ``subscribe`` reported: every op it ran and its kind under the active coverage (default
``torchneuron-combined``). It counts:

- recall: of the expected failures that ran, the share where the emulator reported a predicting kind (CPU
  fallback or host op: certain; possible fallback; 64-bit downcast; unsupported) for an op the test ran;
- flag rate: the same share on the tests of the same classes TorchNeuron does NOT expect to fail;
- fidelity: how many expected failures fail on the emulator too, and how many other tests fail there only.

Each count is made over every op a test ran and over its own calls (``own``: not those ``make_tensor`` makes to
build its inputs, nor ``assert_close`` to compare its results: random fills are documented CPU fallbacks).

PyTorch's test files are not in the torch wheel and stay out of this repository: ``--pytorch-tests DIR`` names a
PyTorch checkout's ``test/`` (the version matching the installed torch where possible; the tests' names must
match TorchNeuron's lists, and the JSON says how many did). Without it the script prints the name-reading
figure of ``bench/prediction_agreement.py`` instead, and says so.

    python bench/upstream_agreement.py --pytorch-tests ../pytorch/test --out out/upstream.json \\
        --figures out/upstream_figures.json     # all six classes: 1,400 tests, about 30 min on 2 shared cores
    python bench/upstream_agreement.py --pytorch-tests … --classes TestScatterGather --others 50
    python bench/upstream_agreement.py --summary out/upstream.json --misses   # recount a run, list its misses
    python bench/upstream_agreement.py --summary out/nn.json out/rest.json    # two runs of other classes as one
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import unittest
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

from figures import figure, write  # bench/ is the script directory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from time_limit import time_limit  # noqa: E402  (tools/ is not a package: one deadline for every sweep)

from neuron_lab.kinds import DOWNCAST, FALLBACK, HOST, NATIVE, POSSIBLE, UNSUPPORTED

FILES = {"TestNNDeviceType": "test_nn", "TestTensorCreation": "test_tensor_creation_ops",
         "TestRandomTensorCreation": "test_tensor_creation_ops", "TestLikeTensorCreation": "test_tensor_creation_ops",
         "TestViewOps": "test_view_ops", "TestScatterGather": "test_scatter_gather_ops"}  # class: its upstream module
GROUPS = {"certain": (FALLBACK, HOST), "possible": (POSSIBLE,), "downcast": (DOWNCAST,),
          "unsupported": (UNSUPPORTED,)}  # how a flag is counted: each group holds the kinds that predict
PREDICTING = frozenset(k for kinds in GROUPS.values() for k in kinds)
FAILED = ("fail", "error", "timeout")  # outcomes where the test did not pass on the emulator
HARNESS = tuple(os.path.join("torch", "testing", f) for f in ("_creation.py", "_comparison.py"))  # make_tensor,
# assert_close: the calls every test makes to build its inputs and compare its results, whatever it tests
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Timeout|Failure|Interrupt)\b")
TEST_TIMEOUT_S = 30.0
CHUNK = 150  # tests per worker process: what one test leaks stays in its chunk
WHAT = {"ops": "every op the test ran", "own": "the test's own calls (not make_tensor's, not assertEqual's)"}
TARGET_MISS = 20.0  # the target, recall >= 80%, as the share of expected failures not predicted (at most)


class TestTimeout(Exception):
    """A test ran past its deadline."""


def expectations() -> list[dict]:
    from prediction_agreement import expectations as rows

    return rows()


# -- the worker: one chunk of one class, in its own process ---------------------------------------------------------
def instantiated(module: str, cls: str) -> type:
    """``cls`` of the upstream ``module`` as instantiated for the PrivateUse1 device (the emulator is active first,
    so PyTorch's device-type bases include PrivateUse1TestBase)."""
    import importlib

    os.environ.setdefault("PYTORCH_TESTING_DEVICE_ONLY_FOR", "privateuse1")
    import neuron_lab.backend as backend

    backend.activate()
    mod = importlib.import_module(module)
    # PyTorch names the first class of a module for "privateuse1" and, once its base's setUpClass has run, the
    # next ones for the backend's name
    return next(getattr(mod, cls + suffix) for suffix in ("PRIVATEUSE1", "NEURON") if hasattr(mod, cls + suffix))


def outcome(result: unittest.TestResult) -> tuple[str, str]:
    """One test's verdict and why: the exception's line of the traceback (or the skip's reason)."""
    for name, items in (("timeout", [e for e in result.errors if "TestTimeout" in e[1]]), ("error", result.errors),
                        ("fail", result.failures), ("skip", result.skipped), ("xfail", result.expectedFailures)):
        if items:
            lines = items[0][1].strip().splitlines()
            why = next((x for x in reversed(lines) if _EXCEPTION.match(x)), lines[-1] if lines else "")
            return name, why[:200]
    return ("xpass", "") if result.unexpectedSuccesses else ("pass", "")


def _from_harness() -> bool:
    """Whether the op being reported was called by PyTorch's test harness (make_tensor building the inputs,
    assertEqual comparing the results) rather than by the test's own code."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith(HARNESS):
            return True
        f = f.f_back
    return False


def run_tests(test_class: type, names: list[str], timeout_s: float = TEST_TIMEOUT_S) -> Iterator[dict]:
    """Run each test alone, yielding its verdict and what the backend reported while it ran: ``ops`` maps each
    kind to the ops (``aten::name``) of that kind, ``own`` the same for the calls the harness did not make."""
    import neuron_lab.backend as backend

    seen: dict[str, set[str]] = defaultdict(set)
    own: dict[str, set[str]] = defaultdict(set)

    def record(ev, args, kwargs) -> None:
        seen[ev.kind].add(ev.name)
        if not _from_harness():
            own[ev.kind].add(ev.name)

    unsubscribe = backend.active().subscribe(record)
    try:
        for name in names:
            seen.clear()
            own.clear()
            result = unittest.TestResult()
            with contextlib.suppress(TestTimeout), time_limit(timeout_s, TestTimeout, "test"):
                unittest.TestSuite([test_class(name)]).run(result)
            verdict, detail = outcome(result)
            yield {"test": name, "outcome": verdict, "detail": detail,
                   "ops": {k: sorted(v) for k, v in sorted(seen.items())},
                   "own": {k: sorted(v) for k, v in sorted(own.items())}}
    finally:
        unsubscribe()


def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, args.pytorch_tests)
    test_class = instantiated(FILES[args.worker], args.worker)
    names = json.loads(Path(args.names).read_text())
    with open(args.out, "a") as out:
        for row in run_tests(test_class, names, args.test_timeout):
            out.write(json.dumps(row) + "\n")
            out.flush()
    return 0


# -- the driver: which tests, in which order, and the counting -------------------------------------------------------
def test_names(pytorch_tests: str, cls: str) -> list[str]:
    """The tests of ``cls`` instantiated for `neuron`, listed in a short subprocess (importing test_nn takes time)."""
    code = ("import json,sys; sys.path.insert(0, sys.argv[1]); from upstream_agreement import instantiated; "
            "c = instantiated(sys.argv[2], sys.argv[3]); "
            "print(json.dumps(sorted(n for n in dir(c) if n.startswith('test_') and '_neuron' in n)))")
    done = subprocess.run([sys.executable, "-c", code, pytorch_tests, FILES[cls], cls], capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).parent, env=_env())
    if done.returncode:
        raise RuntimeError(f"listing {cls} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def plan(cls: str, names: list[str], expected: set[str], others: int | None) -> list[str]:
    """The expected failures first (recall must not be cut by the deadline), then up to ``others`` of the rest,
    spread evenly over the sorted list."""
    rest = [n for n in names if n not in expected]
    if others is not None and others < len(rest):
        rest = [rest[i * len(rest) // others] for i in range(others)]
    return [n for n in names if n in expected] + rest


def run_chunk(cls: str, names: list[str], args: argparse.Namespace, stop: float, stem: Path) -> list[dict]:
    """Run ``names`` in worker processes until all ran or the deadline passed: a worker that dies marks the test it
    was running as a crash (with its exit status and last line of stderr), and a new worker goes on after it."""
    done: list[dict] = []
    while names and (left := stop - time.monotonic()) > 0:
        listed, rows = stem.with_suffix(".names.json"), stem.with_suffix(".jsonl")
        listed.write_text(json.dumps(names))
        rows.write_text("")
        cmd = [sys.executable, __file__, "--worker", cls, "--pytorch-tests", args.pytorch_tests,
               "--names", str(listed), "--out", str(rows), "--test-timeout", str(args.test_timeout)]
        try:
            proc = subprocess.run(cmd, timeout=left, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
            why = ": ".join([f"exit status {proc.returncode}", *proc.stderr.strip().splitlines()[-1:]])[:200]
        except subprocess.TimeoutExpired:
            why = ""
        ran = [json.loads(x) for x in rows.read_text().splitlines() if x.strip()]
        listed.unlink()
        rows.unlink()
        done += ran
        names = names[len(ran):]
        if names and why:
            done.append({"test": names[0], "outcome": "crash", "detail": why, "ops": {}, "own": {}})
            names = names[1:]
    return done


def run(args: argparse.Namespace) -> dict:
    rows = expectations()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = out.with_suffix(".jsonl")
    lines.write_text("")
    stop = time.monotonic() + args.deadline
    listed: dict[str, int] = {}
    for cls in args.classes:
        expected = {r["test"] for r in rows if r["class"] == cls}
        names = test_names(args.pytorch_tests, cls)
        listed[cls] = len(names)
        todo = plan(cls, names, expected, args.others)
        for i in range(0, len(todo), CHUNK):
            if time.monotonic() >= stop:
                break
            done = run_chunk(cls, todo[i:i + CHUNK], args, stop, out.with_suffix(f".{cls}.{i}"))
            with open(lines, "a") as f:
                f.writelines(json.dumps({"class": cls, **d}) + "\n" for d in done)
            print(f"{cls}: {i + len(done)}/{len(todo)} run", flush=True)
    ran = [json.loads(x) for x in lines.read_text().splitlines() if x.strip()]
    result = {"coverage": os.environ.get("NEURON_LAB_COVERAGE", "torchneuron-combined"),
              "pytorch_tests": args.pytorch_tests, "listed": listed, "tests": ran}
    out.write_text(json.dumps(result, indent=1))
    return result


def merged(results: list[dict]) -> dict:
    """Runs of different classes (run side by side, say) as one."""
    return {"coverage": results[0]["coverage"], "pytorch_tests": results[0]["pytorch_tests"],
            "listed": {c: n for r in results for c, n in r["listed"].items()},
            "tests": [t for r in results for t in r["tests"]]}


def _share(n: int, of: int) -> float:
    return 100.0 * n / of if of else 0.0


def summarize(result: dict, rows: list[dict] | None = None, field: str = "ops") -> dict:
    """Recall, flag rate and fidelity, in total and per class, from a run's per-test rows (``rows``: the expected
    failures, TorchNeuron's by default), counting the kinds of every op (``field="ops"``) or of the test's own
    calls (``"own"``)."""
    rows = expectations() if rows is None else rows
    expected = {(r["class"], r["test"]) for r in rows}
    per: dict[str, dict] = {}
    for cls in result["listed"]:
        per[cls] = {"expected": sum(1 for c, _ in expected if c == cls)}
    for part in [*per.values(), total := {"expected": len(expected)}]:
        part.update(ran_expected=0, predicted=0, skipped_expected=0, failed_expected=0, ran_others=0, flagged=0,
                    failed_others=0, by_group=Counter(), others_by_group=Counter())
    for t in result["tests"]:
        groups = [g for g, kinds in GROUPS.items() if any(t.get(field, {}).get(k) for k in kinds)]
        for part in (per[t["class"]], total):
            if (t["class"], t["test"]) in expected:
                if t["outcome"] in ("skip", "crash"):
                    part["skipped_expected"] += 1
                    continue
                part["ran_expected"] += 1
                part["predicted"] += bool(groups)
                part["failed_expected"] += t["outcome"] in FAILED
                part["by_group"].update(groups)
            elif t["outcome"] not in ("skip", "crash"):
                part["ran_others"] += 1
                part["flagged"] += bool(groups)
                part["failed_others"] += t["outcome"] in FAILED
                part["others_by_group"].update(groups)
    for cls, part in [*per.items(), ("all", total)]:
        run_here = cls in result["listed"] or cls == "all"
        part["missing"] = part["expected"] - part["ran_expected"] - part["skipped_expected"] if run_here else None
        part["recall"] = _share(part["predicted"], part["ran_expected"])
        part["flag_rate"] = _share(part["flagged"], part["ran_others"])
        part["recall_by_group"] = {g: _share(part["by_group"][g], part["ran_expected"]) for g in GROUPS}
        part["flag_rate_by_group"] = {g: _share(part["others_by_group"][g], part["ran_others"]) for g in GROUPS}
        part["by_group"], part["others_by_group"] = dict(part["by_group"]), dict(part["others_by_group"])
    return {"coverage": result.get("coverage"), "field": field, "total": total, "per_class": per}


def misses(result: dict, rows: list[dict] | None = None, field: str = "ops") -> list[dict]:
    """The expected failures that ran and were not predicted, with their verdict and the ops they ran."""
    expected = {(r["class"], r["test"]) for r in (expectations() if rows is None else rows)}
    return [t for t in result["tests"] if (t["class"], t["test"]) in expected
            and t["outcome"] not in ("skip", "crash") and not any(t.get(field, {}).get(k) for k in PREDICTING)]


def report(s: dict) -> None:
    print(f"coverage {s['coverage']}, {WHAT[s['field']]}: recall = expected failures predicted / expected failures "
          "that ran; flag rate = other tests flagged / other tests that ran")
    for cls, p in [*s["per_class"].items(), ("all", s["total"])]:
        print(f"{cls:26} recall {p['predicted']:3}/{p['ran_expected']:3} ({p['recall']:5.1f}%) "
              f"of {p['expected']:3} expected ({p['skipped_expected']} skipped, {p['missing']} not run here); "
              f"flag rate {p['flagged']:4}/{p['ran_others']:4} ({p['flag_rate']:5.1f}%); "
              f"fail here {p['failed_expected']:3} expected, {p['failed_others']:3} others")
        print(" " * 27 + "by kind, recall / flag rate: " + ", ".join(
            f"{g} {p['recall_by_group'][g]:.0f}%/{p['flag_rate_by_group'][g]:.0f}%" for g in GROUPS))


def figures_of(s: dict) -> list[dict]:
    t, of = s["total"], f" ({s['field']})"
    out = [figure("upstream expected failures not predicted, of those that ran" + of, [100.0 - t["recall"]], "%",
                  TARGET_MISS),
           figure("upstream expected failures not predicted, of all (not run: missed)" + of,
                  [100.0 - _share(t["predicted"], t["expected"])], "%", TARGET_MISS),
           figure("upstream other tests flagged" + of, [t["flag_rate"]], "%", None)]
    return out + [figure(f"{cls} expected failures predicted" + of, [p["recall"]], "%", None)
                  for cls, p in s["per_class"].items() if p["ran_expected"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pytorch-tests", help="a PyTorch checkout's test/ directory (not part of the torch wheel)")
    ap.add_argument("--classes", nargs="*", default=list(FILES), choices=list(FILES))
    ap.add_argument("--others", type=int, help="run at most this many of each class's other tests (default all)")
    ap.add_argument("--deadline", type=float, default=3600.0, help="seconds for the whole run; what ran is kept")
    ap.add_argument("--test-timeout", type=float, default=TEST_TIMEOUT_S)
    ap.add_argument("--out", default="out/upstream.json", help="per-test rows (JSON), kept out of the repository")
    ap.add_argument("--figures", help="write the figures here (bench/figures.py)")
    ap.add_argument("--summary", nargs="+", help="recount earlier --out files (runs of other classes: one count)")
    ap.add_argument("--misses", action="store_true", help="list the unpredicted expected failures and their ops")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--names", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.summary:
        result = merged([json.loads(Path(p).read_text()) for p in args.summary])
    elif args.pytorch_tests:
        result = run(args)
    else:
        print("no --pytorch-tests: PyTorch's test files are not in the torch wheel, so nothing was run; "
              "the figure below reads the op from each test's NAME (bench/prediction_agreement.py)")
        from prediction_agreement import main as by_name

        return by_name([])
    found = [summarize(result, field=field) for field in WHAT]
    for s in found:
        report(s)
    total = found[0]["total"]
    print(f"fail on the emulator too: {total['failed_expected']} of the {total['ran_expected']} expected failures "
          f"that ran; fail here only: {total['failed_others']} of the {total['ran_others']} other tests")
    if args.misses:
        for t in misses(result, field="own"):
            native = ",".join(o.removeprefix("aten::") for o in t["own"].get(NATIVE, []))
            print(f"{t['class']}.{t['test']} [{t['outcome']}] {t['detail'][:100]} | {native}")
    fidelity = figure("upstream expected failures failing on the emulator",
                      [_share(total["failed_expected"], total["ran_expected"])], "%", None)
    write(args.figures, [f for s in found for f in figures_of(s)] + [fidelity])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
