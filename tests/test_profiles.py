"""A coverage profile is checked against its schema before anything reads it: a file that is not a profile is one
line naming the field at fault, from the loader (``ProfileError``), from ``%neuron profile`` (``UsageError``, the
active profile unchanged) and from ``neuron-lab coverage show`` (exit 2). ``neuron-lab run --profile`` is covered in
test_runner.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from shells import loaded_shell, run

from neuron_lab import backend
from neuron_lab.backend import profiles

GOOD = profiles.load().as_dict()


def with_(**fields) -> dict:
    return {**GOOD, **fields}


def without(name: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != name}


OP = "aten::add"
BAD = [
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not a JSON text file (byte 0x89 at offset 0 is not UTF-8)"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid profile: its JSON is nested too deeply"),
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "invalid profile: its JSON is nested too deeply"),
    ("{not json", "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ([1], "a profile is a JSON object, got a list"),
    (with_(schema_version=2), "schema_version 2 is not 1"),
    (without("name"), "name: expected a string, got nothing"),
    (with_(date=20261101), "date: expected a string, got 20261101"),
    (with_(op={}), "unknown field 'op' (a profile has schema_version, name, source, date, provenance, default, "
                   "downcast_dtypes, dtypes, ops)"),
    (with_(ops=[1]), "ops: expected an object mapping op names (such as \"aten::add\") to rules, got a list"),
    (with_(ops={"add": {"kind": "native"}}), "ops['add']: not an op name (such as \"aten::add\")"),
    (with_(ops={OP: "native"}), "ops['aten::add']: expected an object {\"kind\": one of native, fallback, host, "
                                "\"reason\": ...}, got 'native'"),
    (with_(ops={OP: {"kind": "sometimes"}}), "ops['aten::add'].kind: expected one of native, fallback, host, "
                                             "got 'sometimes'"),
    (with_(ops={OP: {"reason": "x"}}), "ops['aten::add'].kind: expected one of native, fallback, host, got nothing"),
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
     "ops['aten::add']: unknown field 'when' (a rule has kind, reason, dtypes)"),
    (with_(dtypes="x"), "dtypes: expected an object mapping dtype names (such as \"complex64\") to rules, got 'x'"),
    (with_(dtypes={"cplx": {"kind": "fallback"}}), "dtypes['cplx']: not a dtype name (such as \"complex64\")"),
    (with_(dtypes={"complex64": {"kind": "fallback", "dtypes": ["float32"]}}),
     "dtypes['complex64']: unknown field 'dtypes' (a rule has kind, reason)"),
    (with_(downcast_dtypes=5), "downcast_dtypes: expected a list of dtype names (such as [\"float64\"]), got 5"),
    (with_(downcast_dtypes=[64]), "downcast_dtypes[0]: expected a dtype name such as \"float64\", got 64"),
    (with_(downcast_dtypes=["double"]), "downcast_dtypes[0]: expected a dtype name such as \"float64\", got 'double'"),
    (with_(default="native"), "default: expected an object {\"kind\": one of native, fallback, host, \"reason\": ...}, "
                              "got 'native'"),
    (with_(default={"kind": "native", "dtypes": ["float32"]}),
     "default: unknown field 'dtypes' (a rule has kind, reason)"),
]
IDS = ["binary", "nested list", "nested object", "not JSON", "a list", "schema", "no name", "date", "unknown field",
       "ops list", "op name", "rule string", "rule kind", "rule without kind", "reason", "op dtypes string",
       "op dtypes number", "op dtype object", "op dtype nested", "rule field", "dtypes string", "dtype name",
       "dtype rule dtypes", "downcast number", "downcast number item", "downcast alias", "default string",
       "default dtypes"]


def write(path, contents) -> str:
    if isinstance(contents, bytes):
        path.write_bytes(contents)
    else:
        path.write_text(contents if isinstance(contents, str) else json.dumps(contents))
    return str(path)


@pytest.mark.parametrize(("contents", "message"), BAD, ids=IDS)
def test_a_file_that_is_not_a_profile_is_one_clear_line(tmp_path, contents, message):
    path = write(tmp_path / "p.json", contents)
    with pytest.raises(profiles.ProfileError) as e:
        profiles.load(path)
    assert str(e.value) == f"{path}: {message}"
    assert isinstance(e.value, ValueError)


def test_a_valid_profile_still_loads_with_every_optional_field(tmp_path):
    path = write(tmp_path / "p.json", with_(ops={OP: {"kind": "fallback", "reason": "r", "dtypes": ["bfloat16"]}},
                                            downcast_dtypes=["float64"]))
    p = profiles.load(path)
    assert p.ops[OP].dtypes == frozenset({"bfloat16"}) and p.downcast_dtypes == frozenset({"float64"})
    assert profiles.load(write(tmp_path / "min.json", {"schema_version": 1, "name": "n", "source": "s",
                                                      "date": "d"})).default == "native"


@pytest.mark.parametrize(("contents", "message"), [BAD[0], BAD[1], BAD[9], BAD[15], BAD[23]],
                         ids=["binary", "nested", "ops list", "op dtypes string", "downcast number"])
def test_the_profile_magic_refuses_it_and_keeps_the_active_profile(tmp_path, contents, message):
    path = write(tmp_path / "p.json", contents)
    with loaded_shell() as sh:
        before = backend.active().profile
        res, _ = run(sh, f"%neuron profile {path}", ok=False)
        assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
        first, usage = str(res.error_in_exec).split("\n")
        assert first == f"%neuron profile: {path}: {message}"
        assert usage.startswith("usage: %neuron profile")
        assert backend.active().profile is before


def test_coverage_show_refuses_it_with_exit_2_and_one_line(tmp_path):
    path = write(tmp_path / "p.json", BAD[9][0])
    r = subprocess.run([sys.executable, "-m", "neuron_lab", "coverage", "show", path], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == f"neuron-lab coverage show: {path}: {BAD[9][1]}"
    assert "Traceback" not in r.stderr
