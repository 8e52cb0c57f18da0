"""The shape of a coverage file, checked field by field before anything reads it.

A coverage file comes from a user as often as from neuron_lab, and a wrong shape must not surface
later as an ``AttributeError`` inside the emulator. :func:`problems` walks the fixed, shallow structure
(never recursing into arbitrary values, so no nesting depth breaks it) and returns every problem it finds, each one
line that names the field at fault and what it expects, e.g. ``ops['aten::add'].dtypes[0]: expected a dtype name``:
a user fixes a file in one pass, not one field per try. Given the registered ops (:func:`names.registered`), it
also checks each argument condition's argument names against its op's schema.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.backend.coverage import conditions, names

# A coverage file's fields and what each holds, in the order a file lists them: the one home of the docs' table.
FIELDS: dict[str, str] = {
    "schema_version": "`1`, the only version: a file of another version is refused",
    "name": "what reports call the coverage (a file of one's own is named with its file's name too)",
    "source": "where its facts come from, in a sentence or two (`neuron-lab coverage show` prints it)",
    "date": "when they were gathered: any text, an ISO date by convention",
    "provenance": "an object saying how a derived coverage was made (repo, commit, method, ...)",
    "default": "the rule of every op the file does not list; `{\"kind\": \"native\"}` when absent",
    "downcast_dtypes": "the dtypes whose calls are reported as 64-bit downcasts; `[\"float64\", \"int64\"]` when "
                       "absent",
    "dtypes": "dtype names (`complex64`, as torch names them) to the rule of any call with a device tensor of one; an "
              "op's own rule of another kind than native comes first",
    "ops": "op names (`aten::atan2`: no overload, as a rule applies to every overload and to the in-place form "
           "`aten::atan2_`) to their rules",
    "aborts": "op names to `{\"reason\", \"evidence\"}` (both required): ops a report saw abort the process when "
              "applied to a parameter",
}
TOP_FIELDS = tuple(FIELDS)
REQUIRED = ("schema_version", "name", "source", "date")
# A rule's fields: every rule has the first three (kind required), an op's rule the others too.
RULE_FIELDS: dict[str, str] = {
    "kind": "what the calls are reported as",
    "reason": "the sentence reports show under \"why\"; a line `source: ...` after it says where it comes from",
    "evidence": "the class of its evidence (below): the reason ends with its confidence, or with \"Confidence: not "
                "stated\" without one",
    "dtypes": "a list of dtype names: only calls with a device tensor of one of them take `kind`",
    "otherwise": "with `dtypes`: the kind of the op's other calls, instead of the default's",
    "args": "argument rules (below), tried in order on each eager call otherwise native: the first one it meets gives "
            "the call its kind",
}
COMMON_RULE_FIELDS = 3  # kind, reason, evidence: a default's or a dtype's rule has no more

# How sure a prediction is, by the class of its evidence (a rule's "evidence"): the one table every coverage names.
# A documented fallback is what TorchNeuron's own table says; the source's registry and gates say what the April build
# does, not 2.33; an upstream test that fails may fail on a wrong result rather than a fallback.
EVIDENCE: dict[str, tuple[str, str]] = {
    "documented": ("certain", "TorchNeuron's documentation for 2.33 says so"),
    "reported": ("certain", "a user's report of TorchNeuron 2.33 shows it"),
    "host kernel": ("certain", "TorchNeuron's source computes it on the host with a kernel of its own"),
    "not registered": ("likely", "no kernel for it is registered in TorchNeuron's source"),
    "registered": ("likely", "TorchNeuron's source runs it on the device: a registered kernel or an allowed view"),
    "dtype gate": ("likely", "its kernels' can_handle turns this dtype away in TorchNeuron's source"),
    "empty gate": ("likely", "its kernel's can_handle turns an empty tensor away in TorchNeuron's source"),
    "shape gate": ("likely", "no implementation's can_handle takes these arguments in TorchNeuron's source"),
    "upstream xfail": ("possible", "TorchNeuron's own runs of PyTorch's tests fail for this op and dtype"),
    "xla report": ("possible", "a public report saw it on torch-neuronx's XLA trace path; none shows the native "
                               "backend doing it"),
    "no evidence": ("possible", "no source names it"),
}
OP_EXAMPLE, ABORT_EXAMPLE = '"aten::add"', '"aten::im2col"'


def shown(value: Any) -> str:
    """A value for a message: short, one line, and safe for any nesting depth (no recursive repr)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dtype_name(name: Any) -> bool:
    """A dtype as the backend names it in op events: ``float64``, ``bfloat16`` (not an alias such as ``float``)."""
    import torch

    obj = getattr(torch, name, None) if isinstance(name, str) else None
    return isinstance(obj, torch.dtype) and str(obj) == f"torch.{name}"


def _dtype_list(out: list[str], field: str, value: Any) -> None:
    if not isinstance(value, list):
        out.append(f"{field}: expected a list of dtype names (such as [\"float64\"]), got {shown(value)}")
        return
    out += [f"{field}[{i}]: expected a dtype name such as \"float64\", got {shown(name)}"
            for i, name in enumerate(value) if not _dtype_name(name)]


def _rule(out: list[str], field: str, value: Any, kinds: tuple[str, ...], dtypes: bool,
          arguments: tuple[str, ...] | None = None) -> None:
    """One rule; ``arguments``: its op's argument names, to check its argument conditions' against (None: not)."""
    allowed = tuple(RULE_FIELDS)[:None if dtypes else COMMON_RULE_FIELDS]
    if not isinstance(value, dict):
        out.append(f"{field}: expected an object {{\"kind\": one of {', '.join(kinds)}, \"reason\": ...}}, "
                   f"got {shown(value)}")
        return
    out += [f"{field}: unknown field {shown(k)} (a rule has {', '.join(allowed)})" for k in value if k not in allowed]
    if value.get("kind") not in kinds:
        got = "nothing" if "kind" not in value else shown(value["kind"])
        out.append(f"{field}.kind: expected one of {', '.join(kinds)}, got {got}")
    if not isinstance(value.get("reason", ""), str):
        out.append(f"{field}.reason: expected a string, got {shown(value['reason'])}")
    if "evidence" in value and value["evidence"] not in tuple(EVIDENCE):  # a tuple: a list or object is unhashable
        out.append(f"{field}.evidence: expected one of {', '.join(EVIDENCE)}, got {shown(value['evidence'])}")
    if not dtypes:
        return
    if value.get("dtypes") is not None:
        _dtype_list(out, f"{field}.dtypes", value["dtypes"])
    if "otherwise" in value and value["otherwise"] not in kinds:
        out.append(f"{field}.otherwise: expected one of {', '.join(kinds)}, got {shown(value['otherwise'])}")
    if "args" in value:
        out += conditions.problems(f"{field}.args", value["args"], kinds, tuple(EVIDENCE), arguments)


def _op_name(out: list[str], field: str, key: str, ops: frozenset[str] | None, example: str = OP_EXAMPLE) -> bool:
    """Whether ``key`` names an op as rules do: ``namespace::name``, never an overload, which no call would match."""
    if "::" not in key:
        out.append(f"{field}[{shown(key)}]: not an op name (such as {example})")
        return False
    if "." in key:
        op = key.split(".")[0]
        unknown = "" if ops is None or names.known(op, ops) else ", which torch does not know either"
        out.append(f"{field}[{key!r}]: expected the op's name without an overload ({op!r}{unknown}): a rule applies "
                   "to every overload of its op")
        return False
    return True


def _ops(out: list[str], value: Any, kinds: tuple[str, ...], ops: frozenset[str] | None) -> None:
    """``ops``: op names to rules; with ``ops`` (the registered ones), argument conditions are held to the schema."""
    if not isinstance(value, dict):
        out.append(f"ops: expected an object mapping op names (such as {OP_EXAMPLE}) to rules, got {shown(value)}")
        return
    for key, rule in value.items():
        if _op_name(out, "ops", key, ops):
            tested = ops is not None and isinstance(rule, dict) and "args" in rule and names.known(key, ops)
            _rule(out, f"ops[{key!r}]", rule, kinds, dtypes=True, arguments=names.arguments(key) if tested else None)


def _dtypes(out: list[str], value: Any, kinds: tuple[str, ...]) -> None:
    """``dtypes``: dtype names to the rule of any op touching one."""
    if not isinstance(value, dict):
        out.append(f"dtypes: expected an object mapping dtype names (such as \"complex64\") to rules, "
                   f"got {shown(value)}")
        return
    for key, rule in value.items():
        if not _dtype_name(key):
            out.append(f"dtypes[{shown(key)}]: not a dtype name (such as \"complex64\")")
        else:
            _rule(out, f"dtypes[{key!r}]", rule, kinds, dtypes=False)


def _aborts(out: list[str], value: Any, ops: frozenset[str] | None) -> None:
    """``aborts``: op names to ``{"reason", "evidence"}``, the ops a report saw abort the process on a parameter."""
    if not isinstance(value, dict):
        out.append(f"aborts: expected an object mapping op names (such as {ABORT_EXAMPLE}) to "
                   f"{{\"reason\": ..., \"evidence\": ...}}, got {shown(value)}")
        return
    for key, rule in value.items():
        field = f"aborts[{key!r}]"
        if not _op_name(out, "aborts", key, ops, ABORT_EXAMPLE):
            continue
        if not isinstance(rule, dict) or set(rule) - {"reason", "evidence"}:
            out.append(f"{field}: expected an object with reason and evidence, got {shown(rule)}")
            continue
        if not isinstance(rule.get("reason"), str):
            out.append(f"{field}.reason: expected a string, got {shown(rule.get('reason'))}")
        if rule.get("evidence") not in tuple(EVIDENCE):
            out.append(f"{field}.evidence: expected one of {', '.join(EVIDENCE)}, got {shown(rule.get('evidence'))}")


def problems(d: Any, schema_version: int, kinds: tuple[str, ...], ops: frozenset[str] | None = None) -> list[str]:
    """Every field of ``d`` that is not a valid coverage file's, one line each (none: it is one). A file of another
    schema version is that one problem: its fields mean other things. ``ops``: the registered op names, to check
    argument conditions against their ops' schemas (None: not checked)."""
    if not isinstance(d, dict):
        return [f"a coverage file is a JSON object, got {shown(d)}"]
    if d.get("schema_version") != schema_version:
        return [f"schema_version {shown(d.get('schema_version'))} is not {schema_version}"]
    out = [f"{k}: expected a string, got {'nothing' if k not in d else shown(d[k])}"
           for k in REQUIRED[1:] if not isinstance(d.get(k), str)]
    out += [f"unknown field {shown(k)} (a coverage file has {', '.join(TOP_FIELDS)})" for k in d if k not in TOP_FIELDS]
    if "provenance" in d and not isinstance(d["provenance"], dict):
        out.append(f"provenance: expected an object (repo, commit, method, ...), got {shown(d['provenance'])}")
    if "default" in d:
        _rule(out, "default", d["default"], kinds, dtypes=False)
    if "downcast_dtypes" in d:
        _dtype_list(out, "downcast_dtypes", d["downcast_dtypes"])
    if "dtypes" in d:
        _dtypes(out, d["dtypes"], kinds)
    if "ops" in d:
        _ops(out, d["ops"], kinds, ops)
    if "aborts" in d:
        _aborts(out, d["aborts"], ops)
    return out
