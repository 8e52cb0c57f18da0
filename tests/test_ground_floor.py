"""The ground floor every layer reads: the kinds vocabulary, the version, how objects show in IPython, site maps."""

from __future__ import annotations

import dataclasses
from importlib.metadata import version

import pytest
from IPython.lib.pretty import pretty

import neuron_lab
from neuron_lab import kinds
from neuron_lab.report.aggregate import merge_rows
from neuron_lab.report.model import Compiles, GraphBreak, OpRow, Report, Site, SiteCount
from neuron_lab.units import ShownAsText


def test_the_kinds_table_orders_titles_and_groups_every_kind() -> None:
    assert list(kinds.KINDS) == ["fallback", "host", "possible", "unsupported", "downcast", "nki", "collective",
                                 "sync", "abort", "native"]
    names = ("fallback", "host", "possible", "unsupported", "downcast", "nki", "collective", "sync", "abort", "native",
             "nosuch")
    assert [kinds.order(k) for k in names] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert kinds.OFF_DEVICE == {"fallback", "host"} and kinds.NOTES == {"unsupported", "downcast", "sync", "abort"}
    assert kinds.REPORTED == {"fallback", "host", "possible", "unsupported", "downcast", "nki", "collective", "sync",
                              "abort"}
    assert [(k.name, members) for k, members in kinds.sections()] == [  # error-level kinds first
        ("abort", {"abort"}), ("fallback", {"fallback", "host"}), ("possible", {"possible"}),
        ("unsupported", {"unsupported"}),
        ("downcast", {"downcast"}), ("nki", {"nki"}), ("collective", {"collective"}), ("sync", {"sync"})]
    assert kinds.title("downcast") == "64-bit downcasts" and kinds.title("nosuch") == "nosuch"
    assert kinds.title("unsupported") == "not supported on TorchNeuron"
    assert kinds.as_json()[0] == {"name": "fallback", "title": "CPU fallbacks", "call": "CPU fallback call",
                                  "off_device": True, "reported": True, "one_line": False, "note": False,
                                  "timed_as": "on the host", "why": "", "error": False}
    assert kinds.KINDS["abort"].heading == "error: may abort the process on TorchNeuron"


def test_reports_and_merges_follow_the_kinds_table() -> None:
    r = Report("In[1]", 1, "neuron:0", "default", "emulator",
               ops_not_native=[OpRow("aten::a", "downcast", "", 5), OpRow("aten::b", "host", "", 1),
                               OpRow("aten::c", "fallback", "", 2)])
    assert [x.op for x in r.fallbacks] == ["aten::b", "aten::c"] and [x.op for x in r.downcasts] == ["aten::a"]
    assert r.fallback_calls == 3
    assert [x.kind for x in merge_rows([r])] == ["fallback", "host", "downcast"]


def test_the_version_is_the_package_metadata() -> None:
    assert neuron_lab.__version__ == version("neuron_lab")


def test_shown_as_text_beats_a_dataclass_repr_in_ipython() -> None:
    r = Report("In[2]", 2, "neuron:0", "default", "emulator")
    assert pretty(r) == str(r) and str(r).startswith("neuron_lab In[2] · neuron:0")
    assert repr(r).startswith("Report(title='In[2]'")  # repr() stays the dataclass's

    class Message(ShownAsText, str):
        def __repr__(self) -> str:
            return "quoted"

    assert pretty(Message("plain words")) == "plain words"


def test_map_sites_rewrites_every_user_line_once() -> None:
    here = Site("<ipython-input-3>", 2, "y = x.atan2(x)", 3)
    row = OpRow("aten::atan2", "fallback", "", 1, sites=[SiteCount(here, 1, [("In[3] line 2",)])])
    r = Report("In[3]", 3, "neuron:0", "default", "emulator", ops_not_native=[row],
               compiles=Compiles(breaks=[GraphBreak("why", here), GraphBreak("no line", None)]))
    r.map_sites(lambda s: Site("train.py", s.line + 10, s.source), lambda f: f.replace("In[3] line 2", "train.py:12"))
    sc = r.ops_not_native[0].sites[0]
    assert (sc.site.label, sc.stacks) == ("train.py:12", [("train.py:12",)])
    assert [b.site.label if b.site else None for b in r.compiles.breaks] == ["train.py:12", None]


def test_a_stopped_report_is_final_and_a_copy_is_its_own() -> None:
    """The tracker is the one writer of its report: once stop returns it, setting a field raises and says how."""
    with neuron_lab.track() as report:
        pass
    with pytest.raises(dataclasses.FrozenInstanceError, match="final once its tracker stopped"):
        report.detail = "full"
    shown = dataclasses.replace(report, detail="full")
    assert (shown.detail, report.detail) == ("full", "table")


def test_a_row_lists_its_first_four_tensors_shapes_and_full_lists_all() -> None:
    """An optimizer's ``_foreach`` call has three tensors a parameter: a row shows the first four and how many more, in
    text and HTML; ``--full`` and the JSON keep every one."""
    from neuron_lab.report.text import render_text

    shapes = tuple((n, 2) for n in range(1, 13))
    row = OpRow("aten::_foreach_lerp_.Scalar", kinds.POSSIBLE, "", 1, shapes=shapes, dtypes=("float32",) * 12)
    r = Report("In[1]", 1, "neuron:0", "default", "emulator", ops_not_native=[row])
    first = "[1, 2] float32, [2, 2] float32, [3, 2] float32, [4, 2] float32, … 8 more tensors"
    assert first in str(r) and first in r._repr_html_() and "[5, 2]" not in str(r) + r._repr_html_()
    assert "[12, 2] float32" in render_text(r, "full")
    assert len(r.as_dict()["ops_not_native"][0]["shapes"]) == 12


@pytest.mark.parametrize(("n", "more"), [(4, "… 1 more site"), (5, "… 2 more sites")])
def test_a_row_lists_its_first_three_sites_and_counts_the_rest_in_words(n: int, more: str) -> None:
    from neuron_lab.report.text import render_text

    sites = [SiteCount(Site("<ipython-input-1>", i, f"y{i} = x.atan2(x)", cell=1), 1, []) for i in range(1, n + 1)]
    row = OpRow("aten::atan2", kinds.FALLBACK, "", n, sites=sites)
    r = Report("In[1]", 1, "neuron:0", "default", "emulator", ops_not_native=[row])
    assert f"      {more}" in str(r).splitlines() and "line 4" not in str(r)
    assert "line 4" in render_text(r, "full") and "more site" not in render_text(r, "full")
