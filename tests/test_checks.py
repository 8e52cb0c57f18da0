"""The trust checks in a real in-process InteractiveShell: `%%neuron parity` (device against CPU) and `%%neuron compare`
(eager against compiled), and `neuron_lab.parity` / `neuron_lab.compare` from plain Python.

Known-divergent cases use the emulator's 64-bit downcast (TorchNeuron's 64-bit rule, on by default) and a
kernel registered at PrivateUse1 for the test only, whose device path differs on purpose."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch
from IPython.core.error import UsageError
from shells import in_child_shell, loaded_shell, run

from neuron_lab import modes
from neuron_lab.extension import session_of
from neuron_lab.report.checks import Agreement, CompareResult, ParityResult, Timing, overlap
from neuron_lab.report.checks_rows import check_summary_line
from neuron_lab.units import count, format_seconds


def last_report(sh):
    return next(reversed(session_of(sh).history.values()))


@contextmanager
def skewed_atan2(offset: float = 0.5, index: int = 1, from_call: int = 1, fail: bool = False):
    """A PrivateUse1 kernel for aten::atan2 that differs from the CPU on purpose (element ``index`` + ``offset``,
    from the ``from_call``-th call on), or raises; the emulator's own path comes back afterwards."""
    calls = []

    def atan2(a, b):
        calls.append(1)
        if fail:
            raise RuntimeError("atan2: no kernel for this shape on the device")
        out = torch.atan2(a.cpu(), b.cpu())
        if len(calls) >= from_call:
            out.view(-1)[index] += offset
        return out.to(a.device)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("atan2", atan2, "PrivateUse1")
    try:
        yield calls
    finally:
        lib._destroy()


SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
x = torch.randn(16, 4).to(device)
y = torch.randn(16, 1).to(device)
losses = []
"""

TRAIN = """
for step in range(3):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
"""


def describe(v, ns):
    """What a plain run must leave, exactly: values, devices, dtypes, grads, optimizer state, and which objects
    are the same object (an optimizer's parameters are its model's)."""
    if isinstance(v, torch.Tensor):
        g = v.grad if v.is_leaf else None
        return ("tensor", str(v.device), str(v.dtype), tuple(v.shape), v.requires_grad,
                v.detach().cpu().tolist(), None if g is None else g.cpu().tolist())
    if isinstance(v, torch.nn.Module):
        return ("module", type(v).__name__, v.training,
                [(k, describe(p, ns)) for k, p in v.named_parameters()],
                [(k, describe(b, ns)) for k, b in v.named_buffers()])
    if isinstance(v, torch.optim.Optimizer):
        owners = {id(p): f"{n}.{k}" for n, m in ns.items() if isinstance(m, torch.nn.Module)
                  for k, p in m.named_parameters()}
        params = [p for g in v.param_groups for p in g["params"]]
        state = [(owners.get(id(p), "?"), sorted((k, describe(s, ns)) for k, s in v.state[p].items()))
                 for p in params if p in v.state]
        return ("optimizer", type(v).__name__, [owners.get(id(p), "?") for p in params], state)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [describe(x, ns) for x in v])
    if isinstance(v, (int, float, str, bool, type(None), torch.device)):
        return v
    return type(v).__name__


def fingerprint(sh) -> dict:
    ns = sh.user_ns
    hidden = {*sh.user_ns_hidden, "In", "Out", "exit", "quit", "get_ipython"}
    out = {n: describe(v, ns) for n, v in sorted(ns.items()) if n not in hidden and not n.startswith("_")}
    out["<rng>"] = (torch.get_rng_state().tolist(), torch.neuron.get_rng_state().tolist())
    return out


# -- parity: known-equal cases -----------------------------------------------------------------
def test_parity_of_a_training_cell_agrees_and_steps_the_parameters_once(shell):
    run(shell, SETUP)
    w0 = shell.user_ns["model"][0].weight.detach().cpu().clone()
    res, cap = run(shell, "%%neuron parity\n" + TRAIN.lstrip())
    result = res.result
    assert isinstance(result, ParityResult) and result.passed, str(result)
    assert (result.device, result.reference, result.seed) == ("neuron:0", "cpu", None)
    names = [i.name for i in result.agreement.items]
    for name in ("model.0.weight", "model.2.bias", "opt.state[0].exp_avg", "opt.state[3].exp_avg_sq", "loss",
                 "losses[2]", "x", "y"):
        assert name in names
    assert names.index("opt.state[0].exp_avg") < names.index("loss") < names.index("model.0.weight")  # cell order
    assert result.agreement.steps == 3 and result.agreement.step_counts == (3, 3)
    ns = shell.user_ns
    assert len(ns["losses"]) == 3  # appended once per step, by the device run only
    assert float(ns["opt"].state[ns["model"][0].weight]["step"]) == 3.0  # stepped once per step, not twice
    assert all(p.device.type == "neuron" for p in ns["model"].parameters())
    assert ns["opt"].param_groups[0]["params"][0] is ns["model"][0].weight
    assert not torch.equal(ns["model"][0].weight.detach().cpu(), w0)
    text = str(result)
    assert text.startswith("neuron_lab parity neuron:0 vs cpu: agree (")
    assert "coverage torchneuron-combined" in text and "NEURON_LAB_EMULATE_DOWNCAST" in text
    assert "training steps compared: 3" in text
    r = last_report(shell)
    assert r.checks == [result]  # kept with the cell's report, in the history
    assert "check: parity neuron:0 vs cpu: agree" in str(r)
    # the result shows once, as the cell's Out; the automatic report under it does not repeat it
    assert cap.stdout.count("parity neuron:0 vs cpu: agree (") == 1 and "check: " not in cap.stdout


def test_namespace_after_parity_is_exactly_a_plain_device_runs(shell):
    cell = TRAIN + "w = model[0].weight.detach() * 2\nsmall = [torch.tanh(x[:2]), 3]\nloss.item()\n"
    run(shell, SETUP)
    res, _ = run(shell, "%%neuron parity\n" + cell.lstrip())
    assert res.result.passed
    assert [i.name for i in res.result.agreement.items][-1] == "last value"
    with_parity = fingerprint(shell)
    with loaded_shell() as plain:
        run(plain, SETUP)
        run(plain, cell)
        assert fingerprint(plain) == with_parity


def test_random_cell_with_a_seed_matches_a_plain_run_seeded_alike(shell):
    cell = ("noise = torch.randn(3, 5, device=device)\n"
            "mask = torch.nn.functional.dropout(torch.ones(4, 4, device=device))")
    run(shell, "import torch")
    res, _ = run(shell, "%%neuron parity --seed 7\n" + cell)
    assert res.result.passed and res.result.seed == 7  # the CPU generator and the device's drew the same numbers
    with_parity = fingerprint(shell)
    with loaded_shell() as plain:
        run(plain, "import torch")
        run(plain, "torch.manual_seed(7)\n" + cell)
        assert fingerprint(plain) == with_parity


def test_parity_leaves_no_copies_behind_and_restores_the_device_variable(shell):
    run(shell, SETUP)
    before = set(shell.user_ns)
    run(shell, "%%neuron parity\nz = model(x)\nhelper = 1")
    assert {n for n in set(shell.user_ns) - before if not n.startswith("_")} == {"z", "helper"}
    assert shell.user_ns["device"] == torch.device("neuron", 0) and session_of(shell).device.type == "neuron"
    assert shell.user_ns["z"].device.type == "neuron"
    assert torch.get_default_device() == torch.device("cpu") and not modes.patched()


# -- parity: random ops ----------------------------------------------------------------------------
DROPOUT_SETUP = """
import torch
torch.manual_seed(0)
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                      torch.nn.Linear(16, 8), torch.nn.Dropout(0.1))
        self.norm = torch.nn.LayerNorm(8)
    def forward(self, x):
        return self.norm(x + self.ff(x))
model = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(8, 1)).to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(32, 8).to(device)
y = torch.randn(32, 1).to(device)
"""

DROPOUT_STEP = """
idx = torch.randint(0, 32, (16,))
opt.zero_grad()
loss = torch.nn.functional.mse_loss(model(x[idx.to(device)]), y[idx.to(device)])
loss.backward()
opt.step()
"""


def test_a_training_step_with_dropout_passes_with_the_device_runs_draws_replayed(shell):
    run(shell, DROPOUT_SETUP)
    res, cap = run(shell, "%%neuron parity\n" + DROPOUT_STEP.lstrip())
    r = res.result
    assert r.passed, str(r)  # batch indices from the CPU's generator, dropout masks from the device's: both replayed
    rnd = r.randomness
    assert (rnd.drawn, rnd.replayed, rnd.own, rnd.ops) == (5, 5, 0, [("aten::native_dropout", 4), ("aten::randint", 1)])
    lines = str(r).splitlines()
    assert lines[0] == "neuron_lab parity neuron:0 vs cpu: agree (60 items, 1 step)"  # the verdict first
    assert lines[1] == "randomness: 5 random ops (native_dropout ×4, randint ×1) replayed from the neuron:0 run"
    assert "  60 items agree: idx, opt (42), loss, model (14), x, y" in lines  # folded: no item rows
    assert not any(x.startswith("  item ") for x in lines)
    html = r._repr_html_()
    assert "<details><summary>60 items agree: idx, opt (42), loss, model (14), x, y</summary><table" in html
    assert html.index("randomness: 5 random ops") < html.index("<details>")
    assert cap.stdout.count("parity neuron:0 vs cpu: agree (60 items, 1 step)") == 1  # Out only, not the report
    assert float(shell.user_ns["opt"].state[shell.user_ns["model"][2].weight]["step"]) == 1.0  # one real step
    res, _ = run(shell, "%%neuron parity --seed 3\n" + DROPOUT_STEP.lstrip())  # seeded too
    assert res.result.passed and res.result.randomness.complete, str(res.result)


def test_a_random_op_sequence_that_differs_is_said_where_and_the_replay_picks_up_after_it(shell):
    run(shell, "import torch\nx = torch.ones(4, 4, device=device)")
    res, _ = run(shell, "%%neuron parity\na = torch.nn.functional.dropout(x, 0.5)\n"
                        "noise = torch.randn(3, device=device) if x.device.type != 'cpu' else torch.rand(3)\n"
                        "b = torch.nn.functional.dropout(x, 0.5)")
    r = res.result
    assert not r.passed and (r.randomness.drawn, r.randomness.replayed, r.randomness.own) == (3, 2, 1)
    lines = str(r).splitlines()
    assert lines[0] == ("neuron_lab parity neuron:0 vs cpu: FAIL (1 of 4 items over tolerance) · first: variable "
                        "noise, line 3 · the runs drew differently")
    assert lines[1] == "first divergence: variable noise, line 3"
    assert lines[2] == ("randomness: 2 of 3 random ops replayed from the neuron:0 run; the runs drew differently "
                        "(random op 2: aten::randn [3] in the device run, aten::rand [3] in the reference run): "
                        "1 device draw not matched in the reference, 1 reference draw from its own generator, so "
                        "what depends on those can differ")
    rows = [x.split()[:2] for x in lines if x.startswith("  ") and not x.startswith("  item ")]
    assert rows == [["noise", "FAIL"], ["a", "ok"], ["x", "ok"], ["b", "ok"]]  # b's mask is the device's again
    assert not any(x.startswith("over tolerance") for x in lines)  # no tolerance offered for a draw that differed


# nanoGPT's block: SDPA with is_causal and its own dropout, residual and embedding dropout, AdamW
LM_SETUP = """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
class Attn(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.qkv, self.proj, self.drop = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16), torch.nn.Dropout(P)
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 2, 8).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2, self.attn = torch.nn.LayerNorm(16), torch.nn.LayerNorm(16), Attn(ATTN_P)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16),
                                       torch.nn.Dropout(P))
    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos, self.drop = torch.nn.Embedding(32, 16), torch.nn.Embedding(8, 16), torch.nn.Dropout(P)
        self.blocks, self.head = torch.nn.Sequential(Block(), Block()), torch.nn.Linear(16, 32)
    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        return self.head(self.blocks(x))
model = LM().to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
idx = torch.randint(0, 32, (4, 8)).to(device)
"""

LM_STEP = """
opt.zero_grad()
loss = F.cross_entropy(model(idx).view(-1, 32), idx.view(-1))
loss.backward()
opt.step()
"""


FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"


@pytest.mark.parametrize("p, attn_p, flags, ops", [
    # dropout everywhere: on `neuron` SDPA's mask is drawn inside the fused op, which the reference's math kernel takes
    (0.1, 0.1, "", [("aten::native_dropout", 5), (FUSED, 2)]),
    (0.1, 0.0, "", [("aten::native_dropout", 5)]),  # flash on either side: tagged random, it draws nothing
    (0.1, 0.0, " --seed 0", [("aten::native_dropout", 5)]),
    (0.0, 0.0, "", []),  # the emulator's fused op runs the CPU's flash kernel: no rounding gap after AdamW
])
def test_a_transformer_lm_with_sdpa_and_dropout_agrees_with_every_draw_replayed(shell, p, attn_p, flags, ops):
    run(shell, LM_SETUP.replace("ATTN_P", str(attn_p)).replace("P", str(p)))
    res, _ = run(shell, "%%neuron parity" + flags + "\n" + LM_STEP.lstrip())
    r = res.result
    assert r.passed, str(r)
    draws = sum(n for _, n in ops)
    assert r.randomness.complete and (r.randomness.drawn, r.randomness.own) == (draws, 0), str(r)
    assert r.randomness.ops == ops
    assert "drew differently" not in str(r) and f"computed attention with {FUSED}" in str(r)
    assert ("was given the dropout masks the fused kernel drew" in str(r)) == (attn_p > 0)


MHA_SETUP = """
import torch
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 2, dropout=0.1, batch_first=True)
        self.out = torch.nn.Linear(16, 1)
    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.out(self.attn(x, x, x, attn_mask=mask, need_weights=False)[0])
model = Net().to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(4, 8, 16).to(device), torch.randn(4, 8, 1).to(device)
"""

CNN_SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.Dropout2d(0.1), torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(8, 10)).to(device).train()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(8, 3, 16, 16).to(device), torch.randint(0, 10, (8,)).to(device)
"""


@pytest.mark.parametrize("setup, loss, ops", [
    (MHA_SETUP, "torch.nn.functional.mse_loss(model(x), y)", [(FUSED, 1)]),  # need_weights=False: SDPA
    (CNN_SETUP, "torch.nn.functional.cross_entropy(model(x), y)",
     [("aten::bernoulli_", 1), ("aten::native_dropout", 1)]),  # Dropout2d draws a channel mask with bernoulli_
], ids=["multihead-attention", "batchnorm-cnn"])
def test_attention_and_batchnorm_training_steps_agree_with_their_draws_replayed(shell, setup, loss, ops):
    run(shell, setup)
    res, _ = run(shell, "%%neuron parity\nopt.zero_grad()\nloss = " + loss + "\nloss.backward()\nopt.step()")
    r = res.result
    assert r.passed and r.randomness.complete and r.randomness.ops == ops, str(r)
    if setup is CNN_SETUP:  # BatchNorm's running statistics are compared too
        names = {i.name for i in r.agreement.items}
        assert {"model.1.running_mean", "model.1.running_var", "model.5.num_batches_tracked"} <= names, names


def test_a_fail_says_how_far_over_tolerance_and_suggests_tolerances_when_the_gap_is_rounding(shell):
    run(shell, "import torch\nx = torch.linspace(0.1, 1, 6, device=device)")
    with skewed_atan2(3e-5, index=2):
        res, _ = run(shell, "%%neuron parity\nz = torch.atan2(x, x + 1)")
    r = res.result
    (z,) = r.agreement.failed
    assert z.over == pytest.approx(3e-5 / (1e-5 + 1.3e-6 * abs(z.expected_value)), rel=1e-2)
    lines = str(r).splitlines()
    hint = next(x for x in lines if x.startswith("over tolerance"))
    assert hint.startswith(f"over tolerance by up to {z.over:.3g}× (z): --rtol 1.3e-06 --atol 3")
    assert "would pass every item" in hint
    row = next(x for x in lines if x.split()[:2] == ["z", "FAIL"])
    assert row.split()[2] == f"{z.over:.3g}×"  # the "over" column
    flags = hint.split(": ", 1)[1].split(" would pass")[0]
    with skewed_atan2(3e-5, index=2):
        res, _ = run(shell, f"%%neuron parity {flags}\nz = torch.atan2(x, x + 1)")
    assert res.result.passed, str(res.result)  # the suggestion is one that passes
    with skewed_atan2(0.5, index=2):
        res, _ = run(shell, "%%neuron parity\nz = torch.atan2(x, x + 1)")
    (hint,) = [x for x in str(res.result).splitlines() if x.startswith("over tolerance")]
    assert "far more than rounding, so no tolerance is suggested" in hint and "--atol" not in hint


def test_many_items_show_the_failing_rows_and_fold_the_agreeing_ones(shell):
    run(shell, SETUP)
    cell = TRAIN.replace("mse_loss(model(x), y)", "mse_loss(torch.atan2(model(x), y + 2), y)")
    with skewed_atan2(0.25, index=0, from_call=2):
        res, _ = run(shell, "%%neuron parity\n" + cell.lstrip())
    r = res.result
    lines = str(r).splitlines()
    assert lines[0].startswith("neuron_lab parity neuron:0 vs cpu: FAIL (") and " · first: step 2 (" in lines[0]
    assert lines[1].startswith("first divergence: step 2 (loss at In[")
    assert not any(x.startswith("randomness:") for x in lines)  # the cell drew nothing
    failed = [x.split()[0] for x in lines if x.startswith("  ") and " FAIL " in x]
    assert failed == [i.name for i in r.agreement.failed] and len(failed) == 13
    assert lines[lines.index(next(x for x in lines if x.startswith("  item "))) + 14] == \
        "  + 10 items agree: step, opt (6), x, y, losses"
    html = r._repr_html_()
    assert html.count("<td style=\"padding:1px 8px;text-align:left;vertical-align:top\">FAIL</td>") == 13
    assert "<details><summary>10 items agree: step, opt (6), x, y, losses</summary>" in html


# -- parity: known-divergent cases ---------------------------------------------------------------
def test_an_op_whose_device_path_differs_is_found_with_the_right_variable(shell):
    run(shell, "import torch\nx = torch.linspace(0.1, 1, 6, device=device)\nb = torch.ones(6, device=device)")
    with skewed_atan2(0.5, index=4):
        res, cap = run(shell, "%%neuron parity\na = x * 2\nz = torch.atan2(x, b)\nw = z + a\nn = int(a.sum())")
    result = res.result
    assert not result.passed
    by_name = {i.name: i for i in result.agreement.items}
    assert by_name["a"].passed and by_name["n"].passed and by_name["x"].passed
    z = by_name["z"]
    assert not z.passed and z.worst == (4,) and z.mismatched == 1 and z.numel == 6
    assert z.max_abs == pytest.approx(0.5, abs=1e-5)
    assert z.actual_value - z.expected_value == pytest.approx(0.5, abs=1e-5)
    assert (z.rtol, z.atol) == (1.3e-6, 1e-5) and z.actual_dtype == "float32"
    assert not by_name["w"].passed
    d = result.agreement.divergence
    assert (d.var, d.item, d.line, d.step) == ("z", "z", 3, None)  # z is first in cell order; line 3 of the cell
    assert check_summary_line(result) == ("parity neuron:0 vs cpu: FAIL (2 of 6 items over tolerance) · "
                                          "first: variable z, line 3")
    assert "first divergence: variable z, line 3" in str(result)
    html = result._repr_html_()
    assert "<table" in html and "FAIL" in html and "first divergence: variable z, line 3" in html
    assert cap.stdout.count("parity neuron:0 vs cpu: FAIL (2 of 6 items over tolerance)") == 1  # Out only


def test_the_first_training_step_that_diverged_is_reported(shell):
    run(shell, SETUP)
    cell = TRAIN.replace("mse_loss(model(x), y)", "mse_loss(torch.atan2(model(x), y + 2), y)")
    with skewed_atan2(0.25, index=0, from_call=2) as calls:
        res, _ = run(shell, "%%neuron parity\n" + cell.lstrip())
    assert len(calls) == 3  # the device run only
    a = res.result.agreement
    step = a.divergence.step
    assert (step.step, step.passed) == (2, False)  # step 1 agreed; step 2 is where the loss parted
    assert step.site.line == 5 and step.site.source == "loss.backward()"
    assert step.actual != pytest.approx(step.expected)
    assert "first divergence: step 2 (loss at In[" in str(res.result)
    assert {i.name for i in a.failed} >= {"losses[1]", "losses[2]", "model.0.weight"}
    assert next(i for i in a.items if i.name == "losses[0]").passed


def test_a_failure_in_the_reference_run_only_is_a_finding(shell):
    run(shell, "import torch\nx = torch.ones(3, device=device)")
    res, _ = run(shell, "%%neuron parity\ny = x + 1\nif y.device.type == 'cpu':\n    raise ValueError('cpu only')\n")
    a = res.result.agreement
    assert not res.result.passed and a.expected_error == "ValueError: cpu only" and a.actual_error is None
    assert check_summary_line(res.result) == "parity neuron:0 vs cpu: FAIL: the cpu run raised ValueError: cpu only"
    assert shell.user_ns["y"].device.type == "neuron"


def test_a_failing_device_run_raises_as_usual_and_the_finding_is_kept(shell):
    run(shell, "import torch\nx = torch.ones(3, device=device)")
    with skewed_atan2(fail=True):
        res, _ = run(shell, "%%neuron parity\nbefore = x * 3\nz = torch.atan2(x, x)\nafter = 1", ok=False)
    err = res.error_in_exec
    assert isinstance(err, RuntimeError) and "no kernel for this shape" in str(err)
    assert err.__notes__ == ["neuron_lab parity: the neuron:0 run raised; the cpu reference run ran without error"]
    ns = shell.user_ns
    assert ns["before"].device.type == "neuron" and "after" not in ns and "z" not in ns  # as a plain run leaves it
    (check,) = last_report(shell).checks
    assert check.agreement.actual_error.startswith("RuntimeError: atan2: no kernel")
    assert last_report(shell).error.startswith("RuntimeError")


def test_vars_limits_what_is_compared(shell):
    run(shell, "import torch\nx = torch.ones(3, device=device)")
    # `nothing` is assigned only on a branch neither run takes: a finding, not a bad flag
    res, _ = run(shell, "%%neuron parity --vars b nothing\na = x + 1\nb = a * 2\nif a.sum() < 0:\n    nothing = 1")
    items = res.result.agreement.items
    assert [(i.name, i.passed) for i in items] == [("b", True), ("nothing", False)]
    assert items[1].problem == "not defined after either run"


def test_given_tolerances_replace_the_dtype_defaults(shell):
    run(shell, "import torch\nx = torch.linspace(0.1, 1, 6, device=device)")
    with skewed_atan2(1e-3, index=2):
        res, _ = run(shell, "%%neuron parity --rtol 0 --atol 0.01\nz = torch.atan2(x, x + 1)")
    (z,) = [i for i in res.result.agreement.items if i.name == "z"]
    assert z.passed and (z.rtol, z.atol) == (0.0, 0.01) and z.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert "rtol 0, atol 0.01" in str(res.result)


def test_a_float64_computation_that_loses_precision_is_named_as_torchneurons_64bit_rule(shell):
    """By default the device computes float64 in float32 as TorchNeuron does: parity finds the drift a Trn instance
    has, and its verdict names the 64-bit rule (and the setting for exact 64-bit), not a generic mismatch."""
    run(shell, "import torch\nx = torch.full((8,), 1 + 1e-6, dtype=torch.float64).to(device)")
    res, cap = run(shell, "%%neuron parity\nk = x.float() * 2\ny = (x - 1) * 1e6")
    r = res.result
    items = {i.name: i for i in r.agreement.items}
    assert r.passed is False and r.agreement.divergence.var == "y" and r.drift_64bit
    assert items["x"].passed and items["k"].passed  # the copy to the device and the float32 math agree
    y = items["y"]
    assert not y.passed and y.actual_dtype == "float64" and 0.01 < y.max_abs < 0.1  # 1e-6 is 1.0000000953… in fp32
    assert not y.within_float32  # the subtraction magnifies float32's rounding past its tolerance
    assert r.downcast_emulation is True and r.downcasts == 2 and r.downcast_ops == ["aten::sub", "aten::mul"]
    text = str(r)
    assert text.splitlines()[0].startswith(
        "neuron_lab parity neuron:0 vs cpu: 64-bit drift (1 of 3 items, float64, past float32's tolerances too: "
        "the code magnifies float32's rounding): TorchNeuron's 64-bit rule computes float64 in float32, so a Trn "
        "instance differs alike; NEURON_LAB_EMULATE_DOWNCAST=0 checks exact 64-bit · first: variable y"), text
    assert "FAIL" not in text.splitlines()[0]
    assert "64-bit downcast emulated (float64 computed in float32, int64 in int32, as TorchNeuron; " \
           "NEURON_LAB_EMULATE_DOWNCAST=0 keeps it exact)" in text
    assert "2 64-bit op calls (aten::sub, aten::mul)" in text
    assert r.as_dict()["drift_64bit"] is True


def test_float64_rounding_within_float32s_tolerance_is_named_so(shell):
    run(shell, "import torch\nx = torch.linspace(0.1, 1, 50, dtype=torch.float64).to(device)")
    res, _ = run(shell, "%%neuron parity\nz = (x.exp() - x * 2.3).log1p() * 3")  # ~4e-7 apart: float32's rounding
    r = res.result
    (z,) = r.agreement.failed
    assert z.within_float32 and r.drift_64bit
    assert check_summary_line(r).startswith("parity neuron:0 vs cpu: 64-bit drift (1 of 2 items, float64, within "
                                            "float32's tolerances): TorchNeuron's 64-bit rule"), check_summary_line(r)


def test_an_int64_value_past_int32_is_named_as_torchneurons_64bit_rule(shell):
    """int64 computes in int32 on TorchNeuron: a value past int32 wraps there, and parity says it is the rule's."""
    run(shell, "import torch\nx = torch.tensor([2**40 + 5, 7]).to(device)")
    res, _ = run(shell, "%%neuron parity\ny = x + 1\nz = torch.arange(3, device=device) * 2")
    r = res.result
    (y,) = r.agreement.failed
    assert y.name == "y" and y.int32_wrap and y.actual_dtype == "int64" and r.drift_64bit
    assert check_summary_line(r).startswith(
        "parity neuron:0 vs cpu: 64-bit drift (1 of 3 items, int64, values past int32 wrapped): TorchNeuron's 64-bit "
        "rule computes int64 in int32, so a Trn instance differs alike; NEURON_LAB_EMULATE_DOWNCAST=0 checks exact "
        "64-bit"), check_summary_line(r)


def test_an_int64_mismatch_within_int32_is_not_called_64bit_drift(shell):
    run(shell, "import torch\nx = torch.tensor([5, 7]).to(device)")
    res, _ = run(shell, "%%neuron parity\ny = x + (1 if x.device.type == 'cpu' else 2)")
    assert not res.result.drift_64bit and "FAIL (1 of " in check_summary_line(res.result)


def test_a_float32_mismatch_is_not_called_64bit_drift(shell):
    run(shell, "import torch\nx = torch.linspace(0.1, 1, 6, device=device)\nd = torch.ones(2, dtype=torch.float64, "
               "device=device) * 2")
    with skewed_atan2(0.5, index=2):
        res, _ = run(shell, "%%neuron parity\nz = torch.atan2(x, x + 1)\ne = d * 2")
    assert not res.result.drift_64bit and "FAIL (1 of " in check_summary_line(res.result)


def test_the_same_float64_cell_agrees_with_exact_64bit(run_python):
    out = run_python(in_child_shell("""
        import json
        with capture_output():
            sh.run_line_magic("load_ext", "neuron_lab")
            sh.run_cell("import torch\\nx = torch.full((8,), 1 + 1e-6, dtype=torch.float64).to(device)",
                        store_history=True)
            res = sh.run_cell("%%neuron parity\\ny = (x - 1) * 1e6", store_history=True)
        r = res.result
        print(json.dumps({"passed": r.passed, "emulated": r.downcast_emulation, "downcasts": r.downcasts,
                          "text": str(r)}))
    """), {"NEURON_LAB_EMULATE_DOWNCAST": "0"})
    assert out["passed"] and out["emulated"] is False and out["downcasts"] == 2
    assert "64-bit downcast not emulated (NEURON_LAB_EMULATE_DOWNCAST=0; TorchNeuron computes float64 in float32, " \
        "int64 in int32)" in out["text"]


def test_a_checks_own_copies_and_reads_are_not_the_cells_and_a_users_item_still_is(shell):
    run(shell, "import torch\na = torch.ones(1000, device=device)\nmodel = torch.nn.Linear(8, 1).to(device)\n"
               "x = torch.ones(4, 8, device=device)")
    run(shell, "%%neuron parity\nb = a * 2")
    r = last_report(shell)
    assert (r.ops, r.sync_calls, r.h2d_bytes, r.d2h_bytes) == (1, 0, 0, 0), str(r)  # a * 2, nothing more
    assert "syncs" not in str(r) and "interactiveshell" not in str(r)
    run(shell, "%%neuron parity\nb = a * 2\nv = b.sum().item()")
    r = last_report(shell)
    assert (r.ops, r.sync_calls, r.d2h_bytes) == (2, 1, 4), str(r)  # a * 2, b.sum(), and the user's own read
    assert [(s.site.line, s.count) for s in r.syncs[0].sites] == [(3, 1)]  # the .item(), at its own line
    run(shell, "%%neuron compare --warmup 0 --runs 3\nout = model(x)")
    r = last_report(shell)
    assert (r.sync_calls, r.d2h_bytes, r.ops) == (0, 0, 1), str(r)  # the real run's addmm alone


def test_an_eager_cells_parity_check_loads_no_compiler(run_python):
    out = run_python(in_child_shell("""
        import json, sys
        with capture_output() as cap:
            sh.run_line_magic("load_ext", "neuron_lab")
            sh.run_cell("import torch\\na = torch.ones(1000, device=device)", store_history=True)
            res = sh.run_cell("%%neuron parity\\nb = a * 2", store_history=True)
        print(json.dumps({"passed": res.result.passed, "dynamo": "torch._dynamo" in sys.modules,
                          "said": "loading PyTorch's compiler" in cap.stdout + cap.stderr}))
    """), {})
    assert out == {"passed": True, "dynamo": False, "said": False}


# -- bad flags -------------------------------------------------------------------------------------
@pytest.mark.parametrize("line, message", [
    ("%%neuron parity --rtol 1e-3", "give both --rtol and --atol, or neither"),
    ("%%neuron parity --rtol x --atol 1", "argument --rtol: invalid float value: 'x'"),
    ("%%neuron parity --rtol -1 --atol 1", "--rtol must be a finite number >= 0 (got -1.0)"),
    ("%%neuron parity --rtol nan --atol nan", "--rtol must be a finite number >= 0 (got nan)"),
    ("%%neuron parity --rtol 0 --atol inf", "--atol must be a finite number >= 0 (got inf)"),
    ("%%neuron parity --rtol=-inf --atol 0", "--rtol must be a finite number >= 0 (got -inf)"),
    ("%%neuron parity --seed 99999999999999999999999",
     "--seed must be a whole number from 0 to 2**64-1 = 18446744073709551615 (got 99999999999999999999999), as "
     "torch.manual_seed keeps it"),
    ("%%neuron parity --seed -1", "--seed must be a whole number from 0 to 2**64-1 = 18446744073709551615 (got -1)"),
    ("%%neuron parity --seed 18446744073709551616", "(got 18446744073709551616)"),
    ("%%neuron parity --against neuron", "the reference device is the notebook device (neuron:0)"),
    ("%%neuron parity --vars 1x", "--vars takes variable names, not '1x'"),
    ("%%neuron parity --vars nosuch count", "--vars nosuch: no such variable, and the cell does not assign it"),
    ("%%neuron parity --against tpu", "%%neuron parity: 'tpu' is not a device string"),
    ("%%neuron parity --seed 1.5", "argument --seed: invalid int value: '1.5'"),
    ("%%neuron compare --runs 0", "--runs must be a whole number from 1 to 10,000 (got 0)"),
    ("%%neuron compare --warmup -1", "--warmup must be a whole number from 0 to 10,000 (got -1)"),
    ("%%neuron compare --runs 99999999999999999999", "--runs must be a whole number from 1 to 10,000 "
                                                     "(got 99999999999999999999)"),
    ("%%neuron compare --runs 10001", "--runs must be a whole number from 1 to 10,000 (got 10001)"),
    ("%%neuron compare --warmup 99999999999999999999", "--warmup must be a whole number from 0 to 10,000 "
                                                       "(got 99999999999999999999)"),
    ("%%neuron compare --device cpu", "unrecognized arguments: --device cpu"),
])
def test_bad_flags_are_usage_errors_and_nothing_runs(shell, line, message):
    run(shell, "import torch\ncount = 0")
    state = (session_of(shell).device, session_of(shell).mode, shell.user_ns["device"], torch.get_default_device())
    res, _ = run(shell, f"{line}\ncount += 1\n", ok=False)
    assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
    assert message in str(res.error_in_exec)
    assert "usage: %%neuron" in str(res.error_in_exec)
    assert shell.user_ns["count"] == 0
    assert state == (session_of(shell).device, session_of(shell).mode, shell.user_ns["device"],
                     torch.get_default_device())
    assert not modes.patched()


def test_parity_and_compare_are_cell_magics_only(shell):
    for cmd in ("parity", "compare"):
        res, _ = run(shell, f"%neuron {cmd}", ok=False)
        assert str(res.error_in_exec) == f"%neuron {cmd}: is a cell magic (`%%neuron {cmd}` on a cell's first line) " \
                                         "(it checks that one cell)."
    res, _ = run(shell, "%%neuron status\n1", ok=False)
    assert "%%neuron parity [--against cpu|DEVICE]" in str(res.error_in_exec)
    assert "%%neuron compare [--warmup W] [--runs N] [--fullgraph]" in str(res.error_in_exec)


# -- compare ---------------------------------------------------------------------------------------
BREAKING = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return torch.relu(y)
        return y
torch.manual_seed(0)
net = Net().to(device)
opt = torch.optim.Adam(net.parameters(), lr=0.1)
x = torch.randn(3, 4).to(device)
"""


def test_compare_times_both_modes_lists_breaks_and_runs_the_cell_once_for_real(shell):
    run(shell, BREAKING.lstrip())
    w0 = shell.user_ns["net"].fc.weight.detach().cpu().clone()
    res, cap = run(shell, "%%neuron compare --warmup 1 --runs 3\nopt.zero_grad()\nout = net(x)\nout.sum().backward()"
                          "\nopt.step()\nout.shape")
    r = res.result
    assert isinstance(r, CompareResult) and r.passed, str(r)
    for t in (r.eager, r.compiled):
        assert len(t.runs_s) == 3 and all(s > 0 for s in t.runs_s) and t.first_s > 0
        assert t.min_s <= t.median_s <= t.max_s
    assert r.within_noise is not None and (r.speedup is None) == r.within_noise  # a ratio only from apart spreads
    assert r.compile_cost_s >= 0 and r.compile_s > 0 and r.frames >= 1 and r.graphs >= 1
    assert r.break_even is None or r.break_even >= 1
    model_cell = res.execution_count - 1
    assert [(b.site.cell, b.site.line, b.site.source) for b in r.breaks] == [(model_cell, 8, "if y.sum() > 0:")]
    assert {i.name for i in r.agreement.items} >= {"out", "net.fc.weight", "net.fc.bias"}
    ns = shell.user_ns
    p = ns["net"].fc.weight
    assert float(ns["opt"].state[p]["step"]) == 1.0  # the real run stepped once; the 8 copy runs left it alone
    assert not torch.equal(p.detach().cpu(), w0) and p.device.type == "neuron"
    assert ns["out"].shape == (3, 4)
    text = str(r)
    assert text.startswith("neuron_lab compare eager ") and "graph break at In[" in text
    assert "numeric agreement, compiled against eager: agree" in text
    assert "<table" in r._repr_html_()
    assert last_report(shell).checks == [r]
    assert cap.stdout.count(check_summary_line(r)) == 1 and "check: " not in cap.stdout  # said once, as Out
    assert f"check: {check_summary_line(r)}" in str(last_report(shell))  # the kept report has it
    assert not modes.patched() and shell.user_ns["device"] == torch.device("neuron", 0)
    data = json.loads(json.dumps(r.as_dict()))
    assert data["kind"] == "compare" and len(data["eager"]["runs_s"]) == 3 and data["speedup"] == r.speedup
    assert data["timing_note"] == "emulator: host CPU timings"
    # the compiled code the copy runs left in dynamo's cache still finds its globals once the copies are gone
    run(shell, "import gc\ngc.collect()")
    expected = run(shell, "%%neuron eager\nnet(x)")[0].result
    res, _ = run(shell, "%%neuron compile\nnet(x)")
    torch.testing.assert_close(res.result, expected)



def test_a_checks_runs_parse_and_compile_the_body_once(shell, monkeypatch):
    """Every run of a check (warm-up, timed, copy and real) executes one compiled body: a timed run times the code,
    not IPython's parsing and compiling of its text, which would pull a small cell's ratio towards 1."""
    run(shell, "import torch\nx = torch.ones(4, device='neuron')")
    parsed = []
    ast_parse = shell.compile.ast_parse
    monkeypatch.setattr(shell.compile, "ast_parse", lambda code, *a, **k: parsed.append(code) or ast_parse(code, *a,
                                                                                                           **k))
    res, _ = run(shell, "%%neuron compare --warmup 2 --runs 5\ny = x * 2\ny.sum()")
    assert len(res.result.eager.runs_s) == 5 and len(res.result.compiled.runs_s) == 5
    assert sum(code.startswith("y = x * 2") for code in parsed) == 1, parsed  # (the other: the magic's own cell)


def test_namespace_after_compare_is_exactly_a_plain_runs_and_the_compile_panel_shows_it(shell):
    from neuron_lab.widgets import snapshot

    run(shell, SETUP)
    res, _ = run(shell, "%%neuron compare --warmup 0 --runs 2\n" + TRAIN.lstrip())
    r = res.result
    assert r.passed and r.agreement.steps == 3, str(r)  # the training steps of the two modes agree too
    with_compare = fingerprint(shell)
    with loaded_shell() as plain:
        run(plain, SETUP)
        run(plain, TRAIN)
        assert fingerprint(plain) == with_compare  # copies ran 6 times; the user's model stepped 3 times
    (row,) = [x for x in snapshot.compiles(session_of(shell))["rows"] if x["checks"]]
    assert row["cell"] == res.execution_count and row["checks"][0].startswith("compare eager ")  # one line: the verdict
    assert "outputs agree (23 items, 3 steps)" in row["checks"][0]


PACED = """
import time
import torch
class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.fc(x).relu()  # no module global: a second shell's compile would look it up in sys.modules
torch.manual_seed(0)
net = Small().to(device)
x = torch.randn(3, 4).to(device)
def pace():
    # the cell's own time, by call: with --warmup 0 --runs 5, calls 2-6 are eager's timed runs, 8-12 compiled's
    pace.n += 1
    time.sleep(pace.plan[pace.n - 1] / 1000 if pace.n <= len(pace.plan) else 0)
pace.n = 0
"""


def paced_compare(shell, eager_ms, compiled_ms):
    run(shell, PACED.lstrip())
    shell.user_ns["pace"].plan = [max(eager_ms), *eager_ms, 0, *compiled_ms]  # eager's cold run: not its fastest
    res, _ = run(shell, "%%neuron compare --warmup 0 --runs 5\npace()\nnet.train()\nout = net(x)")
    assert shell.user_ns["pace"].n == 13  # 6 eager, 6 compiled (each one cold), the real run
    return res.result


def test_compare_says_when_the_difference_is_within_noise_and_claims_no_speedup(shell):
    r = paced_compare(shell, [5, 40, 8, 30, 12], [3, 50, 6, 25, 9])  # min..median 5..12 vs 3..9 ms: they overlap
    assert r.passed and r.within_noise is True and r.speedup is None and r.break_even is None, str(r)
    lines = str(r).splitlines()
    assert lines[0].startswith(f"neuron_lab compare eager {format_seconds(r.eager.min_s)} vs compiled "
                               f"{format_seconds(r.compiled.min_s)} (min of 6): within noise · "
                               "emulator: host CPU timings · compile ")
    assert lines[0].endswith(" · outputs agree (4 items)")
    assert lines[1].split() == ["mode", "min", "median", "max", "first", "run", "runs"], lines[1]
    assert lines[2].split()[:5] == ["eager", *format_seconds(r.eager.min_s).split(),
                                    *format_seconds(r.eager.median_s).split()], lines[2]
    assert lines[4].startswith("within noise: the spreads (min–median) eager "
                               f"{format_seconds(r.eager.min_s)}–{format_seconds(r.eager.median_s)}, compiled ") and \
        "overlap, so no speed-up or break-even is claimed" in lines[4]
    assert "breaks even" not in str(r) and "speedup" not in str(r) and "×" not in str(r)
    # what the run made comes before what it left unchanged (the parameters nothing stepped, the input)
    rows = [x.split()[0] for x in lines[lines.index(next(x for x in lines if x.startswith("  item "))) + 1:]]
    assert rows == ["out", "net.fc.weight", "net.fc.bias", "x"]
    assert [i.unchanged for i in r.agreement.items if i.name in rows] == [True, True, False, True]  # cell order
    assert json.loads(json.dumps(r.as_dict()))["within_noise"] is True
    assert "emulator: host CPU timings" in r._repr_html_()


def test_compare_gives_the_ratio_when_the_runs_are_clearly_apart(shell):
    r = paced_compare(shell, [40] * 5, [1] * 5)
    assert r.passed and r.within_noise is False and r.speedup > 4, str(r)
    lines = str(r).splitlines()
    be = "never breaks even" if r.break_even is None else f"breaks even after {count(r.break_even, 'run')}"
    assert lines[0].startswith(f"neuron_lab compare eager {format_seconds(r.eager.min_s)} vs compiled "
                               f"{format_seconds(r.compiled.min_s)} (min of 6): {r.speedup:.2f}× · "
                               "emulator: host CPU timings · compile ")
    assert f" · {be} · outputs agree (4 items)" in lines[0]
    assert lines[4].startswith(f"speedup {r.speedup:.2f}× (min of 6; the spreads (min–median) eager ") and \
        lines[4].endswith(f"do not overlap) · compile cost {format_seconds(r.compile_cost_s)} (dynamo and backend "
                          f"{format_seconds(r.compile_s)}, 1 frame compile, 1 graph) · {be}"), lines[4]


def timed(eager_ms: list[float], compiled_ms: list[float], first_ms: tuple[float, float] = (50, 50),
          note: str | None = None, frames: int = 1) -> CompareResult:
    """A compare result from made-up timings (ms), its outputs in agreement; ``frames``: frames it compiled."""
    return CompareResult("neuron:0", "neuron", False, 1, len(eager_ms), Agreement("compiled", "eager"),
                         Timing(first_ms[0] / 1e3, [t / 1e3 for t in eager_ms]),
                         Timing(first_ms[1] / 1e3, [t / 1e3 for t in compiled_ms]), frames=frames, graphs=frames,
                         timing_note=note)


def test_spreads_that_overlap_are_within_noise_and_claim_nothing():
    # issue 28's rerun: compiled min 1.7 ms, max 268 ms, eager min 45 ms; the middle halves (IQR) do not overlap
    r = timed([45, 46, 48, 50, 52], [1.7, 120, 123, 200, 268], first_ms=(60, 900))
    assert (r.eager.spread_s, r.compiled.spread_s) == ((0.045, 0.048), (0.0017, 0.123))
    assert r.within_noise is True and r.speedup is None and r.break_even is None
    assert check_summary_line(r).startswith(f"compare eager {format_seconds(0.045)} vs compiled "
                                            f"{format_seconds(0.0017)} (min of 6): within noise · compile ")
    assert "×" not in str(r) and "breaks even" not in str(r) and "host CPU" not in str(r)


def test_spreads_apart_give_the_speedup_of_the_fastest_runs_and_the_break_even():
    r = timed([40, 41, 40, 45, 42], [1, 1.2, 1.1, 1, 1.3], first_ms=(42, 508), note="emulator: host CPU timings")
    assert r.within_noise is False and r.speedup == pytest.approx(40) and r.break_even == 13  # 1 + ⌈466 / 39⌉
    line = check_summary_line(r)
    assert line.startswith(f"compare eager {format_seconds(0.04)} vs compiled {format_seconds(0.001)} (min of 6): "
                           "40.00× · emulator: host CPU timings · ")
    assert " · breaks even after 13 runs · outputs agree (0 items)" in line
    slower = timed([1, 1.2, 1.1, 1, 1.3], [50, 51, 50, 55, 52])
    assert slower.speedup == pytest.approx(1 / 50) and slower.break_even is None
    assert "0.02× · compile " in check_summary_line(slower) and "never breaks even" in check_summary_line(slower)


def test_a_cold_run_faster_than_the_timed_ones_is_the_min_and_ends_shown_alike_overlap():
    # the walkthrough's run: eager's cold run 749 µs under its timed runs' 22.5 ms; compiled's median shown as that
    r = timed([22.51, 24.8, 23, 40.7, 25], [1.0, 22.3, 22.49, 27.4, 23], first_ms=(0.749, 22.3))
    assert r.eager.min_s == pytest.approx(0.000749) and r.eager.spread_s == pytest.approx((0.000749, 0.0248))
    assert Timing(0.5).min_s == 0.5  # no timed run yet: the first is the fastest
    assert r.within_noise is True and r.speedup is None and r.break_even is None, str(r)
    assert "within noise: the spreads (min–median) eager 749 µs–24.8 ms, compiled 1.0 ms–22.5 ms overlap" in str(r)
    shown_alike = timed([22.51, 24.8, 23, 40.7, 25], [1.0, 22.3, 22.49, 27.4, 23], first_ms=(30, 22.3))
    assert shown_alike.eager.spread_s[0] > shown_alike.compiled.spread_s[1]  # apart by 20 µs, both shown 22.5 ms
    assert shown_alike.within_noise is True and "do not overlap" not in str(shown_alike)


def test_nothing_compiled_claims_no_compile_cost_nor_break_even_and_one_run_is_singular():
    r = timed([40, 41, 40, 45, 42], [1, 1.2, 1.1, 1, 1.3], first_ms=(42, 30), frames=0)
    assert r.within_noise is False and r.compiled_nothing and r.compile_cost_s is None and r.break_even is None
    line = check_summary_line(r)
    assert " (min of 6): 40.00× · nothing compiled · outputs agree (0 items)" in line, line
    facts = str(r).splitlines()[4]
    assert facts.startswith("speedup 40.00× (min of 6;") and "(dynamo and backend" not in str(r) and \
        "breaks even" not in str(r), str(r)
    once = timed([40, 41, 40, 45, 42], [1, 1.2, 1.1, 1, 1.3], first_ms=(42, 41))  # compiled's first run costs no more
    assert once.break_even == 1 and check_summary_line(once).endswith(" · breaks even after 1 run · outputs agree "
                                                                      "(0 items)")


def test_a_second_compare_of_a_cached_module_claims_no_compile_cost(shell):
    run(shell, BREAKING.lstrip())
    run(shell, "%%neuron compare --warmup 0 --runs 3\nout = net(x)")
    res, _ = run(shell, "%%neuron compare --warmup 0 --runs 3\nout = net(x)")  # dynamo's cache holds it now
    r = res.result
    assert r.passed and r.compiled_nothing and r.compile_cost_s is None and r.break_even is None, str(r)
    assert " · nothing compiled · " in check_summary_line(r) and "(dynamo and backend" not in str(r)
    assert "breaks even" not in str(r) and "nothing compiled in this check" in str(r)
    assert json.loads(json.dumps(r.as_dict()))["compile_cost_s"] is None


def test_too_few_runs_claim_nothing_and_the_overlap_rule_counts_a_shared_end():
    r = timed([40, 41], [1, 1])
    assert r.within_noise is None and r.speedup is None and r.break_even is None
    assert ": too few runs to tell from noise · compile " in check_summary_line(r)
    assert "too few timed runs to tell from noise (2 per mode; --runs 3 or more)" in str(r)
    assert overlap((1, 2), (2, 3)) and overlap((2, 3), (1, 2)) and not overlap((1, 2), (2.5, 3))


def test_a_fullgraph_compile_that_fails_is_a_finding_and_the_cell_still_runs(shell):
    run(shell, BREAKING.lstrip())
    res, _ = run(shell, "%%neuron compare --fullgraph --runs 1\nout = net(x)")
    r = res.result
    assert not r.passed and r.compiled is None and r.eager is not None
    assert r.agreement.actual_error.startswith("Unsupported") or "graph break" in r.agreement.actual_error.lower()
    assert check_summary_line(r).startswith("compare eager vs compiled (neuron): FAIL: the compiled run raised ")
    assert shell.user_ns["out"].shape == (3, 4) and not modes.patched()  # the real run ran, in the cell's mode


def test_parity_and_compare_from_plain_python_leave_the_arguments_alone():
    import neuron_lab

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to("neuron")
    x = torch.linspace(0.1, 1, 6).reshape(2, 3).to("neuron")
    w0 = model.weight.detach().cpu().clone()

    def head(m, t):
        return torch.atan2(m(t), t[:, :2] + 2)

    ok = neuron_lab.parity(head, model, x)
    assert ok.passed and (ok.device, ok.reference) == ("neuron:0", "cpu")
    assert [i.name for i in ok.agreement.items] == ["m.weight", "m.bias", "t", "last value"]
    with skewed_atan2(0.5, index=3):
        bad = neuron_lab.parity(head, model, x)
    assert not bad.passed and bad.agreement.divergence.item == "last value"
    (worst,) = bad.agreement.failed
    assert worst.worst == (1, 1) and worst.max_abs == pytest.approx(0.5, abs=1e-5)
    c = neuron_lab.compare(model, x, warmup=1, runs=3)
    assert c.passed and len(c.eager.runs_s) == 3 and len(c.compiled.runs_s) == 3 and c.within_noise is not None
    assert torch.equal(model.weight.detach().cpu(), w0) and model.weight.device.type == "neuron"
    with pytest.raises(ValueError, match="give both rtol and atol, or neither"):
        neuron_lab.parity(head, model, x, rtol=1e-3)
    with pytest.raises(ValueError, match="parity needs the arguments on another device than the reference"):
        neuron_lab.parity(head, model.cpu(), x.cpu())


def test_the_plain_python_checks_refuse_bad_arguments_before_running(shell):
    import neuron_lab

    calls = []

    def fn(t):
        calls.append(1)
        return t * 2

    x = torch.ones(3).to("neuron")
    with pytest.raises(ValueError, match="unknown torch.compile backend 'nosuch'") as e:
        neuron_lab.compare(fn, x, backend="nosuch")
    known = str(e.value).split("; known: ", 1)[1].split(", ")
    assert {"neuron", "inductor", "eager", "aot_eager"} <= set(known)
    assert not [k for k in known if "TESTING_ONLY" in k or "minifier" in k], known  # dynamo's debug ones go unnamed
    with pytest.raises(ValueError, match=r"^runs must be a whole number from 1 to 10,000 \(got 0\)$"):
        neuron_lab.compare(fn, x, runs=0)
    with pytest.raises(ValueError, match=rf"^warmup must be a whole number from 0 to 10,000 \(got {10**20}\)$"):
        neuron_lab.compare(fn, x, warmup=10**20)
    with pytest.raises(ValueError, match=r"^rtol must be a finite number >= 0 \(got nan\)$"):
        neuron_lab.parity(fn, x, rtol=float("nan"), atol=float("nan"))
    with pytest.raises(ValueError, match=r"^atol must be a finite number >= 0 \(got inf\)$"):
        neuron_lab.parity(fn, x, rtol=0, atol=float("inf"))
    with pytest.raises(ValueError, match=r"^seed must be a whole number from 0 to 2\*\*64-1"):
        neuron_lab.parity(fn, x, seed=2**64)
    assert calls == []
    r = neuron_lab.parity(fn, x)
    assert repr(r) == "<ParityResult: parity neuron:0 vs cpu: agree (2 items)>"


# -- the pieces: option objects, the grammar, copies ------------------------------------------------
def test_the_option_objects_check_their_own_values():
    from neuron_lab.checks import CompareOptions, ParityOptions, limits

    assert ParityOptions("cpu").against == torch.device("cpu")  # a device string is parsed
    with pytest.raises(ValueError, match="'tpu' is not a device string"):
        ParityOptions("tpu")
    with pytest.raises(limits.OptionError) as e:
        ParityOptions(vars=("ok", "1x"))
    assert str(e.value) == "vars takes variable names, not '1x'"  # neuron_lab.parity's spelling
    assert e.value.spelled(lambda name: f"--{name}") == "--vars takes variable names, not '1x'"  # the magic's
    with pytest.raises(limits.OptionError) as e:
        CompareOptions(backend="{runs}")
    assert e.value.spelled(lambda name: f"--{name}").startswith("unknown torch.compile backend '{runs}'; known: ")
    assert CompareOptions(backend="inductor").backend == "inductor"
    with pytest.raises(limits.OptionError, match="rejects dynamic=True, as TorchNeuron does; dynamic needs"):
        limits.compile_options("neuron", dynamic=True)
    assert limits.compile_options("inductor", True, True) == modes.CompileOptions("inductor", True, True)


def test_every_command_has_a_parser_and_a_usage_line():
    from neuron_lab.magics import parser

    p = parser.build()
    commands = parser.commands(p)
    assert [name for name, _, _ in commands][:3] == ["status", "device", "mode"]
    assert {"parity", "compare", "compile", "eager", "dashboard", "memory"} <= {name for name, _, _ in commands}
    for name, sp, short in commands:
        prefix = "%%" if name in parser.CELL_ONLY else "%"
        assert sp.prog == f"{prefix}neuron {name}" and short
        assert parser.usage(p, name) == sp.format_usage().rstrip()
        assert parser.usage(p, name).startswith(f"usage: {prefix}neuron {name}")


def test_a_bad_compile_backend_is_one_usage_error_for_every_form(shell):
    for line in ("%neuron mode compile --backend nosuch", "%%neuron compile --backend nosuch\n1"):
        res, _ = run(shell, line, ok=False)
        prefix = line.split(" ")[0]
        command = line.split(" ")[1]
        assert str(res.error_in_exec).startswith(f"{prefix} {command}: unknown torch.compile backend 'nosuch'")
        assert f"usage: {prefix} {command}" in str(res.error_in_exec)


def test_a_bad_compile_backend_setting_is_named_where_it_is_used(shell):
    """%config cannot check it (listing the backends loads dynamo, a second): its first use names the setting, and
    prints no usage of a --backend the user never gave."""
    run(shell, '%config NeuronLab.compile_backend = "nosuch"')
    try:
        for line in ("%neuron mode compile", "%%neuron compile\n1", "%%neuron compare\n1"):
            res, _ = run(shell, line, ok=False)
            prefix, command = line.split("\n")[0].split(" ")[:2]
            error = str(res.error_in_exec)
            assert error.startswith(f"{prefix} {command}: NeuronLab.compile_backend = 'nosuch': unknown torch.compile "
                                    "backend 'nosuch'; known: "), error
            assert error.endswith("(`%config NeuronLab.compile_backend = NAME` sets another)"), error
            assert "usage:" not in error and "--backend" not in error
        run(shell, "%neuron mode compile --backend eager")  # an option given still overrides the setting
    finally:
        run(shell, '%config NeuronLab.compile_backend = "neuron"')


def test_copies_find_every_tensor_an_object_holds_once():
    from neuron_lab.checks import copies

    m = torch.nn.Linear(2, 2)
    m.mask = torch.ones(2)  # a plain tensor attribute of a module
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    t = torch.zeros(1)

    class Box:
        pass

    box = Box()
    box.inner = {"k": [t, (t, m)]}
    found = [id(x) for x in copies.tensors(box)]
    assert len(found) == len(set(found))
    assert {id(t), id(m.weight), id(m.bias), id(m.mask)} <= set(found)
    state = {id(v) for s in opt.state.values() for v in s.values()}
    assert state and state <= {id(x) for x in copies.tensors(opt)}
