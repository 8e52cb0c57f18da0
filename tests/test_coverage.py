"""A coverage file is checked against its schema before anything reads it: a file that is not one is one line
naming the field at fault, from the loader (``CoverageError``), from ``%neuron coverage`` (``UsageError``, the
active coverage unchanged) and from ``neuron-lab coverage show`` (exit 2). ``neuron-lab run --coverage`` is covered
in test_runner.py. The old spellings (``%neuron profile NAME``, ``NEURON_LAB_PROFILE``, ``--profile``,
``Report.profile``) still work and warn."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
from IPython.core.error import UsageError
from shells import loaded_shell, run

from neuron_lab import backend
from neuron_lab.backend import coverage
from neuron_lab.extension import session_of

GOOD = coverage.load().as_dict()


def with_(**fields) -> dict:
    return {**GOOD, **fields}


def without(name: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != name}


OP = "aten::add"
BAD = [
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not a JSON text file (byte 0x89 at offset 0 is not UTF-8)"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid coverage: its JSON is nested too deeply"),
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "invalid coverage: its JSON is nested too deeply"),
    ("{not json", "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ([1], "a coverage file is a JSON object, got a list"),
    (with_(schema_version=2), "schema_version 2 is not 1"),
    (without("name"), "name: expected a string, got nothing"),
    (with_(date=20261101), "date: expected a string, got 20261101"),
    (with_(op={}), "unknown field 'op' (a coverage file has schema_version, name, source, date, provenance, default, "
                   "downcast_dtypes, dtypes, ops, aborts)"),
    (with_(ops=[1]), "ops: expected an object mapping op names (such as \"aten::add\") to rules, got a list"),
    (with_(ops={"add": {"kind": "native"}}), "ops['add']: not an op name (such as \"aten::add\")"),
    (with_(ops={OP: "native"}), "ops['aten::add']: expected an object {\"kind\": one of native, fallback, host, "
                                "possible, \"reason\": ...}, got 'native'"),
    (with_(ops={OP: {"kind": "sometimes"}}), "ops['aten::add'].kind: expected one of native, fallback, host, "
                                             "possible, got 'sometimes'"),
    (with_(ops={OP: {"reason": "x"}}), "ops['aten::add'].kind: expected one of native, fallback, host, possible, "
                                       "got nothing"),
    (with_(ops={OP: {"kind": "native", "reason": 3}}), "ops['aten::add'].reason: expected a string, got 3"),
    (with_(ops={OP: {"kind": "native", "dtypes": "float32"}}),
     "ops['aten::add'].dtypes: expected a list of dtype names (such as [\"float64\"]), got 'float32'"),
    (with_(ops={OP: {"kind": "native", "dtypes": 5}}),
     "ops['aten::add'].dtypes: expected a list of dtype names (such as [\"float64\"]), got 5"),
    (with_(ops={OP: {"kind": "native", "dtypes": [{}]}}),
     "ops['aten::add'].dtypes[0]: expected a dtype name such as \"float64\", got an object"),
    (with_(ops={OP: {"kind": "native", "dtypes": [[[[[[1]]]]]]}}),
     "ops['aten::add'].dtypes[0]: expected a dtype name such as \"float64\", got a list"),
    (with_(ops={OP: {"kind": "native", "when": "always"}}),
     "ops['aten::add']: unknown field 'when' (a rule has kind, reason, evidence, dtypes, otherwise, args)"),
    (with_(ops={OP: {"kind": "possible", "evidence": "a hunch"}}),
     "ops['aten::add'].evidence: expected one of documented, reported, host kernel, not registered, registered, "
     "dtype gate, empty gate, shape gate, upstream xfail, xla report, no evidence, got 'a hunch'"),
    (with_(dtypes="x"), "dtypes: expected an object mapping dtype names (such as \"complex64\") to rules, got 'x'"),
    (with_(dtypes={"cplx": {"kind": "fallback"}}), "dtypes['cplx']: not a dtype name (such as \"complex64\")"),
    (with_(dtypes={"complex64": {"kind": "fallback", "dtypes": ["float32"]}}),
     "dtypes['complex64']: unknown field 'dtypes' (a rule has kind, reason, evidence)"),
    (with_(downcast_dtypes=5), "downcast_dtypes: expected a list of dtype names (such as [\"float64\"]), got 5"),
    (with_(downcast_dtypes=[64]), "downcast_dtypes[0]: expected a dtype name such as \"float64\", got 64"),
    (with_(downcast_dtypes=["double"]), "downcast_dtypes[0]: expected a dtype name such as \"float64\", got 'double'"),
    (with_(default="native"), "default: expected an object {\"kind\": one of native, fallback, host, possible, "
                              "\"reason\": ...}, got 'native'"),
    (with_(default={"kind": "native", "dtypes": ["float32"]}),
     "default: unknown field 'dtypes' (a rule has kind, reason, evidence)"),
    (with_(ops={"aten::atan2.nosuchoverload": {"kind": "fallback"}}),
     "ops['aten::atan2.nosuchoverload']: expected the op's name without an overload ('aten::atan2'): a rule applies "
     "to every overload of its op"),
    (with_(ops={"aten::atan2.out": {"kind": "fallback"}}),  # a real overload: no call would match it either
     "ops['aten::atan2.out']: expected the op's name without an overload ('aten::atan2'): a rule applies to every "
     "overload of its op"),
    (with_(ops={OP: {"kind": "native", "evidence": ["documented"]}}),
     "ops['aten::add'].evidence: expected one of documented, reported, host kernel, not registered, registered, "
     "dtype gate, empty gate, shape gate, upstream xfail, xla report, no evidence, got a list"),
]
IDS = ["binary", "nested list", "nested object", "not JSON", "a list", "schema", "no name", "date", "unknown field",
       "ops list", "op name", "rule string", "rule kind", "rule without kind", "reason", "op dtypes string",
       "op dtypes number", "op dtype object", "op dtype nested", "rule field", "evidence", "dtypes string",
       "dtype name", "dtype rule dtypes", "downcast number", "downcast number item", "downcast alias", "default string",
       "default dtypes", "unknown overload", "overload", "evidence list"]


def write(path, contents) -> str:
    if isinstance(contents, bytes):
        path.write_bytes(contents)
    else:
        path.write_text(contents if isinstance(contents, str) else json.dumps(contents))
    return str(path)


@pytest.mark.parametrize(("contents", "message"), BAD, ids=IDS)
def test_a_file_that_is_not_a_profile_is_one_clear_line(tmp_path, contents, message):
    path = write(tmp_path / "p.json", contents)
    with pytest.raises(coverage.CoverageError) as e:
        coverage.load(path)
    assert str(e.value) == f"{path}: {message}"
    assert isinstance(e.value, ValueError)


def test_every_problem_of_a_file_is_in_one_error_each_at_its_place(tmp_path):
    """Walkthrough 48 point 2: a file with several mistakes was refused one mistake at a time."""
    path = write(tmp_path / "p.json", {"schema_version": 1, "source": "mine", "ops": {
        OP: {"kind": "sometimes"}, "aten::atan2": {"kind": "fallback", "dtypes": ["float32", "double"]}},
        "dtype": {}})
    with pytest.raises(coverage.CoverageError) as e:
        coverage.load(path)
    assert str(e.value) == (
        f"{path}: 5 problems: (1) name: expected a string, got nothing; (2) date: expected a string, got nothing; "
        "(3) unknown field 'dtype' (a coverage file has schema_version, name, source, date, provenance, default, "
        "downcast_dtypes, dtypes, ops, aborts); (4) ops['aten::add'].kind: expected one of native, fallback, host, "
        "possible, got 'sometimes'; (5) ops['aten::atan2'].dtypes[1]: expected a dtype name such as \"float64\", got "
        "'double'")


def test_an_op_torch_does_not_know_warns_naming_it_and_the_op_it_is_closest_to(tmp_path):
    """Walkthrough 48 point 1: a misspelt op passed silently and its rule never fired. It warns rather than fails:
    a file exported on a Trn instance names ops of its own torch and of torch-neuronx that this torch may lack."""
    import torch

    path = write(tmp_path / "p.json", with_(ops={"aten::not_a_real_op": {"kind": "fallback"},
                                                 "aten::atan22": {"kind": "fallback"}, "aten::atan2": {"kind": "host"}},
                                            aborts={"aten::im2coll": {"reason": "r", "evidence": "xla report"}}))
    with pytest.warns(coverage.CoverageWarning) as caught:
        p = coverage.load(path)
    assert [str(w.message) for w in caught] == [
        f"{path}: 3 ops unknown to torch {torch.__version__}, whose rules never apply here: 'aten::not_a_real_op', "
        "'aten::atan22' (did you mean 'aten::atan2'?), 'aten::im2coll' (did you mean 'aten::im2col'?)"]
    assert p.classify("aten::atan2")[0] == "host"


@pytest.mark.parametrize("name", coverage.bundled())
def test_a_shipped_coverage_names_only_ops_and_arguments_torch_knows(name):
    """The bundled files skip the check when they load (another torch must never break the default): this holds
    them to it under the pinned torch."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        coverage.from_dict(coverage.load(name).as_dict(), name, check_names=True)


def test_a_valid_profile_still_loads_with_every_optional_field(tmp_path):
    path = write(tmp_path / "p.json", with_(ops={OP: {"kind": "fallback", "reason": "r", "dtypes": ["bfloat16"]}},
                                            downcast_dtypes=["float64"]))
    p = coverage.load(path)
    assert p.ops[OP].dtypes == frozenset({"bfloat16"}) and p.downcast_dtypes == frozenset({"float64"})
    assert coverage.load(write(tmp_path / "min.json", {"schema_version": 1, "name": "n", "source": "s",
                                                      "date": "d"})).default == "native"


@pytest.mark.parametrize(("contents", "message"), [BAD[0], BAD[1], BAD[9], BAD[15], BAD[23]],
                         ids=["binary", "nested", "ops list", "op dtypes string", "downcast number"])
def test_the_coverage_magic_refuses_it_and_keeps_the_active_coverage(tmp_path, contents, message):
    path = write(tmp_path / "p.json", contents)
    with loaded_shell() as sh:
        before = backend.active().coverage
        res, _ = run(sh, f"%neuron coverage {path}", ok=False)
        assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
        first, usage = str(res.error_in_exec).split("\n")
        assert first == f"%neuron coverage: {path}: {message}"
        assert usage.startswith("usage: %neuron coverage")
        assert backend.active().coverage is before


def test_coverage_show_refuses_it_with_exit_2_and_one_line(tmp_path):
    path = write(tmp_path / "p.json", BAD[9][0])
    r = subprocess.run([sys.executable, "-m", "neuron_lab", "coverage", "show", path], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == f"neuron-lab coverage show: {path}: {BAD[9][1]}"
    assert "Traceback" not in r.stderr


# -- the old spellings ("profile" is torch.profiler's now) still work, and say what replaced them -----------------
def test_the_profile_magic_on_a_line_still_shows_and_switches_the_coverage_and_warns(shell):
    b = backend.active()
    before = b.coverage.name
    other = next(n for n in coverage.bundled() if n != before)
    try:
        with pytest.warns(FutureWarning, match=r"`%neuron profile NAME` is deprecated: use `%neuron coverage NAME`"):
            res, _ = run(shell, f"%neuron profile {other}")
        assert str(res.result).startswith(f"op coverage: {other}, dated ") and b.coverage.name == other
        with pytest.warns(FutureWarning):
            res, _ = run(shell, "%neuron profile")
        assert str(res.result).startswith(f"op coverage: {other}, dated ")
    finally:
        b.set_coverage(before)


def test_neuron_lab_profile_is_still_read_when_neuron_lab_coverage_is_not_set(monkeypatch):
    monkeypatch.delenv(coverage.ENV_VAR, raising=False)
    monkeypatch.setenv(coverage.OLD_ENV_VAR, "torchneuron-src-2026-04")
    with pytest.warns(FutureWarning, match="NEURON_LAB_PROFILE is deprecated: use NEURON_LAB_COVERAGE"):
        assert coverage.load().name == "torchneuron-src-2026-04"
    monkeypatch.setenv(coverage.ENV_VAR, "torchneuron-2.33")  # the new name wins, and nothing warns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert coverage.load().name == "torchneuron-2.33"


def test_the_runners_profile_option_is_still_its_coverage_option():
    from neuron_lab.runner import main

    with pytest.warns(FutureWarning, match="neuron-lab run --profile is deprecated: use neuron-lab run --coverage"):
        args = main.parser().parse_args(["nb.ipynb", "--profile", "torchneuron-2.33"])
    assert args.coverage == "torchneuron-2.33"
    assert "--profile" not in main.parser().format_help()  # the help names the new spelling only


def test_report_and_backend_profile_attributes_are_the_coverage_under_the_old_name():
    import neuron_lab
    from neuron_lab.report.model import Report

    with neuron_lab.track() as report:
        pass
    assert report.coverage == backend.active().coverage.name
    with pytest.warns(FutureWarning, match="Report.profile is deprecated: use Report.coverage"):
        assert report.profile == report.coverage
    with pytest.warns(FutureWarning, match=r"Backend.profile is deprecated"):
        assert backend.active().profile is backend.active().coverage
    old = report.as_dict()
    old["profile"] = old.pop("coverage")  # a report saved before the rename
    assert Report.from_dict(old).coverage == report.coverage


# -- every reason ends with its confidence ----------------------------------------------------------------------
@pytest.mark.parametrize("name", coverage.bundled())
def test_every_reason_of_every_shipped_coverage_names_its_evidence(name):
    """Walkthrough 47 point 9: torchneuron-src-2026-04 named no evidence, so its reasons showed no confidence."""
    p = coverage.load(name)
    rules = {"default": coverage.OpRule(p.default, p.default_reason, evidence=p.default_evidence),
             **{f"dtypes[{k}]": r for k, r in p.dtype_rules.items()}, **p.ops,
             **{f"aborts[{k}]": r for k, r in p.aborts.items()}}
    missing = [k for k, r in rules.items() if r.evidence is None]
    missing += [f"{k}.args" for k, r in p.ops.items() for a in r.args if a.evidence is None]
    assert not missing, f"{name}: no evidence for {missing[:5]}"
    for k, r in rules.items():
        assert "Confidence: " in r.shown.partition(coverage.SOURCE)[0], k


def test_a_reason_shown_in_a_report_ends_with_its_confidence_under_every_shipped_coverage(shell):
    b = backend.active()
    before = b.coverage.name
    try:
        run(shell, "import torch\na = torch.ones(3, device='neuron')")
        for name in coverage.bundled():
            run(shell, f"%neuron coverage {name}")
            res, _ = run(shell, "m = torch.minimum(a, a)\nq = torch.acos(a)")
            rows = session_of(shell).history[res.execution_count].ops_not_native
            assert rows, name
            for row in rows:
                assert "Confidence: " in row.reason.partition(coverage.SOURCE)[0], (name, row.op, row.reason)
    finally:
        b.set_coverage(before)


def test_a_rule_with_no_evidence_says_its_confidence_is_not_stated():
    shown = coverage.OpRule("fallback", "no kernel.\nsource: my notes").shown
    assert shown == f"no kernel. {coverage.NO_CONFIDENCE}\nsource: my notes"


# -- the docs' coverage file and its error are the loader's ----------------------------------------------------------
def test_the_docs_example_file_loads_and_its_error_is_the_loaders():
    """docs/torchneuron.md's "A coverage file of your own": its example loads as it reads, and its refusal is the
    loader's line for the example with those three mistakes."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "torchneuron.md").read_text(encoding="utf-8")
    section = text.split("### A coverage file of your own", 1)[1].split("\n### ", 1)[0]
    example = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    refusal = re.search(r"```text\n(.*?)\n```", section, re.S).group(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = coverage.from_dict(example, "mine.json")
    assert p.classify("aten::atan2_")[0] == "fallback" and p.label == "our-trn-build from mine.json"
    assert [p.classify("aten::sort", frozenset({dt}))[0] for dt in ("int64", "float32")] == ["possible", "native"]
    topk = example["ops"]["aten::topk"]
    wrong = {k: v for k, v in example.items() if k != "date"}
    wrong["ops"] = {"aten::atan2.out": example["ops"]["aten::atan2"],
                    "aten::topk": {**topk, "args": [{**topk["args"][0], "arg": "selff"}]}}
    with pytest.raises(coverage.CoverageError) as e:
        coverage.from_dict(wrong, "mine.json")
    assert str(e.value) == refusal
