"""Fallback reporting: exact counts for a known program, TorchNeuron's name sets, events, profiles."""

from __future__ import annotations

import json
import re

import pytest
import torch

from neuron_lab import backend
from neuron_lab.backend import coverage
from neuron_lab.report.rows import INT64_NOTE


def _rows(nb, kind):
    return {(s.name, s.overload): s.count for s in nb.op_stats(kind)}


def test_known_program_exact_counts(b):
    x = torch.ones(8, 3, device="neuron")
    y = torch.full((8, 3), 2.0, device="neuron")
    b.clear_op_tracking()
    for _ in range(3):
        torch.atan2(x, y)
        torch.acos(x * 0.5)
    assert _rows(b, "fallback") == {("aten::atan2", "out"): 3, ("aten::acos", "out"): 3}
    assert b.get_fallback_ops() == {"aten::atan2", "aten::acos"}
    assert _rows(b, "native")[("aten::mul", "Tensor")] == 3
    b.clear_op_tracking()
    assert b.get_fallback_ops() == set() and b.op_stats() == []


def test_signatures_and_host_time(b):
    x = torch.ones(4, 5, device="neuron")
    torch.atan2(x, x)
    torch.atan2(x[:2], x[:2])
    (st,) = b.op_stats("fallback")
    assert st.count == 2 and st.host_ns > 0
    assert [sig[0][:2] for sig in st.signatures] == [((4, 5), (4, 5)), ((2, 5), (2, 5))]
    assert st.signatures[0][1][:2] == ("float32", "float32")
    assert "CPU_FALLBACK" in st.reason


def test_an_op_keeps_its_first_four_distinct_signatures_by_dtype_rank_and_sizes(b):
    """A signature is new by any dtype, rank or size: the same sizes in bfloat16, or as (20,) or (4, 5, 1), are
    others; a repeated one is kept once; past four, none is kept."""
    a = torch.ones(4, 5, device="neuron")
    calls = [a, a.bfloat16(), a, a.reshape(20), a.reshape(4, 5, 1), a[:2], a]
    b.clear_op_tracking()
    for x in calls:
        torch.atan2(x, x)
    (st,) = b.op_stats("fallback")
    assert st.count == len(calls)
    assert [(sig[0][0], sig[1][0]) for sig in st.signatures] == [
        ((4, 5), "float32"), ((4, 5), "bfloat16"), ((20,), "float32"), ((4, 5, 1), "float32")]


def test_views_and_copies_are_not_fallbacks(b):
    x = torch.arange(12.0).to("neuron")
    x.view(3, 4).t()[0].cpu()
    assert b.get_fallback_ops() == set()
    assert "aten::view" not in b.get_executed_ops()
    assert b.transfer_bytes() == (48, 12)  # 12 floats in; one 3-float row out


def test_subscriber_events_and_unsubscribe(b):
    events = []
    unsubscribe = b.subscribe(lambda ev, args, kwargs: events.append(ev))
    x = torch.ones(2, 2, device="neuron")
    torch.atan2(x, x)
    unsubscribe()
    torch.atan2(x, x)
    fb = [e for e in events if e.kind == "fallback"]
    assert [(e.qualified_name, e.shapes[:2]) for e in fb] == [("aten::atan2.out", ((2, 2), (2, 2)))]


def test_int64_inputs_are_reported_as_downcast(b):
    i = torch.arange(6, device="neuron")  # int64
    (i * 2).sum()
    down = {s.name for s in b.op_stats("downcast")}
    assert {"aten::mul", "aten::sum"} <= down
    assert "int64" in b.op_stats("downcast")[0].reason


def test_complex_dtype_rule_and_random_creation(b):
    torch.randn(3, device="neuron")
    z = torch.randn(3, dtype=torch.complex64).to("neuron")
    (z * z).abs()
    names = b.get_fallback_ops()
    assert "aten::normal_" in names and "aten::mul" in names
    (mul,) = [s for s in b.op_stats("fallback") if s.name == "aten::mul"]
    assert "complex" in mul.reason


def test_hot_ops_count_classify_deliver_and_hold_memory_as_every_op(b):
    """The compiled core's typed kernels (add, sub, mul, div, mm, bmm, addmm) report as the boxed fallback does."""
    x = torch.ones(4, 4, device="neuron")
    y = torch.full((4, 4), 2.0, device="neuron")
    z3 = torch.ones(2, 4, 4, device="neuron")
    events = []
    unsubscribe = b.subscribe(lambda ev, args, kwargs: events.append(ev), kinds={"native"})
    b.clear_op_tracking()
    before = torch.neuron.memory_allocated()
    out = [x + y, x - y, x * 3, x / y, x @ y, torch.addmm(x, x, y), torch.bmm(z3, z3)]
    unsubscribe()
    assert torch.neuron.memory_allocated() - before == 6 * 64 + 128  # each result's bytes, nothing else
    assert [float(t[0, 0].sum()) for t in out[:6]] == [3.0, -1.0, 3.0, 0.5, 8.0, 9.0]
    hot = {("aten::add", "Tensor"), ("aten::sub", "Tensor"), ("aten::mul", "Tensor"), ("aten::div", "Tensor"),
           ("aten::mm", ""), ("aten::addmm", ""), ("aten::bmm", "")}
    assert {k: n for k, n in _rows(b, "native").items() if k in hot} == dict.fromkeys(hot, 1)
    assert [(e.qualified_name, e.shapes[:2]) for e in events if e.qualified_name == "aten::add.Tensor"] == [
        ("aten::add.Tensor", ((4, 4), (4, 4)))]
    (add,) = [s for s in b.op_stats("native") if (s.name, s.overload) == ("aten::add", "Tensor")]
    assert add.signatures[0][0][:2] == ((4, 4), (4, 4)) and add.signatures[0][1][:2] == ("float32", "float32")
    torch.arange(3, device="neuron") + 1  # int64: the 64-bit rule still sees it
    assert ("aten::add", "Tensor") in _rows(b, "downcast")


def test_hot_ops_probe_signatures_without_a_subscriber(b):
    """With nobody subscribed, a typed kernel's signature comes from its tensors alone, as the fallback's from its
    arguments: the user's tensors' shapes and dtypes, a wrapped Python number left out."""
    x = torch.ones(4, 4, device="neuron")
    b.clear_op_tracking()
    x * 3
    x.add_(x)
    sigs = {(s.name, s.overload): s.signatures for s in b.op_stats("native")}
    assert sigs[("aten::mul", "Tensor")] == [(((4, 4),), ("float32",))]
    assert sigs[("aten::add_", "Tensor")] == [(((4, 4), (4, 4)), ("float32", "float32"))]


def test_a_typed_kernels_calls_at_one_line_reach_the_subscriber_once_and_keep_their_signatures(b):
    """A typed kernel's call handed to a subscriber carries its arguments (boxed only for that hand-over); a core that
    counts by line counts the line's later calls itself, and every call is still probed for a new signature."""
    from neuron_lab.backend.events import USER

    x, y = torch.ones(4, 4, device="neuron"), torch.ones(2, 4, device="neuron")
    handed, tallied = [], []

    def subscriber(ev, args, kwargs):
        handed.append((ev.qualified_name, ev.shapes[:2], [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]))
        return (lambda calls, host_ns: tallied.append(calls)), 0

    b.clear_op_tracking()
    unsubscribe = b.subscribe(subscriber, kinds={"native"}, roles=lambda code: USER)
    for t in (x, x, x, y):
        t.add_(t)
    b.flush_ops()
    unsubscribe()
    assert handed[0] == ("aten::add_.Tensor", ((4, 4), (4, 4)), [(4, 4), (4, 4)])
    assert len(handed) + sum(tallied) == 4, (handed, tallied)
    (add_,) = [s for s in b.op_stats("native") if (s.name, s.overload) == ("aten::add_", "Tensor")]
    assert add_.count == 4
    assert add_.signatures == [(((4, 4), (4, 4)), ("float32", "float32")), (((2, 4), (2, 4)), ("float32", "float32"))]


_SEVERAL = {  # the typed kernels of several results, of tensor lists and of the ops a model step calls most
    "cat": lambda x, w, g: torch.cat([x, g, x], 1),
    "tril": lambda x, w, g: torch.tril(x, -1),
    "native_layer_norm": lambda x, w, g: torch.ops.aten.native_layer_norm(x, [6], w, w, 1e-5),
    "native_layer_norm_backward": lambda x, w, g: torch.ops.aten.native_layer_norm_backward(
        g, x, [6], x[:, :1].contiguous(), x[:, 1:2].contiguous(), w, w, [True, True, True]),
    "native_dropout_backward": lambda x, w, g: torch.ops.aten.native_dropout_backward(g, x > 0, 2.0),
    "native_dropout": lambda x, w, g: torch.ops.aten.native_dropout(x, 0.5, False),
    # the kernels whose results are written into pooled device memory by their `.out` kernel
    "mm": lambda x, w, g: torch.mm(x, g.t()),
    "addmm": lambda x, w, g: torch.addmm(w, g.t(), x, beta=0.5),
    "bmm": lambda x, w, g: torch.bmm(x[None], g.t()[None]),
    "sum": lambda x, w, g: x.sum(0),
    "mean": lambda x, w, g: x.t().mean(-1, keepdim=True),
    "_softmax": lambda x, w, g: torch.ops.aten._softmax(x.t(), -1, False),
    "_log_softmax": lambda x, w, g: torch.ops.aten._log_softmax(x, 0, False),
    "_softmax_backward_data": lambda x, w, g: torch.ops.aten._softmax_backward_data(g, x, -1, torch.float32),
    "_log_softmax_backward_data": lambda x, w, g: torch.ops.aten._log_softmax_backward_data(g, x, 1, torch.float32),
    "pow": lambda x, w, g: x ** 2,
    "mul": lambda x, w, g: torch.ops.aten.mul.Scalar(x, 0.5),
    "div": lambda x, w, g: torch.ops.aten.div.Scalar(x, 3),
    "clone": lambda x, w, g: x.t().clone(),
}


def _several_calls(op: str) -> tuple[list, dict, int]:
    torch.manual_seed(0)
    x, w, g = torch.randn(4, 6), torch.rand(6) + 0.5, torch.randn(4, 6)
    want = _SEVERAL[op](x, w, g)
    dev = [t.to("neuron") for t in (x, w, g)]
    nb = backend.active()
    nb.clear_op_tracking()
    before = torch.neuron.memory_allocated()
    got = _SEVERAL[op](*dev)
    held = torch.neuron.memory_allocated() - before
    rows = {(s.name, s.overload, s.kind): (s.count, s.signatures) for s in nb.op_stats()
            if s.name == f"aten::{op}"}
    for a, d in zip(want if isinstance(want, (tuple, list)) else [want], got if isinstance(got, (tuple, list))
                    else [got]):
        assert (a is None) == (d is None) and (a is None or (torch.equal(d.cpu(), a) and d.stride() == a.stride())), op
    results = [t for t in (got if isinstance(got, (tuple, list)) else [got]) if t is not None]
    return rows, results, held


@pytest.mark.parametrize("op", list(_SEVERAL))
def test_typed_kernels_of_several_results_report_as_the_fallback(b, op):
    """A typed kernel of several results computes what the CPU does, holds its results' bytes
    and reports the call exactly as the boxed fallback does (run under the profiler, which takes the fallback)."""
    rows, results, held = _several_calls(op)
    assert sum(n for n, _ in rows.values()) == 1
    assert held == sum(t.untyped_storage().nbytes() for t in results if t.device.type == "neuron")
    with torch.profiler.profile():
        boxed, _, _ = _several_calls(op)
    assert rows == boxed


def test_a_pooled_result_starts_at_its_blocks_first_byte(b):
    """A freed block keeps its cached host alias for the next result of its size class. When that alias last took
    a view's layout (an offset into the block), a result written into it still starts at the block's first byte."""
    torch.manual_seed(0)
    xs = [torch.randn(8, 8, device="neuron") for _ in range(4)]
    for x in xs:
        x[:, 4:].mul(2)  # the block's cached alias takes the view's layout, 4 elements in
    del x, xs
    a = torch.randn(8, 8)
    d = a.to("neuron")
    for got, want in zip([d + d, d * d, d.exp(), d @ d], [a + a, a * a, a.exp(), a @ a]):
        assert got.storage_offset() == 0 and got.stride() == want.stride() and torch.allclose(got.cpu(), want)


def test_results_and_restrided_aliases_keep_the_cpus_layout_and_flags(b):
    """A device result, and a block's host alias that takes a view's layout, copy their contiguity flags from the
    tensor of that layout instead of deriving them again: strides, offset, contiguity in each memory format, the
    dispatch keys of a fresh device tensor and the values are the CPU's, also for a block's alias after a view's."""
    torch.manual_seed(0)
    a, w = torch.randn(2, 3, 1, 5), torch.randn(6, 10)
    d, dw = a.to("neuron"), w.to("neuron")
    cases = [lambda x, y: x + 1, lambda x, y: x.permute(0, 2, 3, 1) * 2, lambda x, y: x.sum(1),
             lambda x, y: x.to(memory_format=torch.channels_last) - x, lambda x, y: x[:, 1:].exp(),
             lambda x, y: y @ y.t(), lambda x, y: y.t() @ y, lambda x, y: y[:, 2:] * y[:, :8], lambda x, y: y + y]
    for f in cases:
        want, got = f(a, w), f(d, dw)
        assert (got.stride(), got.storage_offset()) == (want.stride(), want.storage_offset())
        for fmt in [torch.contiguous_format] + [torch.channels_last] * (want.dim() == 4):
            assert got.is_contiguous(memory_format=fmt) == want.is_contiguous(memory_format=fmt)
        fresh = torch.empty(0, device="neuron", dtype=want.dtype)
        assert got.device == d.device and torch._C._dispatch_keys(got) == torch._C._dispatch_keys(fresh)
        assert torch.equal(got.cpu(), want)


def test_typed_dropout_draws_what_the_fallback_draws(b):
    x = torch.randn(256, device="neuron")
    torch.neuron.manual_seed(5)
    typed = torch.ops.aten.native_dropout(x, 0.3, True)
    torch.neuron.manual_seed(5)
    with torch.profiler.profile():
        boxed = torch.ops.aten.native_dropout(x, 0.3, True)
    assert all(torch.equal(t.cpu(), u.cpu()) for t, u in zip(typed, boxed))
    assert 0 < int((~typed[1]).sum()) < 256


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_typed_dropout_gives_what_the_cpu_gives(b, layout):
    """In training, native_dropout gives the CPU kernel's output and mask, bit for bit (NaN, inf and -0 included),
    for a generator seeded alike. (float64 on the device is computed in float32: the 64-bit rule.)"""
    x = torch.randn(20, 15)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    if layout == "transposed":
        x = x.t()
    torch.manual_seed(7)
    want = torch.ops.aten.native_dropout(x, 0.3, True)
    torch.neuron.manual_seed(7)
    got = [t.cpu() for t in torch.ops.aten.native_dropout(x.to("neuron"), 0.3, True)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.stride() == w.stride() and torch.equal(g.isnan(), w.isnan())
        assert torch.equal(g.nan_to_num(), w.nan_to_num()) and torch.equal(g.signbit(), w.signbit())
    assert 0 < int(got[1].sum()) < x.numel()


def test_linalg_host_kernels_are_reported_but_not_in_fallback_set(b):
    a = torch.eye(3, device="neuron") * 2
    torch.linalg.inv(a)
    assert "aten::linalg_inv_ex" in {s.name for s in b.op_stats("host")}
    assert "aten::linalg_inv_ex" not in b.get_fallback_ops()


def test_switch_profile_by_path(b, tmp_path):
    p = tmp_path / "strict.json"
    p.write_text(json.dumps({"schema_version": 1, "name": "strict", "source": "test", "date": "2026-12-02",
                             "default": {"kind": "fallback", "reason": "not in strict"},
                             "ops": {"aten::add": {"kind": "native", "reason": "kernel"}}}))
    assert b.set_coverage(str(p)).name == "strict"
    x = torch.ones(2, device="neuron")  # fill_ is not in the strict profile either
    b.clear_op_tracking()
    x + x
    torch.sin(x)
    assert b.get_fallback_ops() == {"aten::sin"}
    assert b.coverage.name == "strict"


def test_profile_errors_are_clear(tmp_path):
    with pytest.raises(coverage.CoverageError, match="no coverage 'nope'"):
        coverage.load("nope")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(coverage.CoverageError, match="invalid JSON"):
        coverage.load(str(bad))
    bad.write_text(json.dumps({"schema_version": 9, "name": "x", "source": "s", "date": "d"}))
    with pytest.raises(coverage.CoverageError, match="schema_version 9"):
        coverage.load(str(bad))
    bad.write_text(json.dumps({"schema_version": 1, "name": "x", "source": "s", "date": "d",
                               "ops": {"aten::a": {"kind": "sometimes"}}}))
    with pytest.raises(coverage.CoverageError, match=r"ops\['aten::a'\]"):
        coverage.load(str(bad))


def test_default_profile_encodes_public_facts():
    p = coverage.load()
    assert p.name == "torchneuron-combined" and p.date and p.source  # 2.33's documented facts stay certain in it
    for op in ("aten::atan2", "aten::linalg_cross", "aten::acos", "aten::scatter_reduce", "aten::uniform_"):
        kind, reason = p.classify(op)
        assert kind == "fallback" and " Confidence: certain (" in reason, (op, reason)
    assert p.classify("aten::_linalg_svd")[0] == "host"
    assert p.classify("aten::add", frozenset({"complex64"}))[0] == "fallback"  # over the April source's add kernel
    assert p.classify("aten::add", frozenset({"float32"}))[0] == "native"
    # an op the April source registers no kernel for may fall back: likely, not certain
    kind, reason = p.classify("aten::some_unknown_op")
    assert kind == "possible" and reason == f"{p.default_reason}. Confidence: likely (not registered: no kernel for " \
        "it is registered in TorchNeuron's source).", reason


def test_a_site_lookup_from_autograds_thread_ends_when_no_frame_is_the_users() -> None:
    """Backward ops are reported from autograd's device thread; with no user frame anywhere the lookup ends."""
    import sys
    import threading

    from neuron_lab.trace.sites import FileLocator

    loc = FileLocator()
    loc.is_user_code = lambda code: False
    out: list = []
    t = threading.Thread(target=lambda: out.append(loc.user_frame(sys._getframe())))
    t.start()
    t.join()
    assert out == [None]


# -- what a cell's report shows (issue 17, point 6: no clutter) ----------------------------------------------
def _report(shell, code: str):
    from shells import run

    from neuron_lab.extension import session_of

    res, _ = run(shell, code)
    return session_of(shell).history[res.execution_count]


def _report_and_output(shell, code: str):
    from shells import run

    from neuron_lab.extension import session_of

    res, cap = run(shell, code)
    return session_of(shell).history[res.execution_count], cap.stdout


def test_a_training_cell_with_int64_indices_reports_in_two_lines_and_says_int64_once(shell) -> None:
    """int64 indices compute as int32 on TorchNeuron, expected: no line on every cell with indices, one note a
    session under the first cell that has them; the downcasts' table, with no "0 µs" column, is in --full."""
    _report(shell, "import torch\nemb = torch.nn.Embedding(100, 16).to('neuron')\n"
                   "ids = torch.arange(32).view(4, 8).to('neuron')")
    r, out = _report_and_output(shell, "for _ in range(3):\n    emb(ids).sum().backward()")
    text = str(r).splitlines()
    assert len(text) == 2 and "· no CPU fallbacks · mem " in text[0] and "downcast" not in text[0], text
    assert text[1].startswith("memory: ") and "RSS" not in text[1], text
    assert "downcast" not in r._repr_html_()
    assert {x.op: x.count for x in r.downcasts} == {"aten::embedding_dense_backward": 3, "aten::index_select": 3}
    assert out.count(INT64_NOTE) == 1 and out.rstrip().endswith(INT64_NOTE)
    _, again = _report_and_output(shell, "emb(ids).sum().backward()")
    assert INT64_NOTE not in again  # said once a session
    from neuron_lab.report.text import render_text

    full = render_text(r, "full").splitlines()
    rows = [x for x in full if x.startswith("  aten::")]
    at = full.index("64-bit downcasts (2 ops, 6 calls):")  # no host time: a downcast is a note on a device call
    assert full[2].startswith("host process memory (RSS) ")  # --full names the host's change too
    assert [x.split()[:2] + x.split()[-2:] for x in rows] == [
        ["aten::embedding_dense_backward", "3×", "why", "[1]"], ["aten::index_select", "3×", "why", "[1]"]]
    assert at > 2 and not [x for x in full if "µs" in x]
    assert full[full.index("why:") + 1].startswith("  [1] int64 on TorchNeuron computes in 32-bit")


def test_a_float64_downcast_is_one_line_on_its_cell_with_code_in_html(shell) -> None:
    """float64 computed in float32 can lose precision: its cell says so in one line (HTML: `code` as <code>)."""
    r = _report(shell, "import torch\nw = torch.ones(4, dtype=torch.float64, device='neuron') * 3")
    text = str(r).splitlines()
    assert "· 2 64-bit downcasts ·" in text[0], text
    # the wrapped Python scalar of `* 3` is no int64 tensor: neither core counts it
    assert re.fullmatch(r"64-bit downcasts: 2 float64→float32 \(aten::fill_\.Scalar ×1, "
                        r"aten::mul\.Tensor ×1\) — `%neuron report --full` lists them", text[-1]), text[-1]
    html = r._repr_html_()
    assert "<code>%neuron report --full</code> lists them" in html and "`" not in html


def _return_free_heap_pages(shell) -> None:
    """Collect, then have glibc give the heap's free pages back to the system (a cell of its own, before the one
    measured)."""
    shell.run_cell("import ctypes, gc\ngc.collect()\nctypes.CDLL('libc.so.6').malloc_trim(0)")


def test_a_big_host_growth_is_named_as_the_host_process_not_as_the_device(shell) -> None:
    """RSS is the process's: in a worker that has run other tests, glibc's heap can hold a free chunk of 96 MiB or
    more whose pages are still resident (freed below a live block, never trimmed), and the tensor then takes them
    without growing RSS at all (CI read +8 KiB twice). ``malloc_trim(0)`` hands such pages back first."""
    _return_free_heap_pages(shell)
    r = _report(shell, "import torch\nkeep = torch.ones(96 * 2**20, dtype=torch.uint8).fill_(1)\n"
                       "x = torch.ones(2, device='neuron')")
    assert r.memory.host_rss_delta >= 96 * 2**20
    small = "host process memory (RSS)" in str(r)
    assert small == (r.memory.host_rss_delta >= 256 * 2**20)  # named only when material
    _return_free_heap_pages(shell)
    big = _report(shell, "big = torch.ones(300 * 2**20, dtype=torch.uint8).fill_(1)\n"
                         "y = torch.ones(2, device='neuron')")
    lines = str(big).splitlines()
    assert lines[2].startswith("host process memory (RSS) +") and lines[2].endswith(
        ": CPU tensors, caches, imports (device memory is above)"), lines
    shell.run_cell("del keep, big")


def test_fallback_rows_sort_by_host_time_and_each_reason_shows_once_with_its_source(shell, b) -> None:
    """Under 2.33's table, where the ops the rewrites use (atan, asin) count as native: the April source registers
    neither, so the combined default offers no rewrite for these rows (``b`` sets the default back)."""
    b.set_coverage("torchneuron-2.33")
    r = _report(shell, "import torch\nx = torch.ones(8, device='neuron')\nfor _ in range(3):\n"
                       "    a = torch.atan2(x, x)\nc = torch.acos(x)\n"
                       "q = torch.linalg.inv(torch.eye(3, device='neuron'))")
    rows = r.fallbacks
    assert [x.host_ns for x in rows] == sorted((x.host_ns for x in rows), reverse=True)
    assert {x.op: x.count for x in rows} == {"aten::atan2.out": 3, "aten::acos.out": 1,
                                             "aten::linalg_inv_ex.inverse": 1}
    text = str(r).splitlines()
    shown = [x.split()[0] for x in text if x.startswith("  aten::")]
    assert shown == [x.op for x in rows]  # the text shows the model's order
    refs = {x.split()[0]: x.rsplit(" ", 1)[1] for x in text if x.startswith("  aten::")}
    assert refs["aten::atan2.out"] == refs["aten::acos.out"] != refs["aten::linalg_inv_ex.inverse"]
    why = text[text.index("why:") + 1:]
    fallback = next(i for i, x in enumerate(why) if x.startswith(f"  {refs['aten::atan2.out']} "))
    assert why[fallback] == (f"  {refs['aten::atan2.out']} TorchNeuron has no device kernel for this op: it copies the "
                             "inputs to the CPU, runs the op there and copies the result back. Once is cheap; inside a "
                             "training loop it can dominate the step. Confidence: certain (documented: TorchNeuron's "
                             "documentation for 2.33 says so).")
    assert why[fallback + 1] == ("      source: CPU_FALLBACK in the torch-neuronx operator compatibility table; one of "
                                 "the five fallbacks behind a reported 87x EquiformerV3 slowdown")
    assert sum("87x" in x for x in text) == 1 and sum("TorchNeuron has no device kernel" in x for x in text) == 1
    html = r._repr_html_()
    assert html.count("TorchNeuron has no device kernel") == 1 and html.count("87x EquiformerV3") == 1
    # both rows refer to the one reason, each followed by its own rewrite in native ops, folded
    assert html.count(f"<td style=\"padding:1px 8px;text-align:left;vertical-align:top\">{refs['aten::atan2.out']}"
                      "<details><summary>rewrite: ") == 2
    assert "<summary>rewrite: math.pi / 2 - torch.asin(x)</summary>" in html


def test_a_report_with_an_oom_reads_back_from_json() -> None:
    from neuron_lab.report.model import HeldTensor, OutOfMemory, Report

    r = Report("In[3]", 3, "neuron:0", "default", "emulator", error="OutOfMemoryError: neuron:0 out of memory",
               oom=OutOfMemory(824_000, [HeldTensor(("parts[…]",), (87_500,), "float32", 700_000, 2,
                                                    "IPython traceback")], more=4000, freed=700_000))
    back = Report.from_dict(json.loads(json.dumps(r.as_dict())))
    assert back.oom == r.oom and str(back) == str(r)
    assert str(r).splitlines()[-4:] == [
        "out of memory: 804.69 KiB held when the error unwound, by:",
        "    683.59 KiB  parts[…]  (2 × [87500] float32; IPython traceback)",
        "      3.91 KiB  in smaller storages (`%neuron tensors` lists them all)",
        "freed after the error: 683.59 KiB the failing frames held (`%config NeuronLab.oom_traceback = 'full'` keeps "
        "them for %debug)"]
    html = r._repr_html_()  # the same facts
    assert "<b>out of memory: 804.69 KiB held when the error unwound, by:</b>" in html
    assert ">parts[…]</td>" in html and ">in smaller storages</td>" in html
    assert "freed after the error: 683.59 KiB" in html


def test_one_of_anything_is_singular_in_text_and_html() -> None:
    """Counts go through ``units.count``: "1 call", never "1 calls" (a row's calls without a user line, a section's
    calls in HTML)."""
    from neuron_lab.kinds import FALLBACK
    from neuron_lab.report.html import render_html
    from neuron_lab.report.model import OpRow, Report
    from neuron_lab.report.text import render_text

    row = OpRow("aten::atan2.out", FALLBACK, "why", count=1, host_ns=1000, unattributed=1)
    r = Report("In[1]", 1, "neuron:0", "default", "emulator", ops=1, ops_not_native=[row])
    text, html = render_text(r), render_html(r)
    assert "      1 call without a user line" in text.splitlines() and "CPU fallbacks (1 op, 1 call, " in text
    assert "1 call without a user line" in html and "<b>CPU fallbacks: 1 call</b>" in html
    assert "1 calls" not in text + html and "1 ops" not in text + html
