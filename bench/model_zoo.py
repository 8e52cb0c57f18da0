"""Op coverage on a model zoo: which ATen ops of one training step fall back to the CPU under each op coverage.

Each model of the zoo (real architectures from transformers, diffusers and timm, randomly initialised from tiny
configs: nothing is downloaded) runs one training step on `neuron` (forward, loss, backward, ``AdamW.step``,
``zero_grad``) inside ``neuron_lab.track()``. The report gives the step's device op calls (``Report.ops``) and the
ops that did not run on the device (``Report.fallbacks``: CPU fallbacks and host ops; host ops are marked ``†``),
and under a coverage with ``possible`` ops, those that may fall back (marked ``?``).
Model and inputs are built on the CPU under ``torch.manual_seed(0)`` and then moved to `neuron`, so input
creation is not measured; the model is in ``train()`` mode, so dropout runs.

The op coverage is read once at process start, so every (model, coverage) pair runs in a fresh child
process with ``NEURON_LAB_COVERAGE=<coverage>`` and a timeout. A model that fails to build or run is listed with the
first line of its error, never dropped. Op names are reported without their overload (``aten::add.Tensor`` is
``add``), the granularity at which coverages classify ops.

    python bench/model_zoo.py                                  # every model, both bundled coverages
    python bench/model_zoo.py --models gpt2,unet2d --coverage torchneuron-src-2026-04
    python bench/model_zoo.py --json /tmp/model_zoo/results.json --table /tmp/model_zoo/table.md
    python bench/model_zoo.py --list                           # the zoo's model names

timm builds its models only when torchvision can be imported (timm 1.0 imports ``torchvision.ops`` and
``torchvision.transforms`` at import time); without torchvision its models are listed as failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

COVERAGES = ("torchneuron-2.33", "torchneuron-src-2026-04")
MARK = "MODEL_ZOO_RESULT "  # the child's result line on stdout: MARK + JSON
BATCH = 2
LIST_ALL = 8  # a cell lists every fallback op up to this many, else the most-called TOP of them
TOP = 6

Built = tuple[Any, dict[str, Any], Callable[[Any, dict[str, Any]], Any]]  # model, CPU inputs, loss(model, inputs)


# --- the zoo: each builder returns a CPU model, its CPU inputs and the loss of one step ----------------------------

def _hf_loss(model: Any, batch: dict[str, Any]) -> Any:
    return model(**batch).loss


def _ids(vocab: int, length: int = 16) -> Any:
    import torch

    return torch.randint(4, vocab, (BATCH, length))


def _pixels(size: int = 32, channels: int = 3) -> Any:
    import torch

    return torch.randn(BATCH, channels, size, size)


def _labels(classes: int = 10) -> Any:
    import torch

    return torch.randint(0, classes, (BATCH,))


_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=512, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                pad_token_id=0)


def gpt2() -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=512, bos_token_id=1, eos_token_id=2)
    ids = _ids(512)
    return GPT2LMHeadModel(cfg), {"input_ids": ids, "labels": ids}, _hf_loss


def llama() -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    ids = _ids(512)
    return LlamaForCausalLM(LlamaConfig(**_DECODER)), {"input_ids": ids, "labels": ids}, _hf_loss


def mistral() -> Built:
    from transformers import MistralConfig, MistralForCausalLM

    ids = _ids(512)
    return MistralForCausalLM(MistralConfig(**_DECODER, sliding_window=8)), {"input_ids": ids, "labels": ids}, _hf_loss


def mixtral() -> Built:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(**_DECODER, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01,
                        output_router_logits=True)
    ids = _ids(512)
    return MixtralForCausalLM(cfg), {"input_ids": ids, "labels": ids}, _hf_loss


def bert() -> Built:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64)
    ids = _ids(512)
    labels = torch.where(torch.rand(ids.shape) < 0.15, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]  # at least one masked position per row
    return BertForMaskedLM(cfg), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}, _hf_loss


def deberta_v2() -> Built:
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    cfg = DebertaV2Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=64, relative_attention=True,
                          pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=32, num_labels=3)
    return DebertaV2ForSequenceClassification(cfg), {"input_ids": _ids(512), "labels": _labels(3)}, _hf_loss


def t5() -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(cfg), {"input_ids": _ids(512), "labels": _ids(512, 8)}, _hf_loss


def whisper() -> Built:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(vocab_size=512, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                        max_source_positions=32, max_target_positions=32, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None)
    features = torch.randn(BATCH, 16, 64)  # (batch, mel bins, 2 * max_source_positions frames)
    return WhisperForConditionalGeneration(cfg), {"input_features": features, "labels": _ids(512, 8)}, _hf_loss


def wav2vec2() -> Built:
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.0,
                         pad_token_id=0, ctc_loss_reduction="mean")
    audio = torch.randn(BATCH, 1600)  # 79 frames after the feature encoder
    return Wav2Vec2ForCTC(cfg), {"input_values": audio, "labels": torch.randint(1, 32, (BATCH, 10))}, _hf_loss


def vit() -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, num_labels=10)
    return ViTForImageClassification(cfg), {"pixel_values": _pixels(), "labels": _labels()}, _hf_loss


def swin() -> Built:
    from transformers import SwinConfig, SwinForImageClassification

    cfg = SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
                     num_labels=10)
    return SwinForImageClassification(cfg), {"pixel_values": _pixels(), "labels": _labels()}, _hf_loss


def clip() -> Built:
    from transformers import CLIPConfig, CLIPModel

    text = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=32, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    vision = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2)
    cfg = CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
    return CLIPModel(cfg), {"input_ids": _ids(512), "pixel_values": _pixels(), "return_loss": True}, _hf_loss


def resnet() -> Built:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64], depths=[1, 1, 1], layer_type="basic",
                       num_labels=10)
    return ResNetForImageClassification(cfg), {"pixel_values": _pixels(), "labels": _labels()}, _hf_loss


def resnet18() -> Built:
    """resnet-18's layout (basic blocks, depths 2-2-2-2, widths 64-512) in transformers' ResNet: timm's resnet18
    needs torchvision, which does not import beside the CPU torch wheel here."""
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic",
                       num_labels=10)
    return ResNetForImageClassification(cfg), {"pixel_values": _pixels(64), "labels": _labels()}, _hf_loss


def convnext() -> Built:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    cfg = ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32, num_labels=10)
    return ConvNextForImageClassification(cfg), {"pixel_values": _pixels(), "labels": _labels()}, _hf_loss


def mobilenet_v2() -> Built:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    cfg = MobileNetV2Config(depth_multiplier=0.35, image_size=32, num_labels=10)
    return MobileNetV2ForImageClassification(cfg), {"pixel_values": _pixels(), "labels": _labels()}, _hf_loss


def _mse_to_noise(model: Any, batch: dict[str, Any]) -> Any:
    import torch.nn.functional as F  # noqa: N812

    inputs = {k: v for k, v in batch.items() if k != "noise"}
    return F.mse_loss(model(**inputs).sample, batch["noise"])


def _noised(latents: Any) -> tuple[Any, Any, Any]:
    """A DDPM-style training input: noisy latents, the noise to predict, integer timesteps."""
    import torch

    noise = torch.randn_like(latents)
    timesteps = torch.randint(0, 1000, (latents.shape[0],))
    return latents * 0.9 + noise * 0.4, noise, timesteps


def unet2d() -> Built:
    from diffusers import UNet2DModel

    model = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8)
    x, noise, t = _noised(_pixels(16))
    return model, {"sample": x, "timestep": t, "noise": noise}, _mse_to_noise


def unet2d_condition() -> Built:
    import torch
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                 block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                 norm_num_groups=8, attention_head_dim=8)
    x, noise, t = _noised(_pixels(16, 4))
    text = torch.randn(BATCH, 8, 32)
    return model, {"sample": x, "timestep": t, "encoder_hidden_states": text, "noise": noise}, _mse_to_noise


def _vae_loss(model: Any, batch: dict[str, Any]) -> Any:
    import torch.nn.functional as F  # noqa: N812

    posterior = model.encode(batch["sample"]).latent_dist
    recon = model.decode(posterior.sample()).sample  # diffusers draws this noise on the CPU for `neuron`
    return F.mse_loss(recon, batch["sample"]) + 1e-6 * posterior.kl().mean()


def autoencoder_kl() -> Built:
    from diffusers import AutoencoderKL

    model = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(16, 32),
                          down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                          latent_channels=4, norm_num_groups=8, sample_size=32)
    return model, {"sample": _pixels(32)}, _vae_loss


def flux_transformer() -> Built:
    import torch
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
    side, text_len = 4, 8
    x, noise, _ = _noised(torch.randn(BATCH, side * side, 16))
    grid = torch.arange(float(side))
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), grid, grid, indexing="ij"), -1)  # (0, row, column)
    batch = {"hidden_states": x, "noise": noise, "encoder_hidden_states": torch.randn(BATCH, text_len, 32),
             "pooled_projections": torch.randn(BATCH, 32), "timestep": torch.rand(BATCH),
             "img_ids": img_ids.reshape(-1, 3), "txt_ids": torch.zeros(text_len, 3)}
    return model, batch, _mse_to_noise


def _timm(name: str, **kwargs: Any) -> Callable[[], Built]:
    def build() -> Built:
        import timm
        import torch.nn.functional as F  # noqa: N812

        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        size = kwargs.get("img_size", 64)
        return model, {"x": _pixels(size), "y": _labels()}, lambda m, b: F.cross_entropy(m(b["x"]), b["y"])

    build.__name__ = name
    return build


ZOO: dict[str, tuple[str, Callable[[], Built]]] = {
    "gpt2": ("transformers", gpt2),
    "llama": ("transformers", llama),
    "mistral": ("transformers", mistral),
    "mixtral": ("transformers", mixtral),
    "bert": ("transformers", bert),
    "deberta-v2": ("transformers", deberta_v2),
    "t5": ("transformers", t5),
    "whisper": ("transformers", whisper),
    "wav2vec2-ctc": ("transformers", wav2vec2),
    "vit": ("transformers", vit),
    "swin": ("transformers", swin),
    "clip": ("transformers", clip),
    "resnet": ("transformers", resnet),
    "resnet18": ("transformers", resnet18),
    "convnext": ("transformers", convnext),
    "mobilenet-v2": ("transformers", mobilenet_v2),
    "timm-resnet18": ("timm", _timm("resnet18")),
    "timm-vit-tiny": ("timm", _timm("vit_tiny_patch16_224", img_size=64)),
    "timm-convnext-atto": ("timm", _timm("convnext_atto")),
    "timm-efficientnet-b0": ("timm", _timm("efficientnet_b0")),
    "timm-mobilenetv3": ("timm", _timm("mobilenetv3_small_050")),
    "unet2d": ("diffusers", unet2d),
    "unet2d-condition": ("diffusers", unet2d_condition),
    "autoencoder-kl": ("diffusers", autoencoder_kl),
    "flux-transformer": ("diffusers", flux_transformer),
}


# --- the child: one model, one coverage, one tracked step ------------------------------------------------------------

def _first_line(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    text = text if len(text) <= 200 else text[:199] + "…"
    return f"{type(e).__name__}: {text}".rstrip(": ")


def _base(op: str) -> str:
    """``aten::_foreach_add_.Scalar`` -> ``_foreach_add_``: the op as coverages name it, less the namespace."""
    return op.removeprefix("aten::").split(".")[0]


def child(name: str, warmup: int) -> dict[str, Any]:
    library, build = ZOO[name]
    out: dict[str, Any] = {"model": name, "library": library, "coverage": os.environ.get("NEURON_LAB_COVERAGE")}
    phase = "import"
    try:
        import torch

        import neuron_lab
        from neuron_lab.kinds import ABORT

        backend = neuron_lab.backend.active()
        coverage = getattr(backend, "coverage", None)
        out["coverage"] = getattr(coverage, "name", out["coverage"])
        out["backend"] = backend.description
        phase = "build"
        torch.manual_seed(0)
        model, batch, loss_fn = build()
        out["arch"] = type(model).__name__
        out["params"] = sum(p.numel() for p in model.parameters())
        phase = "to(neuron)"
        model = model.to("neuron").train()
        batch = {k: v.to("neuron") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> Any:
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        phase = "warmup"
        for _ in range(warmup):
            step()
        phase = "step"
        t0 = time.perf_counter()
        with neuron_lab.track(callsites=False) as report:
            loss = step()
        out["step_s"] = round(time.perf_counter() - t0, 3)
        out["loss"] = float(loss.cpu())
        out["ops"] = report.ops
        rows = report.fallbacks + [r for r in report.ops_not_native if r.kind == "possible"]
        out["fallbacks"] = [{"op": r.op, "kind": r.kind, "count": r.count} for r in rows]
        out["downcasts"] = [{"op": r.op, "count": r.count} for r in report.downcasts]
        out["aborts"] = [{"op": r.op, "count": r.count} for r in report.ops_not_native if r.kind == ABORT]
    except Exception as e:  # the parent lists the model with its error
        out["error"] = f"{phase}: {_first_line(e)}"
    return out


# --- the parent: children per (model, coverage), the table ----------------------------------------------------------

def run_one(name: str, coverage: str, timeout: float, warmup: int) -> dict[str, Any]:
    env = dict(os.environ, NEURON_LAB_COVERAGE=coverage, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--warmup", str(warmup)]
    t0 = time.perf_counter()
    base = {"model": name, "library": ZOO[name][0], "coverage": coverage}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timeout: no result within {timeout:g} s", "wall_s": round(timeout, 1)}
    wall = round(time.perf_counter() - t0, 2)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return {**json.loads(line[len(MARK):]), "wall_s": wall}
    last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), f"exit status {proc.returncode}")
    return {**base, "error": f"child died: {last.strip()[:200]}", "wall_s": wall}


def fallback_counts(result: dict[str, Any]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for row in result.get("fallbacks", []):
        counts[_base(row["op"]) + {"host": "†", "possible": "?"}.get(row["kind"], "")] += row["count"]
    return counts


def _cell(result: dict[str, Any] | None, common: frozenset[str] = frozenset()) -> str:
    """``**n**: names``: n distinct fallback ops; those in ``common`` (every model's) are folded into one mention."""
    if result is None:
        return "–"
    if "error" in result:
        return "**failed**"
    counts = fallback_counts(result)
    if not counts:
        return "0"
    folded = sorted(common & set(counts))
    ranked = sorted(((op, n) for op, n in counts.items() if op not in common), key=lambda kv: (-kv[1], kv[0]))
    shown = ranked if len(ranked) <= LIST_ALL else ranked[:TOP]
    parts = [f"the {len(folded)} common ‡"] if len(folded) > 1 else [f"`{op}` ×{counts[op]}" for op in folded]
    parts += [f"`{op}` ×{n}" for op, n in shown]
    more = f", … +{len(ranked) - len(shown)} more" if len(shown) < len(ranked) else ""
    aborts = sorted({_base(a["op"]) for a in result.get("aborts", [])})
    risk = "; **may abort** on a parameter: " + ", ".join(f"`{op}`" for op in aborts) if aborts else ""
    return f"**{len(counts)}**: " + ", ".join(parts) + more + risk


def _params(n: int | None) -> str:
    if n is None:
        return "–"
    return f"{n / 1e6:.2f} M" if n >= 1e5 else f"{n / 1e3:.1f} k"


def table(results: list[dict[str, Any]], coverages: list[str], models: list[str]) -> str:
    by = {(r["model"], r["coverage"]): r for r in results}
    common: dict[str, frozenset[str]] = {}
    summary = []
    for p in coverages:
        ok = [by[(m, p)] for m in models if (m, p) in by and "error" not in by[(m, p)]]
        if not ok:
            continue
        sets = [set(fallback_counts(r)) for r in ok]
        union, shared = set().union(*sets), frozenset(set.intersection(*sets))
        common[p] = shared if len(ok) > 1 else frozenset()
        summary.append(f"- {p}: {len(union)} distinct fallback ops across {len(ok)} models; in every model "
                       f"({len(shared)}{' ‡' if len(shared) > 1 and len(ok) > 1 else ''}): "
                       + (", ".join(f"`{o}`" for o in sorted(shared)) or "none"))
    head = ["model", "library", "params", "ops per step"] + [f"fallback ops under {p}" for p in coverages]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    errors = []
    for m in models:
        rs = [by.get((m, p)) for p in coverages]
        ok = [r for r in rs if r is not None and "error" not in r]
        params = next((r.get("params") for r in rs if r and r.get("params") is not None), None)
        ops = sorted({r["ops"] for r in ok})
        ops_cell = " / ".join(str(o) for o in ops) if ops else "–"
        arch = next((r["arch"] for r in rs if r and r.get("arch")), None)
        label = f"{m} (`{arch}`)" if arch else m
        cells = [_cell(r, common.get(p, frozenset())) for p, r in zip(coverages, rs)]
        lines.append("| " + " | ".join([label, ZOO[m][0], _params(params), ops_cell] + cells) + " |")
        failed = {p: r["error"] for p, r in zip(coverages, rs) if r and "error" in r}
        if failed and len(set(failed.values())) == 1 and len(failed) == len(coverages) > 1:
            errors.append(f"- {m} (every coverage): {next(iter(failed.values()))}")
        else:
            errors += [f"- {m} under {p}: {e}" for p, e in failed.items()]
    out = "\n".join(lines)
    if summary:
        out += "\n\n" + "\n".join(summary)
    if errors:
        out += "\n\nFailed:\n" + "\n".join(errors)
    return (out + "\n\n**n**: distinct ops (overloads merged) that ran on the CPU; ×n: their calls in the step; "
            "† a host op (TorchNeuron runs it on the CPU by design); ? an op that may fall back (``possible``: "
            "evidence short of TorchNeuron's documentation); ‡ the ops that fall back in every model under "
            "that coverage, listed above.\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coverage", default=",".join(COVERAGES), help="comma-separated coverage names or paths")
    ap.add_argument("--models", default="", help="comma-separated model names (default: the whole zoo)")
    ap.add_argument("--json", metavar="OUT", help="write the raw per-(model, coverage) results here")
    ap.add_argument("--table", metavar="OUT", help="also write the Markdown table here")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per (model, coverage) child")
    ap.add_argument("--warmup", type=int, default=0, help="untracked steps before the tracked one")
    ap.add_argument("--list", action="store_true", help="print the zoo's model names and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(MARK + json.dumps(child(args.child, args.warmup)), flush=True)
        return 0
    if args.list:
        print("\n".join(f"{m} ({lib})" for m, (lib, _) in ZOO.items()))
        return 0
    models = [m for m in args.models.split(",") if m] or list(ZOO)
    unknown = [m for m in models if m not in ZOO]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; --list shows the zoo")
    coverages = [p for p in args.coverage.split(",") if p]
    results = []
    t0 = time.perf_counter()
    for m in models:
        for p in coverages:
            r = run_one(m, p, args.timeout, args.warmup)
            status = r.get("error") or f"{r['ops']} ops, {len(fallback_counts(r))} fallback ops, step {r['step_s']} s"
            print(f"[{time.perf_counter() - t0:6.1f} s] {m} / {p}: {status}", file=sys.stderr, flush=True)
            results.append(r)
    total = time.perf_counter() - t0
    text = table(results, coverages, models) + f"\nTotal wall time: {total:.0f} s ({len(results)} child processes).\n"
    print(text)
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        meta = {"coverages": coverages, "models": models, "warmup": args.warmup, "total_wall_s": round(total, 1),
                "python": sys.version.split()[0]}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
