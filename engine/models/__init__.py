"""Model construction: weights from a fixed seed, or from a safetensors checkpoint."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from engine.models.code2wav import CodecDecoder
from engine.models.talker import CodePredictor, Talker
from engine.presets import PRESETS, Preset

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Models:
    preset: Preset
    talker: Talker
    code_predictor: CodePredictor
    codec: CodecDecoder
    synthetic: bool   # seeded weights: the output length comes from the text


class CheckpointError(ValueError):
    pass


def _build(preset: Preset) -> tuple[Talker, CodePredictor, CodecDecoder]:
    talker = Talker(preset.talker)
    return talker, CodePredictor(preset.code_predictor, preset.talker.hidden), CodecDecoder(preset.codec)


def build_models(preset: str = "tiny", seed: int = 0, checkpoint: str | None = None,
                 dtype: str = "float32", device: str = "cpu", parts=("talker", "codec")) -> Models:
    """Build the stage models.  `parts` lets each stage process build only what it runs."""
    shape = PRESETS[preset]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        talker, cp, codec = _build(shape)
        # Random init gives the talker near-uniform logits; widen them so sampling has a shape.
        # The codec's last conv is scaled so seeded audio has speech-like level, not a DC offset.
        with torch.no_grad():
            talker.codec_head.weight.mul_(8.0)
            w = codec.out.conv.weight
            w.sub_(w.mean(-1, keepdim=True)).mul_(40.0)   # each tap set sums to zero: no DC
            codec.out.conv.bias.zero_()
    synthetic = True
    if checkpoint:
        synthetic = load_checkpoint(checkpoint, talker, cp, codec)
    if "talker" not in parts:
        talker = cp = None
    if "codec" not in parts:
        codec = None
    mods = [m for m in (talker, cp, codec) if m is not None]
    for m in mods:
        m.to(device=device, dtype=DTYPES[dtype]).eval().requires_grad_(False)
    return Models(shape, talker, cp, codec, synthetic)


def _modules(talker, cp, codec):
    return {"talker": talker, "code_predictor": cp, "codec": codec}


def save_checkpoint(models: Models, path: str | Path) -> None:
    tensors = {}
    for prefix, module in _modules(models.talker, models.code_predictor, models.codec).items():
        for key, value in module.state_dict().items():
            tensors[f"{prefix}.{key}"] = value.detach().contiguous().cpu()
    save_file(tensors, str(path), metadata={"preset": models.preset.name, "synthetic": str(models.synthetic).lower()})


def load_checkpoint(path: str | Path, talker, cp, codec) -> bool:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    for prefix, module in _modules(talker, cp, codec).items():
        own = {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
        try:
            module.load_state_dict(own, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"{path}: weights for {prefix} do not fit preset: {e}") from None
    return meta.get("synthetic", "false") == "true"
