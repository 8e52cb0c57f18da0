"""Derive the op coverage from TorchNeuron's source tree.

TorchNeuron runs an ATen op natively on a ``neuron`` tensor only when its backend registers a
``PrivateUse1`` kernel for it; every other op reaches the boxed CPU fallback that
``csrc/core/NeuronBindings.cpp`` installs (``TORCH_LIBRARY_IMPL(_, PrivateUse1, m)``), which runs it
on the CPU and reports it in ``get_fallback_ops()``. This script reads the registrations statically
(no torch import, stdlib only) and writes a coverage file in neuron_lab's schema
(``neuron_lab/backend/coverage/schema.py``)::

    python tools/derive_coverage.py SOURCE_DIR --commit SHA --date YYYY-MM-DD -o OUT.json

SOURCE_DIR holds TorchNeuron files at their repository paths. When it has a ``PROVENANCE.json``
(``{"repo": ..., "files": {path: {"commit": ...}}}``) the per-file commits go into the coverage file.

Registration forms it reads, each counted separately in the provenance:

``cpp_privateuse1``
    ``m.impl("name", kernel)`` inside ``TORCH_LIBRARY_IMPL(aten, PrivateUse1, m)`` (comments stripped,
    so commented-out lines do not count). A kernel whose C++ body, when found in the tree, moves its
    input to the host with ``.to(at::kCPU)`` is an explicit host kernel: kind ``host``.
``autograd_privateuse1``
    ``m.impl`` inside ``TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m)``, or ``.impl(..., "AutogradPrivateUse1")``.
``cpp_view_whitelist``
    the ``std::unordered_set<std::string>`` of ``aten::`` names that the boxed fallback's kernel looks
    up to stay silent: those ops run through the CPU fallback without a fallback report, so they count
    as native (the emulator serves them as metadata views).
``cpp_dispatch_stub``
    ``REGISTER_PRIVATEUSE1_DISPATCH(name_stub, ...)``: a PrivateUse1 kernel for ``aten::name``.
``py_library_impl``
    ``<lib>.impl("name", fn, "PrivateUse1")`` (positional or ``dispatch_key=``) in any module.
``neuron_op``
    ``@neuron_op`` / ``@neuron_{unary,binary,reduction,comparison}_op("aten::name")`` on classes and
    ``set_wrapper_override("aten::name", ...)``, in the modules ``auto_registration.discover_all_implementations``
    imports (python_ops modules whose dotted name has no ``.legacy``, ``.jax`` or ``test``). An op whose
    every such class overrides ``can_handle`` with a bare ``return False`` is registered but always
    falls back: kind ``fallback``.
``register_aten``
    ``@register_aten("aten::name" | [...])`` on functions (torch-mlir registry), same module filter.
``py_host``
    explicit host kernels: ``("name", torch.ops.aten.name.overload)`` pairs in a module that registers
    names held in variables with ``.impl(name, fn, "PrivateUse1")`` (``cpu_fallback_registrations.py``
    runs them on the CPU and restrides the result on the device): kind ``host``.

Names are normalized to coverage keys: ``aten::`` prefix, no overload, and an in-place ``name_``
shares the entry of ``name`` (``coverage._key``). ``downcast_dtypes`` comes from a
``*target_dtype*`` function mapping ``torch.X`` to a narrower ``torch.Y`` (``dtype_autocast.py``).
``PYTORCH_SERVED`` lists the few metadata ops no registration names because PyTorch never sends them
to the fallback; they are native too. Everything else is ``fallback``: the boxed CPU fallback runs it.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1
DEFAULT_REPO = "parmoham-aws/test-repo-parmoham"
NEURON_OP_DECORATORS = frozenset({"neuron_op", "neuron_unary_op", "neuron_binary_op", "neuron_reduction_op",
                                  "neuron_comparison_op"})
FORMS = ("cpp_privateuse1", "autograd_privateuse1", "cpp_view_whitelist", "cpp_dispatch_stub", "py_library_impl",
         "neuron_op", "register_aten", "py_host")
FORM_TEXT = {
    "cpp_privateuse1": "m.impl in TORCH_LIBRARY_IMPL(aten, PrivateUse1)",
    "autograd_privateuse1": "an AutogradPrivateUse1 kernel",
    "cpp_view_whitelist": "the boxed fallback's view whitelist",
    "cpp_dispatch_stub": "REGISTER_PRIVATEUSE1_DISPATCH",
    "py_library_impl": 'aten_lib.impl(..., "PrivateUse1")',
    "neuron_op": "@neuron_op auto-registration",
    "register_aten": "@register_aten (torch-mlir registry)",
    "py_host": "a host-kernel registration",
}
# Metadata ops that PyTorch serves without ever calling a backend kernel or the boxed fallback for a
# neuron tensor, so no registration names them. They must not count as fallbacks.
PYTORCH_SERVED = {
    "aten::_copy_from": "only PyTorch's default copy_ kernel calls it, and TorchNeuron registers its own copy_",
    "aten::_unsafe_view": "CompositeExplicitAutograd alias: PyTorch serves it for every backend",
}
_CPP_SUFFIXES = (".cpp", ".cc", ".cxx", ".h", ".hpp")
_HOST_CPP = re.compile(r"\.to\(\s*(?:at::|c10::)?kCPU\s*\)")


def op_key(name: str) -> str:
    """``add_.Tensor`` / ``aten::add.out`` -> ``aten::add``: the coverage key (see ``coverage._key``)."""
    base = name.removeprefix("aten::").split(".", 1)[0]
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    return f"aten::{base}"


def overload_name(name: str) -> str:
    return name.removeprefix("aten::")


@dataclass
class Registration:
    name: str  # as written, overload included
    form: str
    path: str
    kind: str = "native"  # native | host | fallback (registered but never handled)
    note: str = ""


@dataclass
class Extraction:
    regs: list[Registration] = field(default_factory=list)
    downcast: dict[str, str] = field(default_factory=dict)
    downcast_path: str = ""
    files: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- C++


def _literal_end(text: str, start: int) -> int:
    """Index just past the string or char literal opening at ``start`` (escapes skipped)."""
    j, n = start + 1, len(text)
    while j < n and text[j] != text[start]:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def strip_cpp_comments(text: str) -> str:
    """Drop ``//`` and ``/* */`` comments, keeping string and char literals (and line breaks) intact."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = _literal_end(text, i)
            out.append(text[i:j])
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append("\n" * text.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _matching(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at ``open_at`` (string literals skipped); -1 if none."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    opener, closer = text[open_at], pairs[text[open_at]]
    depth, i, n = 0, open_at, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i = _literal_end(text, i)
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


_LIB_IMPL = re.compile(r"\bTORCH_LIBRARY_IMPL\s*\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)\s*\{")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments of a call's argument text."""
    args, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    args.append(text[start:].strip())
    return args


def _kernel_name(expr: str) -> str:
    """``&at::native::empty_neuron`` / ``TORCH_FN(ns::f)`` -> ``empty_neuron`` / ``f``."""
    names = re.findall(r"[A-Za-z_][\w:]*", expr.replace("TORCH_FN", " "))
    return names[-1].rsplit("::", 1)[-1] if names else ""


def _function_body(sources: dict[str, str], func: str) -> str | None:
    """The body of the C++ function ``func`` defined somewhere in ``sources`` (comment-stripped texts)."""
    pattern = re.compile(rf"\b{re.escape(func)}\s*\(")
    for text in sources.values():
        for m in pattern.finditer(text):
            close = _matching(text, m.end() - 1)
            if close < 0:
                continue
            rest = re.match(r"\s*(?:const\s*)?(?:noexcept\s*)?\{", text[close + 1:])
            if rest:
                brace = close + rest.end()
                end = _matching(text, brace)
                if end > 0:
                    return text[brace:end + 1]
    return None


def extract_cpp(root: Path, rel_paths: list[str], ex: Extraction) -> None:
    sources = {rel: strip_cpp_comments((root / rel).read_text(errors="replace")) for rel in rel_paths}
    string_sets: dict[str, list[str]] = {}
    for text in sources.values():
        for m in re.finditer(r"unordered_set\s*<\s*std::string\s*>\s+(\w+)\s*=\s*\{", text):
            end = _matching(text, m.end() - 1)
            string_sets[m.group(1)] = _STRING.findall(text[m.end():end])
    for rel, text in sources.items():
        for m in _LIB_IMPL.finditer(text):
            ns, key, var = m.groups()
            end = _matching(text, m.end() - 1)
            block = text[m.end():end]
            if ns == "_" and key == "PrivateUse1":
                for fb in re.finditer(rf"\b{var}\s*\.\s*fallback\s*\(", block):
                    kernel = re.search(r"<\s*&?\s*([\w:]+)\s*>", block[fb.end():])
                    body = _function_body(sources, kernel.group(1).rsplit("::", 1)[-1]) if kernel else None
                    for set_name, names in string_sets.items():
                        if body and re.search(rf"\b{set_name}\s*\.\s*(?:find|count|contains)\s*\(", body):
                            ex.regs += [Registration(n, "cpp_view_whitelist", rel) for n in names
                                        if n.startswith("aten::")]
                continue
            if ns != "aten" or key not in ("PrivateUse1", "AutogradPrivateUse1"):
                continue
            form = "cpp_privateuse1" if key == "PrivateUse1" else "autograd_privateuse1"
            for call in re.finditer(rf"\b{var}\s*\.\s*impl\s*\(", block):
                close = _matching(block, call.end() - 1)
                args = _split_args(block[call.end():close])
                name = _STRING.search(args[0]) if args else None
                if not name:
                    continue
                kernel = _kernel_name(args[1]) if len(args) > 1 else ""
                body = _function_body(sources, kernel) if kernel else None
                if form == "cpp_privateuse1" and body and _HOST_CPP.search(body):
                    ex.regs.append(Registration(name.group(1), form, rel, "host",
                                                f"its kernel {kernel} copies the input to the host (.to(at::kCPU)) "
                                                "and computes there"))
                else:
                    ex.regs.append(Registration(name.group(1), form, rel))
        for m in re.finditer(r"\bREGISTER_PRIVATEUSE1_DISPATCH\s*\(\s*(\w+?)_stub\s*,", text):
            ex.regs.append(Registration(m.group(1), "cpp_dispatch_stub", rel))


# ---------------------------------------------------------------- Python


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _first_arg(call: ast.Call, *names: str) -> ast.AST | None:
    """The first positional argument, or the keyword argument named one of ``names``."""
    if call.args:
        return call.args[0]
    return next((kw.value for kw in call.keywords if kw.arg in names), None)


def _dispatch_key(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "dispatch_key" and isinstance(kw.value, ast.Constant):
            return kw.value.value
    if len(call.args) >= 3 and isinstance(call.args[2], ast.Constant):
        return call.args[2].value
    return None


def _never_handles(cls: ast.ClassDef) -> bool:
    """The class overrides ``can_handle`` with nothing but (a docstring and) ``return False``."""
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "can_handle":
            body = [s for s in item.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            return (len(body) == 1 and isinstance(body[0], ast.Return)
                    and isinstance(body[0].value, ast.Constant) and body[0].value.value is False)
    return False


def auto_imported(rel: str) -> bool:
    """Whether ``discover_all_implementations`` imports this module (it skips .legacy, .jax and test modules)."""
    modname = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return not (".legacy" in modname or ".jax" in modname or "test" in modname)


def extract_python(root: Path, rel: str, ex: Extraction) -> None:
    try:
        tree = ast.parse((root / rel).read_text(errors="replace"), filename=rel)
    except SyntaxError as e:
        print(f"derive_coverage: skipping {rel}: {e}", file=sys.stderr)
        return
    decorated = auto_imported(rel)
    dynamic_impl = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and decorated:
            for dec in node.decorator_list:
                if not isinstance(dec, ast.Call):
                    continue
                which, first = _call_name(dec), _first_arg(dec, "aten_name", "operations")
                if first is None:
                    continue
                if which in NEURON_OP_DECORATORS:
                    never = isinstance(node, ast.ClassDef) and _never_handles(node)
                    for name in _strings(first):
                        ex.regs.append(Registration(name, "neuron_op", rel, "fallback" if never else "native",
                                                    f"{node.name}.can_handle always returns False" if never else ""))
                elif which == "register_aten":
                    ex.regs += [Registration(name, "register_aten", rel) for name in _strings(first)]
        elif isinstance(node, ast.Call):
            which = _call_name(node)
            if which == "set_wrapper_override" and decorated and node.args:
                ex.regs += [Registration(name, "neuron_op", rel) for name in _strings(node.args[0])]
            elif which == "impl" and isinstance(node.func, ast.Attribute) and node.args:
                if _dispatch_key(node) not in ("PrivateUse1", "AutogradPrivateUse1"):
                    continue
                names = _strings(node.args[0])
                if not names and not isinstance(node.args[0], ast.Constant):
                    dynamic_impl = dynamic_impl or _dispatch_key(node) == "PrivateUse1"
                form = "py_library_impl" if _dispatch_key(node) == "PrivateUse1" else "autograd_privateuse1"
                ex.regs += [Registration(name, form, rel) for name in names]
        if isinstance(node, ast.FunctionDef) and "target_dtype" in node.name:
            for stmt in ast.walk(node):
                if (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1
                        and isinstance(stmt.test.ops[0], ast.Eq) and stmt.body
                        and isinstance(stmt.body[0], ast.Return) and stmt.body[0].value is not None):
                    src, dst = _dotted(stmt.test.comparators[0]), _dotted(stmt.body[0].value)
                    if src.startswith("torch.") and dst.startswith("torch.") and src != dst:
                        ex.downcast[src.removeprefix("torch.")] = dst.removeprefix("torch.")
                        ex.downcast_path = rel
    if dynamic_impl:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[0], ast.Constant)
                    and isinstance(node.elts[0].value, str) and _dotted(node.elts[1]).startswith("torch.ops.aten.")):
                ex.regs.append(Registration(node.elts[0].value, "py_host", rel, "host",
                                            "runs on the CPU and is copied back with its strides"))


def extract(root: Path) -> Extraction:
    ex = Extraction()
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    cpp = [f for f in files if f.endswith(_CPP_SUFFIXES)]
    py = [f for f in files if f.endswith(".py")]
    ex.files = cpp + py
    extract_cpp(root, cpp, ex)
    for rel in py:
        extract_python(root, rel, ex)
    return ex


# ---------------------------------------------------------------- coverage


def _short(path: str) -> str:
    return path.removeprefix("torch_neuronx/")


# What a report says of an op that does not run on the device, for a newcomer; the registration that shows it follows
# as the reason's source (neuron_lab.report.model.SOURCE separates the two).
SOURCE = "\nsource: "
FALLBACK_WHY = ("TorchNeuron has no device kernel for this op: its CPU fallback copies the inputs to the CPU, runs "
                "the op there and copies the result back.")
HOST_WHY = ("TorchNeuron runs this op on the CPU with a host kernel of its own and copies the result back; "
            "torch_neuronx.get_fallback_ops() does not list it.")
UNUSED_WHY = ("TorchNeuron registers a device kernel for this op but never uses it, so its CPU fallback runs the op: "
              "the inputs go to the CPU and the result comes back.")


# Each kind's class of evidence (neuron_lab's coverage schema.EVIDENCE): every reason a report shows ends with its
# confidence, so every rule names one. A kernel whose can_handle never accepts turns every argument away: a shape gate.
EVIDENCE = {"native": "registered", "host": "host kernel", "fallback": "shape gate"}
DEFAULT_EVIDENCE = "not registered"


def build_coverage(ex: Extraction, *, name: str, commit: str, date: str, repo: str,
                  file_commits: dict[str, str]) -> dict:
    by_key: dict[str, list[Registration]] = {}
    for reg in ex.regs:
        by_key.setdefault(op_key(reg.name), []).append(reg)
    ops: dict[str, dict] = {}
    for key, regs in sorted(by_key.items()):
        native = [r for r in regs if r.kind == "native"]
        host = [r for r in regs if r.kind == "host"]
        chosen = native or host or regs
        kind = chosen[0].kind
        overloads = ", ".join(sorted({overload_name(r.name) for r in regs}))
        where = "; ".join(sorted({f"{FORM_TEXT[r.form]} in {_short(r.path)}" for r in chosen}))
        if kind == "native" and all(r.form == "cpp_view_whitelist" for r in chosen):
            files = ", ".join(sorted({_short(r.path) for r in chosen}))
            reason = (f"metadata view on the view whitelist of TorchNeuron's boxed fallback ({files}): it runs "
                      f"without a fallback report")
        elif kind == "native":
            reason = f"registered for PrivateUse1: {where} (overloads: {overloads})"
        elif kind == "host":
            notes = "; ".join(sorted({r.note for r in chosen if r.note}))
            reason = (f"{HOST_WHY}{SOURCE}explicit host kernel ({where}): {notes}; get_fallback_ops() does not list it "
                      f"(overloads: {overloads})")
        else:
            notes = "; ".join(sorted({r.note for r in chosen if r.note}))
            reason = (f"{UNUSED_WHY}{SOURCE}registered ({where}) but {notes}: the CPU fallback runs it "
                      f"(overloads: {overloads})")
        ops[key] = {"kind": kind, "reason": reason, "evidence": EVIDENCE[kind]}
    served = 0
    for key, why in PYTORCH_SERVED.items():
        if key not in ops:
            ops[key] = {"kind": "native", "reason": f"metadata op never sent to the fallback: {why}",
                        "evidence": EVIDENCE["native"]}
            served += 1
    ops = dict(sorted(ops.items()))

    counts = {}
    for form in FORMS:
        regs = [r for r in ex.regs if r.form == form]
        counts[form] = {"registrations": len(regs), "ops": len({op_key(r.name) for r in regs})}
    kinds = {k: sum(1 for r in ops.values() if r["kind"] == k) for k in ("native", "host", "fallback")}
    commits = sorted(set(file_commits.values()) | {commit})
    prov = {
        "repo": repo,
        "commit": commit,
        "file_commits": commits,
        "date": date,
        "files_scanned": len(ex.files),
        "method": "static read of PrivateUse1 registrations (tools/derive_coverage.py): C++ TORCH_LIBRARY_IMPL blocks "
                  "by regex, Python by ast; unregistered ops default to the boxed CPU fallback",
        "counts": counts,
        "pytorch_served": served,
        "ops_by_kind": kinds,
    }
    if ex.downcast:
        prov["downcast"] = {"from": _short(ex.downcast_path), "map": dict(sorted(ex.downcast.items()))}
    source = (f"Derived from TorchNeuron's source ({repo} at {commit[:7]}, files from "
              f"{', '.join(c[:7] for c in commits)}; {date}) by tools/derive_coverage.py: an op is native only when "
              f"the backend registers a PrivateUse1 kernel for it, host when that kernel runs on the CPU, and a "
              f"fallback otherwise (how: the provenance field).")
    coverage = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "source": source,
        "date": date,
        "provenance": prov,
        "default": {"kind": "fallback", "reason": f"{FALLBACK_WHY}{SOURCE}not registered by TorchNeuron's backend "
                                                  f"at {commit[:7]}: the boxed CPU fallback runs it",
                    "evidence": DEFAULT_EVIDENCE},
    }
    if ex.downcast:
        coverage["downcast_dtypes"] = sorted(ex.downcast)
    coverage["dtypes"] = {}
    coverage["ops"] = ops
    return coverage


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source_dir", type=Path, help="TorchNeuron files at their repository paths")
    ap.add_argument("--commit", required=True, help="the repository commit the tree represents (HEAD)")
    ap.add_argument("--date", required=True, help="YYYY-MM-DD of that commit")
    ap.add_argument("-o", "--output", type=Path, required=True, help="coverage JSON to write")
    ap.add_argument("--name", help="coverage name (default: torchneuron-src-YYYY-MM)")
    ap.add_argument("--repo", help=f"repository the files come from (default: PROVENANCE.json's, or {DEFAULT_REPO})")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", args.date):
        ap.error(f"--date {args.date!r} is not YYYY-MM-DD")
    if not args.source_dir.is_dir():
        ap.error(f"{args.source_dir} is not a directory")
    file_commits, repo = {}, args.repo
    prov_file = args.source_dir / "PROVENANCE.json"
    if prov_file.is_file():
        data = json.loads(prov_file.read_text())
        file_commits = {p: f["commit"] for p, f in data.get("files", {}).items() if "commit" in f}
        repo = repo or data.get("repo")
    ex = extract(args.source_dir)
    coverage = build_coverage(ex, name=args.name or f"torchneuron-src-{args.date[:7]}", commit=args.commit,
                            date=args.date, repo=repo or DEFAULT_REPO, file_commits=file_commits)
    args.output.write_text(json.dumps(coverage, indent=1) + "\n")
    prov = coverage["provenance"]
    forms = ", ".join(f"{k}={v['ops']}" for k, v in prov["counts"].items())
    print(f"{args.output}: {len(coverage['ops'])} ops {prov['ops_by_kind']}, default fallback; ops per form: {forms}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
