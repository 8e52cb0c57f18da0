"""`make demo`'s main job: train a small model on `neuron` and show which of its ops fell back to the CPU.

Runs anywhere: on the bundled emulator here, on a Trn instance against the real TorchNeuron.
"""

from __future__ import annotations

import torch

import neuron_lab
from neuron_lab import backend


class PolarMLP(torch.nn.Module):
    """Regresses a function of 2-D points through polar features (atan2 is a known TorchNeuron fallback)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))

    def forward(self, xy: torch.Tensor) -> torch.Tensor:
        r = xy.norm(dim=1, keepdim=True)
        theta = torch.atan2(xy[:, 1:], xy[:, :1])
        return self.net(torch.cat([xy, r, theta], dim=1))


def main(steps: int = 50) -> int:
    b = backend.active()
    print(f"\nneuron_lab {neuron_lab.__version__}: training on neuron:0 with {b.description}")
    torch.manual_seed(0)
    model = PolarMLP().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    b.clear_op_tracking()
    for step in range(1, steps + 1):
        xy = torch.randn(256, 2, device="neuron")
        target = torch.sin(3 * xy[:, :1]) * xy[:, 1:]
        loss = torch.nn.functional.mse_loss(model(xy), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == 1 or step % 10 == 0:
            print(f"  step {step:3d}  loss {loss.item():.4f}")
    b.synchronize()
    print(f"\ntorch_neuronx-style get_fallback_ops(): {sorted(b.get_fallback_ops())}")
    print("\nops that did not run natively (count, first shapes, host time):")
    for st in b.op_stats():
        if st.kind == "native":
            continue
        shapes = st.signatures[0][0] if st.signatures else ()
        print(f"  {st.kind:<9} {st.name + ('.' + st.overload if st.overload else ''):<34} x{st.count:<5} "
              f"{str(list(map(list, shapes))):<26} {st.host_ns / 1e6:7.2f} ms  {st.reason[:60]}")
    native = sum(st.count for st in b.op_stats("native"))
    print(f"\n{native} native op calls; memory: {b.memory_allocated()} B allocated, "
          f"peak {b.max_memory_allocated()} B of {b.capacity()} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
