"""How good the fallback predictions are: TorchNeuron's own expected upstream failures against the op coverages.

TorchNeuron lists 708 PyTorch upstream tests it expects to fail on `neuron` (bundled in
``coverage/evidence/torchneuron-src-2026-04.json`` by ``tools/derive_profile.py``). A test counts as predicted when,
for the op and dtypes it exercises, a coverage classifies the call as not native (CPU fallback or host op), or one
of its dtypes is a 64-bit dtype the device downcasts. The op is read from the test's name (``test_ReflectionPad_…``
-> ``aten::reflection_pad*``): the longest op a backend can see whose name starts the snake-cased test name.
No torch device is used: this reads data only. ``bench/upstream_agreement.py`` measures the same by running the
tests on the emulator (it needs PyTorch's test files); this reading is its fallback without them.

    python bench/prediction_agreement.py                 # share per coverage, and per test class
    python bench/prediction_agreement.py --misses 20     # the first unpredicted tests
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from importlib import resources
from pathlib import Path

from neuron_lab.backend import coverage
from neuron_lab.kinds import NATIVE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from derive_profile import op_of  # noqa: E402  (the one reading of an op from a test's name)

EVIDENCE = "evidence/torchneuron-src-2026-04.json"
COVERAGES = ("torchneuron-2.33", "torchneuron-src-2026-04", "torchneuron-combined")  # combined: fitted in part on
# these same expectations (an op whose dtype-named upstream tests fail is `possible`), so its share is not a test


def expectations() -> list[dict]:
    return json.loads(resources.files("neuron_lab.backend.coverage").joinpath(EVIDENCE).read_text())["expectations"]


def predicted(cov: coverage.Coverage, op: str | None, dtypes: list[str]) -> str | None:
    """Why the coverage predicts the test's failure (``fallback``/``host``, ``downcast``), or None."""
    if cov.downcast_dtypes & set(dtypes):
        return "downcast"
    if op is not None:
        kind, _ = cov.classify(op, frozenset(dtypes))
        return None if kind == NATIVE else kind
    kinds = {cov.dtype_rules[d].kind for d in dtypes if d in cov.dtype_rules}
    return next(iter(kinds - {NATIVE}), None)


def measure(names: tuple[str, ...] = COVERAGES) -> dict:
    rows = expectations()
    ops = coverage.backend_ops()
    named = [(r, op_of(r["test"], ops)) for r in rows]
    covs = [coverage.load(n) for n in names]
    out: dict = {"tests": len(rows), "with_op": sum(1 for _, op in named if op), "coverages": {}}
    for name, cov in [*zip(names, covs), ("either", None)]:
        why = Counter()
        per_class: Counter = Counter()
        misses = []
        for r, op in named:
            found = ([predicted(c, op, r["dtypes"]) for c in covs] if cov is None
                     else [predicted(cov, op, r["dtypes"])])
            reason = next((f for f in found if f), None)
            if reason:
                why[reason] += 1
                per_class[r["class"]] += 1
            else:
                misses.append(r["test"])
        hit = sum(why.values())
        out["coverages"][name] = {"predicted": hit, "share": hit / len(rows), "why": dict(why),
                                  "per_class": dict(per_class), "misses": misses}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--misses", type=int, default=0, help="print the first N unpredicted tests")
    ap.add_argument("--json", help="write the measurement here")
    args = ap.parse_args(argv)
    m = measure()
    print(f"{m['tests']} expected upstream failures; an op read from the name for {m['with_op']}")
    for name, c in m["coverages"].items():
        print(f"{name:26} predicted {c['predicted']:4} ({c['share']:.1%})  {c['why']}")
    if args.misses:
        print("\n".join(m["coverages"]["either"]["misses"][:args.misses]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(m, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
