"""Property-based checks of what users type into settings: any text gives a clear outcome, never a crash.

Coverage files (JSON) either load or raise one ``CoverageError`` naming what is wrong; the
emulated topology (instance, LNC, visible cores, capacity) always yields usable devices, with every
ignored value reported as a problem.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_lab.backend import coverage
from neuron_lab.backend.emulator import topology

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
profile_like = st.fixed_dictionaries({}, optional={
    "schema_version": json_values, "name": json_values, "source": json_values, "date": json_values,
    "default": st.sampled_from(["native", "fallback", "host", "bogus"]) | json_values,
    "ops": st.dictionaries(st.sampled_from(["aten::atan2", "aten::add", "x"]), json_values, max_size=3) | json_values,
    "dtypes": json_values, "downcast_dtypes": json_values,
})


@settings(max_examples=150, deadline=None)
@given(doc=profile_like | json_values)
def test_any_json_loads_or_is_one_profile_error(tmp_path_factory, doc) -> None:
    path = tmp_path_factory.mktemp("p") / "profile.json"
    path.write_text(json.dumps(doc))
    try:
        p = coverage.load(str(path))
    except coverage.CoverageError as e:
        assert "\n" not in str(e) and str(e)
    else:
        assert p.default in ("native", "fallback", "host")


@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_bytes_load_or_are_one_profile_error(tmp_path_factory, raw) -> None:
    path = tmp_path_factory.mktemp("p") / "profile.json"
    path.write_bytes(raw)
    try:
        coverage.load(str(path))
    except coverage.CoverageError as e:
        assert "\n" not in str(e)


settings_text = st.one_of(st.text(max_size=12), st.sampled_from(
    ["trn2.48xlarge", "trn1.2xlarge", "1", "2", "0-1", "3,1", "2-1", "0-200", "24GiB", "-1", "1e999", "nan", "0"]))


@settings(max_examples=300, deadline=None)
@given(instance=settings_text, lnc=settings_text, visible=settings_text, num=settings_text, capacity=settings_text)
def test_any_topology_settings_give_usable_devices(instance, lnc, visible, num, capacity) -> None:
    env = {"NEURON_LAB_INSTANCE": instance, "NEURON_LOGICAL_NC_CONFIG": lnc, "NEURON_RT_VISIBLE_CORES": visible,
           "NEURON_RT_NUM_CORES": num, "NEURON_LAB_DEVICE_MEMORY": capacity}
    t = topology.detect(env)
    assert 1 <= len(t.capacities) <= topology.MAX_DEVICES and len(t.cores) == len(t.capacities)
    assert all(0 < c <= topology.MAX_CAPACITY for c in t.capacities)
    assert len(set(t.cores)) == len(t.cores)
    assert all("\n" not in p for p in t.problems)
    if instance.strip() and instance.strip() not in topology.INSTANCES:
        assert any(p.startswith("NEURON_LAB_INSTANCE=") for p in t.problems)
