"""Derive the evidence behind fallback predictions from TorchNeuron's source tree.

``derive_coverage.py`` says which ops TorchNeuron registers. A registered op can still fall back per call: each
Python implementation's ``can_handle`` gates it on dtype, shape or empty tensors, and when none accepts the
arguments TorchNeuron runs the op on the CPU (``python_ops/base.py``). TorchNeuron's own run of PyTorch's upstream
tests lists the tests it expects to fail (``tests/pytorch_tests/failing_test_methods/<TestClass>.json``). This
script reads both statically (stdlib only) and writes one evidence file::

    python tools/derive_profile.py SOURCE_DIR --commit SHA -o OUT.json
    python tools/derive_profile.py --combine CERTAIN.json DERIVED.json EVIDENCE.json [--aborts ABORTS.json] \
        -o COMBINED.json

``--combine`` writes one coverage from the three: what the documented coverage (2.33's table) says does not run on
the device stays certain (``fallback``/``host``); an op the derived coverage says falls back, or that only gated
implementations serve for some dtypes (a gate naming the dtypes it accepts), becomes ``possible`` with its reason;
an op whose calls some arguments leave with no implementation gets those argument rules (``args``, ``possible``).
``--aborts`` adds the ops public reports saw abort the process when applied to a parameter
(``coverage/evidence/torchneuron-aborts.json``), each with the reports' URLs and the stack they were seen on.

Each gate is ``{"ops", "class", "path", "line", "dtypes", "conditions"}`` and what ``gate_residue.py`` adds: the ops
the class serves under TorchNeuron's overload names, by any registration (``None``: none; ``via``: how, ``order``:
the op's implementations by priority), per op where a call none takes goes (``residue``: ``cpu``, ``raises``,
``none``), and for a shape or empty-tensor gate a person's reading (``reading``, ``args``, ``used``). ``dtypes``
are the dtypes its ``can_handle`` names (``is_complex()`` counts as complex64 and complex128), ``conditions`` the
other things it tests (``empty``, ``shape``). Each expectation is ``{"class", "test", "dtypes"}``, the dtypes parsed
from the test name's ``_neuron_<dtype>`` suffix (empty when the test runs for no dtype).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derive_coverage import DEFAULT_REPO, NEURON_OP_DECORATORS, _call_name, _dotted, _first_arg, _strings  # noqa: E402
from gate_residue import residues  # noqa: E402

SCHEMA_VERSION = 1
OPS_DIR = "torch_neuronx/python_ops"
EXPECTATIONS_DIR = "tests/pytorch_tests/failing_test_methods"
DTYPES = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64", "int32",
          "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool")
COMPLEX = ("complex64", "complex128")
_SUFFIX = re.compile(r"_neuron((?:_(?:" + "|".join(DTYPES) + r"))*)$")
_CONDITIONS = {"numel": "empty", "dim": "shape", "ndim": "shape", "shape": "shape", "size": "shape"}


def _gate(cls: ast.ClassDef, fn: ast.FunctionDef, rel: str) -> dict:
    ops = [name for dec in cls.decorator_list if isinstance(dec, ast.Call) and _call_name(dec) in NEURON_OP_DECORATORS
           for name in _strings(_first_arg(dec, "aten_name", "operations") or ast.Constant(None))]
    dtypes: set[str] = set()
    conditions: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted.startswith("torch.") and dotted.removeprefix("torch.") in DTYPES:
                dtypes.add(dotted.removeprefix("torch."))
            elif node.attr == "is_complex":
                dtypes.update(COMPLEX)
            elif node.attr in _CONDITIONS:
                conditions.add(_CONDITIONS[node.attr])
    return {"ops": ops or None, "class": cls.name, "path": rel, "line": fn.lineno, "dtypes": sorted(dtypes),
            "conditions": sorted(conditions)}


def extract_gates(root: Path) -> list[dict]:
    """Every ``can_handle`` override in TorchNeuron's Python ops (the base class's own definition included)."""
    gates = []
    for path in sorted((root / OPS_DIR).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        try:
            tree = ast.parse(path.read_text(errors="replace"), filename=rel)
        except SyntaxError as e:
            print(f"derive_profile: skipping {rel}: {e}", file=sys.stderr)
            continue
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            gates += [_gate(cls, fn, rel) for fn in cls.body
                      if isinstance(fn, ast.FunctionDef) and fn.name == "can_handle"]
    return gates


def test_dtypes(test: str) -> list[str]:
    """``test_foo_neuron_complex64_float32`` -> ``["complex64", "float32"]``."""
    m = _SUFFIX.search(test)
    return [d for d in m.group(1).split("_") if d] if m else []


def extract_expectations(root: Path) -> list[dict]:
    """TorchNeuron's expected upstream failures, one row per test."""
    rows = []
    for path in sorted((root / EXPECTATIONS_DIR).glob("*.json")):
        for test in json.loads(path.read_text())["failed_tests"]:
            rows.append({"class": path.stem, "test": test, "dtypes": test_dtypes(test)})
    return rows


def derive(root: Path, *, commit: str, repo: str = DEFAULT_REPO) -> dict:
    gates = extract_gates(root)
    residues(root, gates)
    return {
        "schema_version": SCHEMA_VERSION,
        "provenance": {"repo": repo, "commit": commit, "gates_from": OPS_DIR, "expectations_from": EXPECTATIONS_DIR},
        "gates": gates,
        "expectations": extract_expectations(root),
    }


POSSIBLE = "possible"
_NOT_REGISTERED = "not registered in TorchNeuron's {date} source ({name}), so it may fall back"
_GATED = ("gated for {dtypes} in TorchNeuron's {date} source: {cls}.can_handle ({path}:{line}) accepts only "
          "{accepts}, so a call with another dtype may fall back")


_XFAILS = ("fails in {n} of TorchNeuron's own runs of PyTorch's upstream tests ({tests}), so it may fall back or "
           "differ from the CPU")
# A model's everyday dtypes: an upstream failure in one of them is rarely a fallback, and would flood every report.
_EVERYDAY = frozenset({"float32", "bfloat16", "float16", "int32", "int64", "bool", "complex32"})
_STEM = re.compile(r"^test_(.*?)_neuron(?:_\w+)?$")


def op_of(test: str, ops: Iterable[str]) -> str | None:
    """The op an upstream test exercises, read from its name: the longest op (``aten::name``) whose name starts the
    snake-cased test stem (``test_ReflectionPad_empty_neuron`` -> ``aten::reflection_pad`` if it is one)."""
    m = _STEM.match(test)
    stem = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", m.group(1)).lower() if m else ""
    best = max((op.removeprefix("aten::") for op in ops
                if stem == op.removeprefix("aten::") or stem.startswith(op.removeprefix("aten::") + "_")),
               key=len, default=None)
    return f"aten::{best}" if best else None


def _key(name: str) -> str:
    base = name.removeprefix("aten::").split(".", 1)[0]
    return "aten::" + (base[:-1] if base.endswith("_") and not base.endswith("__") else base)


_ARGS = ("{what}: no implementation of {op} in TorchNeuron's {date} source takes such a call ({gates}), so it may "
         "fall back to the CPU")


def _said(t: dict) -> str:
    """An argument test in words: ``dim is not the last dimension of self``."""
    v = t.get("value")
    return {"ndim_not_in": lambda: f"{t['arg']} is not {' or '.join(map(str, v or []))}-D",
            "not_last_dim": lambda: f"{t['arg']} is not the last dimension of {t.get('of')}",
            "below": lambda: f"{t['arg']} is below {v}", "is": lambda: f"{t['arg']} is {v}",
            "empty": lambda: f"{t['arg']} is empty"}[t["test"]]()


def _add_arg_rules(ops: dict, gates: list[dict], date: str) -> None:
    """The calls no implementation takes (a gate's ``args``, where its op's residue is the CPU) as argument rules of
    the op's coverage entry, each naming every gate it comes from; only on an op that is otherwise native."""
    found: dict[str, dict[str, tuple[dict, list[str]]]] = {}
    for g in gates:
        for op, tests in (g.get("args") or {}).items():
            if (g["residue"] or {}).get(op) != "cpu":
                continue
            for t in tests:
                _, names = found.setdefault(_key(op), {}).setdefault(json.dumps(t, sort_keys=True), (t, []))
                names.append(f"{g['class']}.can_handle, {g['path']}:{g['line']}")
    for op, tests in sorted(found.items()):
        rule = ops.get(op)
        if rule is None or "native" not in (rule["kind"], rule.get("otherwise")):
            continue
        rule["args"] = [{"kind": POSSIBLE, **t, "evidence": "empty gate" if t["test"] == "empty" else "shape gate",
                         "reason": _ARGS.format(what=_said(t), op=op, date=date, gates="; ".join(names))}
                        for t, names in tests.values()]


def combine(certain: dict, derived: dict, evidence: dict, name: str) -> dict:
    """One coverage: ``certain``'s off-device ops as they are, ``derived``'s fallbacks and ``evidence``'s dtype gates
    (on ops ``certain`` calls native) as ``possible``."""
    ops = dict(certain.get("ops", {}))
    date = derived["date"]
    for op, rule in derived["ops"].items():
        if rule["kind"] == "native":
            ops.setdefault(op, {**rule, "evidence": "registered"})
        elif ops.get(op, {}).get("kind", "native") == "native":
            ops[op] = {"kind": POSSIBLE, "reason": _NOT_REGISTERED.format(date=date, name=derived["name"]),
                       "evidence": "not registered"}
    for gate in evidence["gates"]:
        accepts = [d for d in gate["dtypes"] if d.startswith(("float", "bfloat"))]
        if not gate["ops"] or len(accepts) < 2:
            continue  # only a gate naming the floating dtypes it accepts is a dtype rule
        # Only the floating and complex dtypes it turns away: an int64 tensor in the call is often an index output.
        others = sorted(d for d in DTYPES if d.startswith(("float", "complex")) and d not in gate["dtypes"]
                        and d != "complex32")
        # ...on an op whose other implementations do not take what it turns away
        for op in {_key(o) for o, left in gate["residue"].items() if left == "cpu"}:
            if ops.get(op, {}).get("kind", "native") == "native":
                ops[op] = {"kind": POSSIBLE, "dtypes": others, "otherwise": "native", "reason": _GATED.format(
                    dtypes=", ".join(others), date=date, cls=gate["class"], path=gate["path"], line=gate["line"],
                    accepts=", ".join(accepts)), "evidence": "dtype gate"}
    _add_arg_rules(ops, evidence["gates"], date)
    failing: dict[str, list[dict]] = {}
    for row in evidence["expectations"]:
        op = op_of(row["test"], ops)
        # Only a test that names its dtypes: one that fails for every dtype (an error message, an edge case) would
        # mark a plumbing op (view, empty, cat) possible in every cell.
        if op is not None and row["dtypes"] and ops[op]["kind"] == "native":
            failing.setdefault(op, []).append(row)
    for op, rows in sorted(failing.items()):
        dtypes = sorted({d for r in rows for d in r["dtypes"]} - _EVERYDAY)
        if not dtypes:
            continue
        tests = ", ".join(r["test"] for r in rows[:3]) + (", ..." if len(rows) > 3 else "")
        ops[op] = {"kind": POSSIBLE, "reason": _XFAILS.format(n=len(rows), tests=tests), "otherwise": "native",
                   "dtypes": dtypes, "evidence": "upstream xfail"}
    default = derived["default"] if certain.get("default", {}).get("kind", "native") == "native" else certain["default"]
    if default["kind"] != "native":
        default = {"kind": POSSIBLE, "reason": _NOT_REGISTERED.format(date=date, name=derived["name"]),
                   "evidence": "not registered"}
    out = {k: v for k, v in certain.items() if k not in ("ops", "default", "provenance")}
    method = (f"tools/derive_profile.py --combine: certain from {certain['name']}, possible from {derived['name']}, "
              "its can_handle gates and its expected upstream test failures")
    out.update(name=name, default=default, ops=dict(sorted(ops.items())),
               source=(f"{certain['name']} (certain: TorchNeuron's documented fallbacks) combined with what "
                       f"TorchNeuron's {date} source and its upstream test expectations suggest (possible)."),
               provenance={"repo": evidence["provenance"]["repo"], "commit": evidence["provenance"]["commit"],
                           "method": method, "certain": certain["name"], "possible": derived["name"]})
    return out


_ABORT_XLA = ("seen on torch-neuronx's XLA trace path ({urls}): applied to a parameter not yet materialised, this op "
              "killed the Python process (SIGABRT or SIGSEGV); no public report for the native backend, so it may "
              "abort there too")
_ABORT = "seen aborting the process when applied to a parameter ({urls}), on {stacks}"


def aborts(evidence: dict) -> dict[str, dict]:
    """The ``aborts`` table of a coverage: each op a report names, with the reports' URLs, the stack they were seen
    on and their evidence class (``xla report`` unless a report was on the native backend). Reports that name no op
    (the same crashes, by model) are cited as well."""
    reports = evidence["reports"]
    by_model = [r for r in reports if not r["ops"]]
    out = {}
    for op in sorted({op for r in reports for op in r["ops"]}):
        naming = [r for r in reports if op in r["ops"]]
        xla = all(r["stack"].startswith("torch-xla") for r in naming)
        urls = ", ".join(r["url"] for r in naming)
        why = _ABORT_XLA.format(urls=urls) if xla else _ABORT.format(
            urls=urls, stacks="; ".join(sorted({r["stack"] for r in naming})))
        source = "; ".join(f"{r['url']} ({r['versions']})" for r in naming + by_model)
        out[op] = {"reason": f"{why}\nsource: {source}", "evidence": "xla report" if xla else "reported"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, nargs="?", help="TorchNeuron files at their repository paths")
    ap.add_argument("--commit")
    ap.add_argument("--combine", nargs=3, type=Path, metavar=("CERTAIN", "DERIVED", "EVIDENCE"))
    ap.add_argument("--aborts", type=Path, metavar="ABORTS", help="with --combine: the abort reports' evidence file")
    ap.add_argument("--name", default="torchneuron-combined")
    ap.add_argument("--repo", default=DEFAULT_REPO)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.combine:
        certain, derived, evidence = (json.loads(p.read_text()) for p in args.combine)
        out = combine(certain, derived, evidence, args.name)
        if args.aborts:
            out["aborts"] = aborts(json.loads(args.aborts.read_text()))
        args.output.write_text(json.dumps(out, indent=1) + "\n")
        return 0
    if args.source is None or args.commit is None:
        ap.error("SOURCE and --commit are needed unless --combine is given")
    data = derive(args.source, commit=args.commit, repo=args.repo)
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['gates'])} gates, {len(data['expectations'])} expectations -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
