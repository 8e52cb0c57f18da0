"""The training workload both overhead benchmarks run: an MLP on ``neuron`` whose forward calls
``torch.atan2`` twice (a CPU fallback: each call is an op event), trained with AdamW.

A cell's source, formatted with ``width`` and ``batch``; it defines ``model``, ``opt``, ``x`` and ``y``.
"""

MODEL = """\
class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.atan2(h, h.detach().abs() + 1.0)
        h = self.fc2(h)
        h = torch.atan2(h, h.detach().abs() + 1.0)
        return self.out(h)

torch.manual_seed(0)
model = Net({width}).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn({batch}, {width}).to("neuron")
y = torch.randn({batch}, {width}).to("neuron")
"""
