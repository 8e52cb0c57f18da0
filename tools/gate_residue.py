"""Which op each ``can_handle`` gate of TorchNeuron guards, and what calls of that op no implementation takes.

A gate matters only when no other implementation of its op takes the call: ``Operation.__call__``
(``python_ops/base.py``) tries the implementations by ``priority``, highest first; a call none takes runs on the CPU
(``_unhandled_cpu_fallback``) when the Operation's ``op_name`` is an ATen op, and raises ``NotImplementedError``
otherwise. A class reaches an op through one of: a ``@neuron_op`` decorator; an ``Operation`` whose
``_setup_implementations`` appends it, held at module level (``_gather_op = GatherOp()``) by a function registered
with ``aten_lib.impl(name, fn, "PrivateUse1")`` (``torch_neuronx/distributed/ops`` for the process group's
collectives); being a base class of such a class (a subscripted base ``add_ops["tensor"]`` is the class the factory's
returned dict names). The first registration of a name wins (``python_ops/__init__.py`` registers its own table
before the decorated classes, torch-mlir's last), so an op's implementations come from one of these.

An implementation takes every call when its ``can_handle`` (its own or a base's) tests nothing but devices; the
base ``OperationImplementation.can_handle`` only raises for a tensor on another device. :data:`READINGS` is what a
person read in each shape or empty-tensor gate: the condition it turns away, in words, and, for an op whose calls
some arguments leave with no implementation, the argument tests (``neuron_lab/backend/coverage/conditions.py``) that
say which calls. Each reading quotes its gate, and the derivation fails when the quote is no longer in the source.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

OPS_DIRS = ("torch_neuronx/python_ops", "torch_neuronx/distributed/ops")
BASE = "OperationImplementation"
DECORATORS = frozenset({"neuron_op", "neuron_unary_op", "neuron_binary_op", "neuron_reduction_op",
                        "neuron_comparison_op"})


@dataclass
class Cls:
    node: ast.ClassDef
    rel: str
    bases: list[str] = field(default_factory=list)


def _imported(rel: str) -> bool:
    """Whether TorchNeuron imports the module (``discover_all_implementations`` skips .legacy, .jax and tests)."""
    mod = rel.removesuffix(".py").replace("/", ".")
    return not (".legacy" in mod or ".jax" in mod or "test" in mod)


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name), None)


def _returned_string(fn: ast.FunctionDef | None) -> str | None:
    ret = next((n for n in ast.walk(fn) if isinstance(n, ast.Return)), None) if fn else None
    return ret.value.value if ret and isinstance(ret.value, ast.Constant) and isinstance(ret.value.value, str) else None


class Source:
    """The imported modules' classes, Operation instances and registered functions."""

    def __init__(self, root: Path) -> None:
        self.classes: dict[str, Cls] = {}
        self.instances: dict[str, list[str]] = {}  # module-level `var = OpClass()` -> every OpClass so named
        self.functions: dict[str, ast.FunctionDef] = {}
        self.registered: list[tuple[str, str]] = []  # (ATen name, function) from aten_lib.impl(..., "PrivateUse1")
        self.factories: dict[str, dict[str, str]] = {}  # factory function -> its returned dict {key: class}
        self.made_by: dict[str, str] = {}  # module-level `ops = factory(...)` -> factory
        for d in OPS_DIRS:
            for path in sorted((root / d).rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                if _imported(rel):
                    self._read(ast.parse(path.read_text(errors="replace"), filename=rel), rel)

    def _read(self, tree: ast.Module, rel: str) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, Cls(node, rel, [self._base(b) for b in node.bases]))
            elif isinstance(node, ast.FunctionDef):
                self.functions.setdefault(node.name, node)
                ret = node.body[-1] if node.body else None
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    self.factories[node.name] = {k.value: _name(v) for k, v in zip(ret.value.keys, ret.value.values)
                                                 if isinstance(k, ast.Constant)}
            elif (isinstance(node, ast.Call) and _name(node.func) == "impl" and len(node.args) >= 3
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[2], ast.Constant)
                  and node.args[2].value == "PrivateUse1"):
                self.registered.append(("aten::" + node.args[0].value, _name(node.args[1])))
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and len(stmt.targets) == 1:
                target, made = _name(stmt.targets[0]), _name(stmt.value.func)
                self.instances.setdefault(target, []).append(made)
                self.made_by[target] = made

    def _base(self, node: ast.AST) -> str:
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return f"{_name(node.value)}[{node.slice.value!r}]"  # resolved once every module is read
        return _name(node)

    def bases(self, name: str) -> list[str]:
        out = []
        for b in self.classes[name].bases:
            if "[" in b:
                var, key = b.split("[", 1)
                b = self.factories.get(self.made_by.get(var, ""), {}).get(key.strip("]'\""), b)
            out.append(b)
        return out

    def can_handle(self, name: str) -> tuple[str, ast.FunctionDef | None]:
        """The class whose ``can_handle`` this class runs, and that method (None: the base class's)."""
        seen = [name]
        while seen:
            cur = seen.pop(0)
            if cur == BASE or cur not in self.classes:
                continue
            fn = _method(self.classes[cur].node, "can_handle")
            if fn is not None:
                return cur, fn
            seen += self.bases(cur)
        return BASE, None

    def priority(self, name: str, decorator: ast.Call | None = None) -> int:
        if decorator is not None:
            kw = next((k.value for k in decorator.keywords if k.arg == "priority"), None)
            return kw.value if isinstance(kw, ast.Constant) else 50
        cls = self.classes.get(name)
        fn = _method(cls.node, "priority") if cls else None
        ret = next((n for n in ast.walk(fn) if isinstance(n, ast.Return)), None) if fn else None
        if ret is not None and isinstance(ret.value, ast.Constant):
            return ret.value.value
        if ret is not None and isinstance(ret.value, ast.BinOp) and isinstance(ret.value.right, ast.Constant):
            n = ret.value.right.value  # `super().priority + N` (or - N)
            return 50 + (n if isinstance(ret.value.op, ast.Add) else -n)
        return next((self.priority(b) for b in self.bases(name) if b in self.classes), 50)


@dataclass
class Op:
    """One op's implementations (class, priority), how they were tied to it, and where an untaken call goes."""

    name: str
    impls: list[tuple[str, int]]
    via: str
    untaken: str  # "cpu" (Operation._unhandled_cpu_fallback) or "raises" (no ATen op of its op_name)


def ops(src: Source) -> dict[str, Op]:
    """Every op some Python implementation serves, with its implementations by priority."""
    out: dict[str, Op] = {}
    for fn_op, fn in src.registered:  # python_ops/__init__.py's own table: registered first, so it wins
        body = None if fn in src.instances else src.functions.get(fn)  # fn: an Operation itself, or a function
        used = {n.id for n in ast.walk(body) if isinstance(n, ast.Name)} if body else {fn}
        for var in sorted(used & src.instances.keys()):
            op_cls = next((src.classes[c] for c in src.instances[var] if c in src.classes
                           and _method(src.classes[c].node, "_setup_implementations")), None)
            if op_cls is None:
                continue
            op_name = _returned_string(_method(op_cls.node, "op_name")) or ""
            # Each Operation the function calls tries its own implementations (a multi-step op has several).
            out[f"{fn_op} {op_cls.node.name}"] = Op(
                fn_op, _appended(src, op_cls.node), f"{op_cls.node.name} ({op_cls.rel}) held by {var}"
                + (f", called by {fn}" if body else "") + f", registered as {fn_op.removeprefix('aten::')}",
                "cpu" if op_name == fn_op.removeprefix("aten::").split(".")[0] else "raises")
    for name, c in src.classes.items():
        for dec in c.node.decorator_list:
            if isinstance(dec, ast.Call) and _name(dec.func) in DECORATORS and dec.args:
                op = dec.args[0].value
                if any(o.name == op and not o.via.startswith("@") for o in out.values()):
                    continue  # python_ops/__init__.py registered the name first
                prev = out.get(op) or Op(op, [], f"@{_name(dec.func)} ({c.rel})", "cpu")
                prev.impls.append((name, src.priority(name, dec)))
                out[op] = prev
    for name, c in src.classes.items():  # the process group's collectives: their op_name is no ATen op
        if c.rel.startswith("torch_neuronx/distributed/ops") and _method(c.node, "_setup_implementations"):
            op = "c10d::" + (_returned_string(_method(c.node, "op_name")) or name)
            out[op] = Op(op, _appended(src, c.node), f"{name} ({c.rel}), called by the process group", "raises")
    for op in out.values():
        op.impls.sort(key=lambda ip: -ip[1])
    return out


def _appended(src: Source, op_cls: ast.ClassDef) -> list[tuple[str, int]]:
    fn = _method(op_cls, "_setup_implementations")
    calls = [n.args[0] for n in ast.walk(fn) if isinstance(n, ast.Call) and _name(n.func) == "append" and n.args]
    return [(_name(c.func), src.priority(_name(c.func))) for c in calls if isinstance(c, ast.Call)]


def gated(src: Source, name: str, gates: dict[tuple[str, str], dict]) -> bool:
    """Whether some call with every tensor on the device can be turned away by this implementation's can_handle."""
    owner, fn = src.can_handle(name)
    if fn is None or owner == BASE:
        return False
    g = gates.get((owner, src.classes[owner].rel))
    if g and (g["dtypes"] or g["conditions"]):
        return True
    calls_super = any(isinstance(n, ast.Attribute) and n.attr == "can_handle" and isinstance(n.value, ast.Call)
                      and _name(n.value.func) == "super" for n in ast.walk(fn))
    return calls_super and any(gated(src, b, gates) for b in src.bases(owner))


def residues(root: Path, gates: list[dict]) -> None:
    """Add to each gate: the ops its class serves (``None``: none), how, and per op where a call no implementation
    takes goes (``residue``: ``cpu``, ``raises``, or ``none`` when an implementation takes every call)."""
    src = Source(root)
    by_key = {(g["class"], g["path"]): g for g in gates}
    table = ops(src)
    served: dict[str, list[tuple[Op, str]]] = {}
    for op in table.values():
        for impl, _ in op.impls:
            todo, seen = [impl], set()
            while todo:
                cur = todo.pop()
                if cur in seen or cur not in src.classes:
                    continue
                seen.add(cur)
                served.setdefault(cur, []).append((op, "" if cur == impl else f"a base class of {impl}"))
                todo += src.bases(cur)
    for g in gates:
        tied = served.get(g["class"], []) if g["path"] == _rel(src, g["class"]) else []
        if g["class"] == BASE:
            tied = []  # every implementation's default: raises for a tensor on another device, takes every other call
        g["ops"] = sorted({op.name for op, _ in tied}) or None
        g["via"] = sorted({f"{op.name}: {how + ', ' if how else ''}{op.via}" for op, how in tied}) or None
        residue: dict[str, str] = {}
        for op, _ in tied:
            left = op.untaken if all(gated(src, i, by_key) for i, _ in op.impls) else "none"
            residue[op.name] = min(residue.get(op.name, left), left, key=("cpu", "raises", "none").index)
        g["residue"] = dict(sorted(residue.items())) or None
        g["order"] = sorted({f"{op.name}: " + ", ".join(f"{i} ({p})" for i, p in op.impls) for op, _ in tied}) or None
        reading = READINGS.get(g["class"])
        if not _imported(g["path"]):
            g["used"] = "no: TorchNeuron never imports python_ops/legacy"
            continue
        if not tied and g["class"] != BASE:
            g["used"] = "no: no registered op uses the class"
        if g["conditions"] and reading is not None and g["path"].startswith(reading.get("path", g["path"])):
            _check_quote(root, g, reading["quote"])
            g["reading"] = reading["condition"]
            g["args"] = reading.get("args")
            g["used"] = reading["used"]


def _rel(src: Source, name: str) -> str:
    c = src.classes.get(name)
    return c.rel if c else ""


def _check_quote(root: Path, gate: dict, quote: str) -> None:
    text = (root / gate["path"]).read_text(errors="replace")
    if quote not in text:
        raise SystemExit(f"derive_profile: the reading of {gate['class']} ({gate['path']}) quotes {quote!r}, which the "
                         "source no longer holds: read the gate again")


_SDPA = [{"test": "ndim_not_in", "arg": a, "value": [4]} for a in ("query", "key", "value")]
_GROUPED_MM = {"aten::_grouped_mm": [{"test": "ndim_not_in", "arg": "self", "value": [2]},
                                    {"test": "ndim_not_in", "arg": "mat2", "value": [2, 3]}]}
_REACHED = ("reached on the emulator as on Trainium: its F.scaled_dot_product_attention makes TorchNeuron's "
             "_fused_sdp_choice, which sends 4-D device inputs to this op")
# What a person read in each shape or empty-tensor gate (by class; `path`: where, when a name is in two trees). The
# legacy copies (python_ops/legacy) are never imported and have no reading. `args`: the calls of the op no
# implementation takes, as argument tests by op, present only where the residue is cpu and the tests say all of it.
READINGS: dict[str, dict] = {
    "AttentionOpImpl": {
        "quote": "if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:",
        "condition": "query, key or value not 4-D; their dtypes differ or are not float32/float16/bfloat16; batch, "
                     "kv heads or embedding sizes disagree; return_debug_mask; an empty query, key or value "
                     "(_check_and_handle_empty fails the call)",
        "used": "via the SDPA ops' own readings"},
    "ScaledDotProductFusedAttentionNKIImpl": {
        "quote": "if seq_len_q % 512 != 0 or seq_len_k % 512 != 0:",
        "condition": "AttentionOpImpl's, and sequence lengths not multiples of 512, head_dim > 128, dropout_p > 0, "
                     "an attn_bias; ScaledDotProductAttnMLIRImpl takes those",
        "used": "through ScaledDotProductAttnMLIRImpl's reading: the op's residue is what that one turns away"},
    "ScaledDotProductAttnMLIRImpl": {
        "quote": "return not (query.ndim != 4 or key.ndim != 4 or value.ndim != 4)",
        "condition": "AttentionOpImpl's, and query, key or value not 4-D: no implementation takes such a call",
        "args": {"aten::_scaled_dot_product_fused_attention_overrideable": _SDPA + [
            {"test": "is", "arg": "return_debug_mask", "value": True}] + [
            {"test": "empty", "arg": a} for a in ("query", "key", "value")]},
        "used": "in the combined coverage; " + _REACHED},
    "ScaledDotProductAttentionBackwardNKIImpl": {
        "quote": "if seq_len_q % 512 != 0 or seq_len_k % 512 != 0:",
        "condition": "AttentionOpImpl's on query, key, value, and sequence lengths not multiples of 512, "
                     "head_dim > 128, an attn_bias; ScaledDotProductAttnBackwardMLIRImpl takes those",
        "used": "through ScaledDotProductAttnBackwardMLIRImpl's reading: the op's residue is what that one turns away"},
    "ScaledDotProductAttnBackwardMLIRImpl": {
        "quote": "if not super().can_handle(query, key, value):",
        "condition": "AttentionOpImpl's on query, key and value: no implementation takes such a call",
        "args": {"aten::_scaled_dot_product_fused_attention_overrideable_backward": _SDPA},
        "used": "in the combined coverage; " + _REACHED},
    "ContiguousBroadcastImpl": {
        "quote": "if self_tensor.numel() == 0 or len(shape) == 0:",
        "condition": "complex, empty or 0-d tensors, another memory format, already contiguous, no broadcast "
                     "pattern", "used": "no residue: ContiguousNKIImpl takes every call"},
    "ContiguousSliceImpl": {
        "quote": "def can_handle(self, self_tensor, memory_format=None) -> bool:",
        "condition": "complex or empty tensors, no slice pattern",
        "used": "no residue: ContiguousNKIImpl takes every call"},
    "ContiguousTransposeImpl": {
        "quote": "def can_handle(self, self_tensor, memory_format=None) -> bool:",
        "condition": "complex or empty tensors, no transpose pattern",
        "used": "no residue: ContiguousNKIImpl takes every call"},
    "GatherNKIImpl": {
        "quote": "return index.stride(1) == 0",
        "condition": "input or index not 2-D, dim != 0, another dtype, sparse_grad, an index without repeated "
                     "columns", "used": "no residue: GatherMLIRImpl takes every call on the device"},
    "ScatterAddNKIImpl": {
        "quote": "return index.stride(1) == 0",
        "condition": "input, src or index not 2-D, dim != 0, another dtype, an index without repeated columns",
        "used": "no residue: the MLIR implementations take every call on the device"},
    "GroupedMMNKIImpl": {
        "quote": "return a.dim() == 2 and b.dim() == 2 and validate_offs(offs, a.shape[1])",
        "condition": "self or mat2 not 2-D (offs it cannot use raise ValueError, not a fallback)",
        "args": _GROUPED_MM,
        "used": "with GroupedMMMLIRImpl's: a 2-D self with a 2-D or 3-D mat2 is taken, anything else is not"},
    "GroupedMMMLIRImpl": {
        "quote": "return a.dim() == 2 and b.dim() == 3 and validate_offs(offs, a.shape[0], get_gmm_align())",
        "condition": "self not 2-D or mat2 not 3-D",
        "args": _GROUPED_MM,
        "used": "with GroupedMMNKIImpl's (the same tests)"},
    "TopKXLAImpl": {
        "path": "torch_neuronx/python_ops/xla_ops",
        "quote": "if dim != input.dim() - 1:",
        "condition": "k not a positive int, dim not the last dimension, k larger than that dimension (the CPU "
                     "raises too), largest=False, a dtype other than float32/float16/bfloat16 (the dtype gate)",
        "args": {"aten::topk": [{"test": "below", "arg": "k", "value": 1},
                                {"test": "not_last_dim", "arg": "dim", "of": "self"},
                                {"test": "is", "arg": "largest", "value": False}]},
        "used": "yes: every call of aten::topk is tested"},
    "ArithmeticXLABase": {
        "path": "torch_neuronx/python_ops/xla_ops",
        "quote": "torch.broadcast_shapes(tensors[0].shape, tensors[1].shape)",
        "condition": "operands that are neither tensors nor numbers, or shapes that do not broadcast",
        "used": "no: PyTorch itself rejects such a call, on the CPU too"},
    "ForeachBinaryTensorImpl": {
        "path": "torch_neuronx/python_ops/xla_ops",
        "quote": "scalar tensor expected to be 0 dim but it has",
        "condition": "raises for an `other` that is not 0-d, as PyTorch does (numel appears in the message only)",
        "used": "no: an error on the CPU too"},
    "AllGatherXlaOp": {
        "quote": "output tensors are required but not provided",
        "condition": "no inputs, no or mismatched output tensors (dtype, shape)",
        "used": "no: a collective with no CPU path (it raises); the process group's own checks come first"},
    "AllReduceXLAOp": {
        "quote": "cannot be empty",
        "condition": "an empty tensor, an unsupported reduce op",
        "used": "as an unsupported call by the emulated process group (backend/emulator/distributed.py)"},
    "AllToAllXlaOp": {
        "quote": "if world_size not in {4, 8, 16} and world_size % 32 != 0:",
        "condition": "a world size other than 4, 8, 16 or a multiple of 32, empty or unequal tensors",
        "used": "the empty tensor, as an unsupported call (backend/emulator/distributed.py); the world size is not"},
    "ReduceScatterXLAOp": {
        "quote": "invalid or empty replica groups",
        "condition": "invalid replica groups, an unsupported reduce op, mismatched shapes",
        "used": "no: a collective with no CPU path (it raises)"},
    "NativeMultiHeadAttnMidNKIImpl": {
        "quote": "return seq_len % 512 == 0",
        "condition": "q, k, v not 4-D or of different shapes, a sequence length not a multiple of 512; "
                     "NativeMultiHeadAttnMidMLIRImpl takes the rest",
        "used": "no: with the MLIR one's, an untaken call raises NotImplementedError (the mid op is no ATen op)"},
    "NativeMultiHeadAttnPrefixMLIRImpl": {
        "quote": "if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:",
        "condition": "query, key, value not 3-D or of different shapes; qkv_weight/qkv_bias not (3E, E)/(3E,)",
        "used": "no: its Operation's op_name is no ATen op, so an untaken call raises NotImplementedError"},
    "NativeMultiHeadAttnSuffixMLIRImpl": {
        "quote": "if attn_output.ndim != 4:",
        "condition": "attn_output not 4-D; proj_weight not 2-D or proj_bias not 1-D; mismatched sizes",
        "used": "no: its Operation's op_name is no ATen op, so an untaken call raises NotImplementedError"},
    "AddmmXLAImpl": {
        "path": "torch_neuronx/python_ops/xla_ops",
        "quote": "return mat1.dim() == 2 and mat2.dim() == 2",
        "condition": "mat1 or mat2 not 2-D",
        "used": "no: AddmmOp (python_ops/addmm.py) is never registered; aten::addmm is torch-mlir's, which takes every "
                "call"},
    "NativeMultiHeadAttnPrefixXLAImpl": {
        "path": "torch_neuronx/python_ops/xla_ops", "quote": "def can_handle",
        "condition": "shape checks of the XLA prefix", "used": "no: no Operation uses the class"},
    "NativeMultiHeadAttnSuffixXLAImpl": {
        "path": "torch_neuronx/python_ops/xla_ops", "quote": "def can_handle",
        "condition": "shape checks of the XLA suffix", "used": "no: no Operation uses the class"},
    "ScaledDotProductAttentionBackwardXLAImpl": {
        "path": "torch_neuronx/python_ops/xla_ops", "quote": "def can_handle",
        "condition": "AttentionOpImpl's", "used": "no: no Operation uses the class"},
    "OperationImplementation": {
        "quote": "Non-scalar tensor arg{i} is on {arg.device.type} device, expected neuron",
        "condition": "raises for a non-scalar tensor on another device; takes every other call",
        "used": "no residue: it takes every call on the device"},
}
