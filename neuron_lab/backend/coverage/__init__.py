"""Op coverage: data that says which ATen ops run natively on a `neuron` device and which fall back to the CPU.

A coverage file is versioned JSON (``schema_version``, ``name``, ``source``, ``date``) with a default
kind for unknown ops and per-op entries. The emulator reports every op through one; an exported
coverage (``neuron-lab coverage export``) captures a live backend so a laptop can replay it.

"Coverage" is this data's one name (``%neuron coverage``, ``NEURON_LAB_COVERAGE``, ``Report.coverage``);
"profile" is torch.profiler's (``%%neuron profile``). The old spellings still work and warn.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from neuron_lab import settings
from neuron_lab.backend.coverage import names, schema
from neuron_lab.backend.coverage.conditions import ArgRule
from neuron_lab.backend.coverage.names import key as _key
from neuron_lab.deprecation import renamed
from neuron_lab.kinds import ABORT, FALLBACK, HOST, NATIVE, POSSIBLE, SOURCE

SCHEMA_VERSION = 1
_COVERAGE, _OLD = settings.env("NEURON_LAB_COVERAGE"), settings.env("NEURON_LAB_PROFILE")
DEFAULT_COVERAGE, ENV_VAR, OLD_ENV_VAR = _COVERAGE.default, _COVERAGE.name, _OLD.name
OP_KINDS = (NATIVE, FALLBACK, HOST, POSSIBLE)  # the kinds a rule gives: a file of any other is refused
NO_CONFIDENCE = "Confidence: not stated (the coverage names no evidence for this rule)."
BUNDLED = "<bundled>/"  # the path of a bundled coverage: "<bundled>/torchneuron-combined.json"


class CoverageError(ValueError):
    """A coverage file is missing, unreadable, malformed, or of an unknown schema; the message is one line that names
    every problem of the file, each at its field."""


class CoverageWarning(UserWarning):
    """A coverage file names ops this process's PyTorch does not know: their rules never apply here."""


@dataclass(frozen=True)
class OpRule:
    kind: str
    reason: str
    dtypes: frozenset[str] | None = None  # only these dtypes take `kind`; others use the default
    otherwise: str | None = None  # the kind of the op's other dtypes, instead of the default (a dtype gate)
    evidence: str | None = None  # the class of its evidence (a key of schema.EVIDENCE): how sure the prediction is
    args: tuple[ArgRule, ...] = ()  # per-call argument conditions, tried in order when the call is otherwise native

    @property
    def shown(self) -> str:
        """The reason as reports show it: its sentence, how sure it is and on what evidence, then its source."""
        return _shown(self.reason, self.evidence)


def _shown(reason: str, evidence: str | None) -> str:
    """Every reason ends with its confidence: a rule of a file that names no evidence (a user's, an export) says so
    rather than reading as certain."""
    if not reason:
        return reason
    if evidence is None:
        confidence = NO_CONFIDENCE
    else:
        level, means = schema.EVIDENCE[evidence]
        confidence = f"Confidence: {level} ({evidence}: {means})."
    why, sep, source = reason.partition(SOURCE)
    why = why.rstrip()
    return f"{why}{'' if why.endswith('.') else '.'} {confidence}{sep}{source}"


@dataclass
class Coverage:
    """Which ops run natively, which fall back to the CPU or run on the host, and why; read by the emulator."""

    name: str
    source: str
    date: str
    default: str = NATIVE
    default_reason: str = ""
    default_evidence: str | None = None
    ops: dict[str, OpRule] = field(default_factory=dict)
    dtype_rules: dict[str, OpRule] = field(default_factory=dict)  # any op touching this dtype
    downcast_dtypes: frozenset[str] = frozenset({"float64", "int64"})
    path: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)  # how a derived coverage was made (repo, commit, ...)
    aborts: dict[str, OpRule] = field(default_factory=dict)  # ops a report saw abort the process on a parameter

    @property
    def label(self) -> str:
        """How a report names the coverage that made its predictions: a bundled one by its name, a file of one's own
        by its name and its file's, as its name is whatever the file says (a copy of a bundled one keeps its name)."""
        own = self.path and not self.path.startswith(BUNDLED)
        return f"{self.name} from {Path(self.path).name}" if own else self.name

    def classify(self, name: str, dtypes: frozenset[str] = frozenset()) -> tuple[str, str]:
        """Return ``(kind, reason)`` for an op called with device tensors of ``dtypes``.

        An op's own off-device rule comes first, then a dtype rule (complex: the device has none), then the op's
        native rule: a source that registers an op (the April build) says nothing of the dtypes the device lacks."""
        rule = self.ops.get(_key(name))
        if rule is not None and not (rule.dtypes is None or rule.dtypes & dtypes):
            rule = None if rule.otherwise is None else OpRule(rule.otherwise, "")
        if rule is not None and rule.kind != NATIVE:
            return rule.kind, rule.shown
        for dt in dtypes:
            drule = self.dtype_rules.get(dt)
            if drule is not None:
                return drule.kind, drule.shown
        rule = rule or OpRule(self.default, self.default_reason, evidence=self.default_evidence)
        return rule.kind, rule.shown

    def abort_rule(self, name: str) -> OpRule | None:
        """The rule of an op a report saw abort the process when applied to a parameter, or None."""
        return self.aborts.get(_key(name))

    def abort_ops(self) -> list[str]:
        """The op names whose calls :meth:`abort_rule` may flag, in-place forms too: the cores check only these."""
        return sorted({n for k in self.aborts for n in (k, k + "_")})

    def arg_rules(self, name: str) -> tuple[ArgRule, ...]:
        """The argument conditions a call of ``name`` is tested against when :meth:`classify` calls it native."""
        rule = self.ops.get(_key(name))
        return rule.args if rule is not None else ()

    def fallback_names(self) -> list[str]:
        return sorted(n for n, r in self.ops.items() if r.kind != NATIVE)

    def as_dict(self) -> dict[str, Any]:
        def rule(r: OpRule) -> dict[str, Any]:
            d: dict[str, Any] = {"kind": r.kind, "reason": r.reason}
            if r.dtypes is not None:
                d["dtypes"] = sorted(r.dtypes)
            if r.otherwise is not None:
                d["otherwise"] = r.otherwise
            if r.evidence is not None:
                d["evidence"] = r.evidence
            if r.args:
                d["args"] = [_arg_dict(a) for a in r.args]
            return d

        return {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "source": self.source,
            "date": self.date,
            "default": rule(OpRule(self.default, self.default_reason, evidence=self.default_evidence)),
            "downcast_dtypes": sorted(self.downcast_dtypes),
            "dtypes": {k: rule(v) for k, v in sorted(self.dtype_rules.items())},
            "ops": {k: rule(v) for k, v in sorted(self.ops.items())},
            **({"aborts": {k: {"reason": v.reason, "evidence": v.evidence} for k, v in sorted(self.aborts.items())}}
               if self.aborts else {}),
        }

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=1) + "\n")


def _rule(d: dict[str, Any]) -> OpRule:
    dtypes = d.get("dtypes")
    args = tuple(ArgRule(a["kind"], a["test"], a["arg"], _shown(a.get("reason", ""), a.get("evidence")),
                         a.get("value"), a.get("of"), a.get("reason", ""), a.get("evidence"))
                 for a in d.get("args", ()))
    return OpRule(d["kind"], d.get("reason", ""), frozenset(dtypes) if dtypes is not None else None, d.get("otherwise"),
                  d.get("evidence"), args)


def _arg_dict(a: ArgRule) -> dict[str, Any]:
    d: dict[str, Any] = {"kind": a.kind, "test": a.test, "arg": a.arg}
    d.update({k: v for k, v in (("value", a.value), ("of", a.of)) if v is not None})
    d["reason"] = a.reason
    if a.evidence is not None:
        d["evidence"] = a.evidence
    return d


def from_dict(d: Any, path: str = "", *, check_names: bool = True) -> Coverage:
    """A coverage from its JSON data; :class:`CoverageError` (one line, naming each field at fault) when the data is
    not one. ``check_names``: hold its op names to the registered ops (an unknown one warns) and its argument
    conditions' names to their ops' schemas (a wrong one is a problem); the bundled files are held to them by the tests
    instead, so that another torch never breaks the default."""
    ops = names.registered() if check_names else None
    found = schema.problems(d, SCHEMA_VERSION, OP_KINDS, ops)
    where = path or "coverage"
    if len(found) == 1:
        raise CoverageError(f"{where}: {found[0]}")
    if found:
        listed = "; ".join(f"({i}) {p}" for i, p in enumerate(found, 1))
        raise CoverageError(f"{where}: {len(found)} problems: {listed}")
    if ops is not None:
        _warn_unknown(where, [k for table in ("ops", "aborts") for k in d.get(table, {}) if not names.known(k, ops)],
                      ops)
    default = _rule(d.get("default", {"kind": NATIVE}))
    return Coverage(
        name=d["name"],
        source=d["source"],
        date=d["date"],
        default=default.kind,
        default_reason=default.reason,
        default_evidence=default.evidence,
        ops={_key(k): _rule(v) for k, v in d.get("ops", {}).items()},
        dtype_rules={k: _rule(v) for k, v in d.get("dtypes", {}).items()},
        downcast_dtypes=frozenset(d.get("downcast_dtypes", ("float64", "int64"))),
        path=path,
        provenance=dict(d.get("provenance", {})),
        aborts={_key(k): OpRule(ABORT, v["reason"], evidence=v["evidence"]) for k, v in d.get("aborts", {}).items()},
    )


def _warn_unknown(where: str, unknown: list[str], ops: frozenset[str]) -> None:
    """Ops PyTorch does not know warn rather than fail: a file exported on a Trn instance names the ops of its torch
    and of torch-neuronx, which a laptop's torch may lack, and their rules are harmless; a misspelt name is named with
    the closest registered one."""
    if not unknown:
        return
    import torch

    keys = frozenset(map(_key, ops))
    listed = ", ".join(f"{n!r}{names.did_you_mean(n, keys, cutoff=0.85)}" for n in unknown)
    warnings.warn(f"{where}: {len(unknown)} op{'s' if len(unknown) > 1 else ''} unknown to torch {torch.__version__}, "
                  f"whose rules never apply here: {listed}", CoverageWarning, stacklevel=3)


def bundled() -> list[str]:
    """Names of the coverage files shipped with neuron_lab."""
    files = resources.files(__name__)
    return sorted(p.name.removesuffix(".json") for p in files.iterdir() if p.name.endswith(".json"))


def load(name_or_path: str | os.PathLike | None = None) -> Coverage:
    """Load a bundled coverage by name, or a coverage file by path; ``None`` means the env var or default."""
    spec = str(name_or_path) if name_or_path is not None else from_environment() or DEFAULT_COVERAGE
    bundled_file = spec in bundled()
    if bundled_file:
        res = resources.files(__name__).joinpath(f"{spec}.json")
        text, path = res.read_text(), f"{BUNDLED}{spec}.json"
    else:
        p = Path(spec).expanduser()
        if not p.is_file():
            raise CoverageError(f"no coverage {spec!r}: not a bundled coverage ({', '.join(bundled())}) nor a file")
        path = str(p)
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise CoverageError(f"{path}: cannot read it: {e.strerror or e}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CoverageError(f"{path}: not a JSON text file (byte 0x{raw[e.start]:02x} at offset {e.start} is "
                               "not UTF-8)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CoverageError(f"{path}: invalid JSON: {e}") from None
    except RecursionError:
        raise CoverageError(f"{path}: invalid coverage: its JSON is nested too deeply") from None
    return from_dict(data, path, check_names=not bundled_file)


def configured() -> tuple[Coverage, str | None]:
    """The coverage the environment names, and for one that does not load, the problem to report: the default is
    used instead, as for the emulator's other settings, so a bad value never costs the device. One that names ops
    torch does not know loads, and its :class:`CoverageWarning` is the problem: the emulator's problems warn once
    and ``doctor`` lists them, and a warning raised (``-W error``) must not end the install."""
    spec = from_environment()
    var = ENV_VAR if _COVERAGE.raw() else OLD_ENV_VAR
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", CoverageWarning)
            cov = load(spec or DEFAULT_COVERAGE)
        return cov, next((f"{var}: {w.message}" for w in said if w.category is CoverageWarning), None)
    except CoverageError as e:
        if spec is None:  # the bundled default itself: a broken install, not a setting
            raise
        return load(DEFAULT_COVERAGE), f"{var}: {e}; using {DEFAULT_COVERAGE}"


def from_environment() -> str | None:
    """NEURON_LAB_COVERAGE, else the deprecated NEURON_LAB_PROFILE (with a warning naming the new one)."""
    spec, old = _COVERAGE.raw(), _OLD.raw()
    if not spec and old:
        renamed(OLD_ENV_VAR, ENV_VAR)
        return old
    return spec or None


__all__ = ["DEFAULT_COVERAGE", "ENV_VAR", "Coverage", "CoverageError", "CoverageWarning", "OpRule", "bundled",
           "configured", "from_dict", "from_environment", "load"]


def backend_ops() -> list[str]:
    """Every ATen op (by coverage key) that can reach a device backend: ops with a CompositeImplicitAutograd
    kernel for every overload decompose before the backend sees them, so no coverage can make them fall back."""
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    keys: dict[str, bool] = {}
    for full in torch._C._dispatch_get_all_op_names():
        if full.startswith("aten::"):
            key = _key(full.split(".")[0])
            keys[key] = keys.get(key, False) or not has(full, "CompositeImplicitAutograd")
    return sorted(k for k, reaches in keys.items() if reaches)


def diff(a: Coverage, b: Coverage) -> list[tuple[str, str, str]]:
    """``(op, kind under a, kind under b)`` for every op the two classify differently (dtype-free calls), over
    the ops a backend can see and every op either coverage lists."""
    names = sorted({*backend_ops(), *a.ops, *b.ops})
    out = [(n, a.classify(n)[0], b.classify(n)[0]) for n in names]
    return [row for row in out if row[1] != row[2]]
