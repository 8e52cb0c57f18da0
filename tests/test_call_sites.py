"""Where a call came from, inside library code: a row names the innermost library line and the cell line that led
to it ("generation/utils.py:3280 `next_tokens = torch.multinomial(...)` ← In[3] line 2"), and the full chain with
`%neuron report --full` (no IPython, neuron_lab or PyTorch frames). Compiled graphs and graph breaks inside a
library are tested in test_compile_cells.py, beside the other compiled cells.

Hugging Face models are tiny configs with random weights: no hub downloads.
"""

from __future__ import annotations

import inspect
import json

import pytest
from shells import run

transformers = pytest.importorskip("transformers")

from neuron_lab.extension import session_of  # noqa: E402
from neuron_lab.report.model import Report  # noqa: E402

T5 = """\
import torch, transformers
cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                            num_heads=2, decoder_start_token_id=0, pad_token_id=0)
model = transformers.T5ForConditionalGeneration(cfg).to("neuron")
ids = torch.randint(0, 64, (1, 5)).to("neuron")
"""
GENERATE = "out = model.generate(ids, do_sample=True, max_new_tokens=3)"


def last_report(shell):
    return next(reversed(session_of(shell).history.values()))


def line_of(module, text: str) -> int:
    """The line of ``module``'s source that holds ``text`` (the installed version's, whatever it is)."""
    lines, _ = inspect.getsourcelines(module)
    (n,) = [i for i, line in enumerate(lines, 1) if text in line]
    return n


def test_a_library_fallback_names_the_library_line_and_the_cell_line_that_led_to_it(shell) -> None:
    from transformers.generation import utils as generation
    from transformers.models.t5 import modeling_t5

    run(shell, T5)
    res, cap = run(shell, f"torch.manual_seed(0)\n{GENERATE}")
    n = res.execution_count
    sample = line_of(generation, "next_tokens = torch.multinomial(probs")
    rows = {r.op: r for r in last_report(shell).fallbacks}
    (sc,) = rows["aten::multinomial"].sites
    assert (sc.site.cell, sc.site.line, sc.count) == (n, 2, 3)
    assert (sc.via.short_label, sc.via.line) == (f"generation/utils.py:{sample}", sample)
    assert (f"      at generation/utils.py:{sample} `next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)`"
            f" ← In[{n}] line 2: {GENERATE}  (3×)") in cap.stdout
    saved = Report.from_dict(json.loads(json.dumps(last_report(shell).as_dict())))  # a saved report keeps both lines
    assert [s.via for r in saved.fallbacks for s in r.sites] == [sc.via]
    html = last_report(shell)._repr_html_()
    assert f"<code>generation/utils.py:{sample}</code>" in html and f"<code>In[{n}] line 2</code>" in html

    # an int64 op inside T5's attention: its row names modeling_t5.py's line
    (down,) = [r for r in last_report(shell).downcasts if r.op == "aten::arange.start_out"]
    bias = line_of(modeling_t5, "context_position = torch.arange(")
    assert any(s.via is not None and s.via.short_label == f"t5/modeling_t5.py:{bias}" for s in down.sites)

    full, _ = run(shell, f"%neuron report {n} --full")
    text = str(full.result)
    stack = text.split("aten::multinomial", 1)[1].split("stack:", 1)[1].splitlines()[1:6]
    assert stack[0] == f"          In[{n}] line 2 in <module>: {GENERATE}"
    assert stack[-1] == (f"          transformers/generation/utils.py:{sample} in _sample: "
                         "next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)")
    for frame in text.split("stack:")[1:]:
        assert "IPython" not in frame and "neuron_lab/" not in frame and "torch/" not in frame, frame
    assert "t5/modeling_t5.py" in text and "transformers/models/t5/modeling_t5.py" in text

