"""Silent waits: `%load_ext neuron_lab` loads no compiler stack and says at once that it loaded."""

from __future__ import annotations

HEAVY = ("torch._dynamo", "torch._inductor", "ipywidgets", "matplotlib")  # each loads at its first use, not at load


def test_loading_the_extension_imports_no_compiler_or_widgets_and_prints_its_banner(run_python) -> None:
    out = run_python("""
        import json, os, sys
        import torch
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        from traitlets.config import Config

        c = Config()
        c.HistoryAccessor.enabled = False
        sh = InteractiveShell(config=c)
        with capture_output() as cap:
            sh.run_line_magic("load_ext", "neuron_lab")
        print(json.dumps({"loaded": [m for m in os.environ["HEAVY"].split() if m in sys.modules], "out": cap.stdout}))
    """, {"HEAVY": " ".join(HEAVY)}, timeout=120)
    assert out["loaded"] == []
    assert out["out"].startswith("neuron_lab ") and "device neuron:0" in out["out"]
