"""The shape of a coverage file, checked field by field before anything reads it.

A coverage file comes from a user as often as from neuron_lab, and a wrong shape must not surface
later as an ``AttributeError`` inside the emulator. :func:`check` walks the fixed, shallow structure
(never recursing into arbitrary values, so no nesting depth breaks it) and raises ``ValueError`` with
one line that names the field at fault, e.g. ``ops['aten::add'].dtypes[0]: expected a dtype name``.
"""

from __future__ import annotations

from typing import Any

from neuron_lab.backend.coverage import conditions

TOP_FIELDS = ("schema_version", "name", "source", "date", "provenance", "default", "downcast_dtypes", "dtypes", "ops",
              "aborts")
REQUIRED = ("schema_version", "name", "source", "date")

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


def _dtype_list(field: str, value: Any) -> None:
    if not isinstance(value, list):
        raise ValueError(f"{field}: expected a list of dtype names (such as [\"float64\"]), got {shown(value)}")
    for i, name in enumerate(value):
        if not _dtype_name(name):
            raise ValueError(f"{field}[{i}]: expected a dtype name such as \"float64\", got {shown(name)}")


def _rule(field: str, value: Any, kinds: tuple[str, ...], dtypes: bool) -> None:
    allowed = ("kind", "reason", "evidence") + (("dtypes", "otherwise", "args") if dtypes else ())
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected an object {{\"kind\": one of {', '.join(kinds)}, \"reason\": ...}}, "
                         f"got {shown(value)}")
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise ValueError(f"{field}: unknown field {shown(unknown[0])} (a rule has {', '.join(allowed)})")
    if value.get("kind") not in kinds:
        got = "nothing" if "kind" not in value else shown(value["kind"])
        raise ValueError(f"{field}.kind: expected one of {', '.join(kinds)}, got {got}")
    if not isinstance(value.get("reason", ""), str):
        raise ValueError(f"{field}.reason: expected a string, got {shown(value['reason'])}")
    if "evidence" in value and value["evidence"] not in EVIDENCE:
        raise ValueError(f"{field}.evidence: expected one of {', '.join(EVIDENCE)}, got {shown(value['evidence'])}")
    if "dtypes" in value and value["dtypes"] is not None:
        _dtype_list(f"{field}.dtypes", value["dtypes"])
    if "otherwise" in value and value["otherwise"] not in kinds:
        raise ValueError(f"{field}.otherwise: expected one of {', '.join(kinds)}, got {shown(value['otherwise'])}")
    if "args" in value:
        conditions.check(f"{field}.args", value["args"], kinds, tuple(EVIDENCE))


def _table(field: str, value: Any, noun: tuple[str, str], example: str, key_ok, kinds: tuple[str, ...],
           dtypes: bool) -> None:
    """An object mapping names (``noun``: singular with its article, plural) to rules."""
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected an object mapping {noun[1]} (such as {example}) to rules, "
                         f"got {shown(value)}")
    for key, rule in value.items():
        if not key_ok(key):
            raise ValueError(f"{field}[{shown(key)}]: not {noun[0]} (such as {example})")
        _rule(f"{field}[{key!r}]", rule, kinds, dtypes)


def _aborts(value: Any) -> None:
    """``aborts``: op names to ``{"reason", "evidence"}``, the ops a report saw abort the process on a parameter."""
    if not isinstance(value, dict):
        raise ValueError(f"aborts: expected an object mapping op names (such as \"aten::im2col\") to "
                         f"{{\"reason\": ..., \"evidence\": ...}}, got {shown(value)}")
    for key, rule in value.items():
        field = f"aborts[{key!r}]"
        if "::" not in key:
            raise ValueError(f"aborts[{shown(key)}]: not an op name (such as \"aten::im2col\")")
        if not isinstance(rule, dict) or set(rule) - {"reason", "evidence"}:
            raise ValueError(f"{field}: expected an object with reason and evidence, got {shown(rule)}")
        if not isinstance(rule.get("reason"), str):
            raise ValueError(f"{field}.reason: expected a string, got {shown(rule.get('reason'))}")
        if rule.get("evidence") not in EVIDENCE:
            raise ValueError(f"{field}.evidence: expected one of {', '.join(EVIDENCE)}, got "
                             f"{shown(rule.get('evidence'))}")


def check(d: Any, schema_version: int, kinds: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the first field of ``d`` that is not a valid coverage file's."""
    if not isinstance(d, dict):
        raise ValueError(f"a coverage file is a JSON object, got {shown(d)}")
    if d.get("schema_version") != schema_version:
        raise ValueError(f"schema_version {shown(d.get('schema_version'))} is not {schema_version}")
    for k in REQUIRED:
        if not isinstance(d.get(k), str) and k != "schema_version":
            raise ValueError(f"{k}: expected a string, got {'nothing' if k not in d else shown(d[k])}")
    unknown = [k for k in d if k not in TOP_FIELDS]
    if unknown:
        raise ValueError(f"unknown field {shown(unknown[0])} (a coverage file has {', '.join(TOP_FIELDS)})")
    if "provenance" in d and not isinstance(d["provenance"], dict):
        raise ValueError(f"provenance: expected an object (repo, commit, method, ...), got {shown(d['provenance'])}")
    if "default" in d:
        _rule("default", d["default"], kinds, dtypes=False)
    if "downcast_dtypes" in d:
        _dtype_list("downcast_dtypes", d["downcast_dtypes"])
    if "dtypes" in d:
        _table("dtypes", d["dtypes"], ("a dtype name", "dtype names"), '"complex64"', _dtype_name, kinds,
               dtypes=False)
    if "ops" in d:
        _table("ops", d["ops"], ("an op name", "op names"), '"aten::add"', lambda k: "::" in k, kinds, dtypes=True)
    if "aborts" in d:
        _aborts(d["aborts"])
