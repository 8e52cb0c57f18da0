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

# The same MLP with only ops TorchNeuron lowers (tanh for atan2): a graph with a CPU fallback fails to compile on
# TorchNeuron, so `%%neuron compare`'s compiled run needs this one.
LOWERED = MODEL.replace("torch.atan2(h, h.detach().abs() + 1.0)", "torch.tanh(h)")

LM = """\
class Block(torch.nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.proj = torch.nn.Linear(d, d, bias=False)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, hidden, bias=False)
        self.fc2 = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab={vocab}, d={d_model}, heads={heads}, layers={layers}, seq={seq}):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d))
        self.blocks = torch.nn.ModuleList(Block(d, heads, 7 * d // 2) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.t()  # the output head shares the embedding


torch.manual_seed(0)
lm = TinyLM().to("{device}")
lm_opt = torch.optim.AdamW(lm.parameters(), lr=1e-3)
tokens = torch.randint(0, {vocab}, ({batch}, {seq} + 1)).to("{device}")
inputs, targets = tokens[:, :-1], tokens[:, 1:]


def lm_step(model):
    lm_opt.zero_grad()
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    lm_opt.step()
    return loss
"""


def lm_source(*, vocab: int = 256, d_model: int = 64, heads: int = 2, layers: int = 2, seq: int = 32,
              batch: int = 8, device: str = "neuron") -> str:
    """The tiny transformer LM of issue 17 (about 109k parameters), as a cell's source.

    It defines ``TinyLM``, ``lm`` (on ``device``), ``lm_opt`` (AdamW), ``inputs``/``targets`` and
    ``lm_step(model)``, one training step that returns the loss.
    """
    return LM.format(vocab=vocab, d_model=d_model, heads=heads, layers=layers, seq=seq, batch=batch, device=device)
