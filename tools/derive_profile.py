"""Derive the evidence behind fallback predictions from TorchNeuron's source tree.

``derive_coverage.py`` says which ops TorchNeuron registers. A registered op can still fall back per call: each
Python implementation's ``can_handle`` gates it on dtype, shape or empty tensors, and when none accepts the
arguments TorchNeuron runs the op on the CPU (``python_ops/base.py``). TorchNeuron's own run of PyTorch's upstream
tests lists the tests it expects to fail (``tests/pytorch_tests/failing_test_methods/<TestClass>.json``). This
script reads both statically (stdlib only) and writes one evidence file::

    python tools/derive_profile.py SOURCE_DIR --commit SHA -o OUT.json

Each gate is ``{"op", "class", "path", "line", "dtypes", "conditions"}``: the ops the class registers under
TorchNeuron's overload names (``None`` when the class is registered elsewhere), the dtypes its ``can_handle``
names (``is_complex()`` counts as complex64 and complex128) and the other conditions it tests (``empty``,
``shape``). Each expectation is ``{"class", "test", "dtypes"}``, the dtypes parsed from the test name's
``_neuron_<dtype>`` suffix (empty when the test runs for no dtype).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from derive_coverage import DEFAULT_REPO, NEURON_OP_DECORATORS, _call_name, _dotted, _first_arg, _strings  # noqa: E402

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
    return {
        "schema_version": SCHEMA_VERSION,
        "provenance": {"repo": repo, "commit": commit, "gates_from": OPS_DIR, "expectations_from": EXPECTATIONS_DIR},
        "gates": extract_gates(root),
        "expectations": extract_expectations(root),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="TorchNeuron files at their repository paths")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--repo", default=DEFAULT_REPO)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    data = derive(args.source, commit=args.commit, repo=args.repo)
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['gates'])} gates, {len(data['expectations'])} expectations -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
