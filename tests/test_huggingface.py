"""Hugging Face's training stack on the emulated `neuron` device, unchanged: transformers and accelerate find
`torch_neuronx` (served by the emulator), pick `neuron:0`, and a Trainer run matches the same run on the CPU.

Models are tiny configs with random weights: no hub downloads. transformers and accelerate are pinned test
dependencies; torchvision is not installed (its registry build does not import beside the CPU torch wheel).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from shells import loaded_shell, run  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from neuron_lab.extension import session_of  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """16 sequences of 16 token ids, the same on every run."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def train(tmp_path, *, use_cpu: bool, steps: int = 3, dropout: float = 0.1) -> tuple[float, list[float], torch.device]:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
                                       bos_token_id=0, eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout,
                                       attn_pdrop=dropout))
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], max_steps=steps, per_device_train_batch_size=4,
                             logging_steps=1, save_strategy="no", use_cpu=use_cpu, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    out = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return out.training_loss, losses, next(model.parameters()).device


def test_transformers_and_accelerate_pick_the_neuron_device(tmp_path) -> None:
    from transformers.utils import is_torch_neuron_available

    assert is_torch_neuron_available()
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert (args.device, args.n_gpu) == (torch.device("neuron", 0), 1)
    compiling = TrainingArguments(output_dir=str(tmp_path), report_to=[], torch_compile=True)
    assert compiling.torch_compile_backend == "neuron"
    assert accelerate.Accelerator().device.type == "neuron"


def test_a_trainer_run_on_neuron_matches_the_cpu_run(tmp_path) -> None:
    """Without dropout: with it, the device run draws its masks from the device's generator while the CPU run
    shares the CPU's with the data sampler, so the masks differ (as between CUDA and the CPU)."""
    loss, losses, where = train(tmp_path / "neuron", use_cpu=False, dropout=0.0)
    cpu_loss, cpu_losses, cpu_where = train(tmp_path / "cpu", use_cpu=True, dropout=0.0)
    assert (where, cpu_where) == (torch.device("neuron", 0), torch.device("cpu"))
    assert len(losses) == 3 and losses == pytest.approx(cpu_losses, rel=1e-5)
    assert loss == pytest.approx(cpu_loss, rel=1e-5)


def test_a_notebook_cell_running_the_trainer_reports_its_ops_and_memory(tmp_path) -> None:
    with loaded_shell() as sh:
        sh.user_ns.update(train=train, tmp=tmp_path)
        res, out = run(sh, "loss, losses, where = train(tmp, use_cpu=False)")
        assert res.success and sh.user_ns["where"] == torch.device("neuron", 0)
        report = next(reversed(session_of(sh).history.values()))
    assert report.device == "neuron:0" and report.ops > 500
    assert report.memory.peak > 0 and report.h2d_bytes > 0
    assert report.fallbacks == []  # the bundled profile predicts none for GPT-2's training step
    # int64 token ids, reported as TorchNeuron does; and the Trainer's loss logging reads the device (syncs)
    assert "downcast" in {r.kind for r in report.ops_not_native} <= {"downcast", "sync"}
    # under the cell's line, each row names the library line that issued it: GPT-2's, the Trainer's, accelerate's
    vias = {s.via.short_label.partition(":")[0] for r in report.ops_not_native for s in r.sites if s.via}
    assert {"gpt2/modeling_gpt2.py", "transformers/trainer.py", "accelerate/accelerator.py"} <= vias, vias
    assert {s.site.source for r in report.ops_not_native for s in r.sites} == {"loss, losses, where = train(tmp, "
                                                                               "use_cpu=False)"}


PARITY_SETUP = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
model = MODEL.to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 100, (2, 16)).to(device)
"""

GPT2 = "GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32, {}))"
LLAMA = ("LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, "
         "hidden_size=32, intermediate_size=64, vocab_size=100, max_position_embeddings=32, {}))")


@pytest.mark.parametrize("model, draws", [
    (GPT2.format("resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1"), 7),
    (GPT2.format("resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.0"), 5),  # the CPU would pick its flash kernel
    (LLAMA.format("attention_dropout=0.1"), 2),
    (LLAMA.format("attention_dropout=0.0"), 0),  # Llama's default: no dropout at all
], ids=["gpt2", "gpt2-no-attention-dropout", "llama", "llama-no-dropout"])
def test_parity_of_a_training_step_agrees_with_every_draw_replayed(model, draws) -> None:
    """Hugging Face's attention calls SDPA with ``dropout_p=0.0`` when attention dropout is off: the CPU then runs
    its flash kernel, which PyTorch tags random though it draws nothing; the check must not count it as a draw."""
    with loaded_shell() as sh:
        run(sh, PARITY_SETUP.replace("MODEL", model))
        res, _ = run(sh, "%%neuron parity\nopt.zero_grad()\nloss = model(input_ids=ids, labels=ids).loss\n"
                         "loss.backward()\nopt.step()")
        r = res.result
        assert r.passed, str(r)
        assert r.randomness.complete and (r.randomness.drawn, r.randomness.own) == (draws, 0), str(r)
        assert "drew differently" not in str(r)
