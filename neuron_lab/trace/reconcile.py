"""A window's op rows made to agree with the device's own account of it (TorchNeuron's ``get_fallback_ops()``).

The observer judges a call native when a PrivateUse1 kernel is registered, but TorchNeuron's registered Python
kernels run some arguments on the CPU themselves (a dtype or shape they cannot handle) and say so only in their
fallback set. An op that set names is a CPU fallback whatever its registration says: its row keeps what the observer
saw of it (lines, shapes, count); one the observer never saw still gets a row, with no count and no line.
"""

from __future__ import annotations

from neuron_lab import kinds
from neuron_lab.backend.events import WindowAccount, op_key
from neuron_lab.kinds import OFF_DEVICE, REPORTED, SOURCE
from neuron_lab.report.model import OpRow

REPORTED_BY_DEVICE = ("TorchNeuron reported this op as run on the CPU in this window, although a device kernel is "
                      "registered for it (a registered kernel runs on the CPU the arguments it cannot handle). Its "
                      "account names ops, not calls: the calls counted are all the observer saw of the op; some may "
                      "have run on the device." + SOURCE + "torch_neuronx.get_fallback_ops(); "
                      "tnx:python_ops/base.py:806-829")
UNSEEN = ("TorchNeuron reported this op as run on the CPU in this window; neuron_lab's observer saw no call of it "
          "(reached from inside another kernel, or from another thread): count and line unknown."
          + SOURCE + "torch_neuronx.get_fallback_ops()")


def reconcile(rows: list[OpRow], account: WindowAccount) -> list[OpRow]:
    """``rows`` (the reported kinds, plus whatever kinds the backend asked to watch) with the account's ops placed:
    a watched row of a reported op becomes a row of the account's kind; watched rows nobody reported are dropped."""
    if not account.ops:  # the emulator's observer is its whole account: the reported rows
        return sorted((r for r in rows if r.kind in REPORTED), key=kinds.row_order)
    reported = {op_key(d.name): d for d in account.ops}
    off = {op_key(r.op) for r in rows if r.kind in OFF_DEVICE}
    out: list[OpRow] = []
    for r in rows:
        d = reported.get(op_key(r.op))
        if r.kind in REPORTED:
            out.append(r)
        elif d is not None and op_key(r.op) not in off:
            r.kind, r.reason = d.kind, REPORTED_BY_DEVICE
            r.host_ns = 0  # the observer timed the call as it issued it: not as the CPU run the device reports
            out.append(r)
    seen = {op_key(r.op) for r in rows}
    out += [OpRow(d.name, d.kind, d.reason or UNSEEN) for key, d in sorted(reported.items()) if key not in seen]
    return sorted(out, key=kinds.row_order)
