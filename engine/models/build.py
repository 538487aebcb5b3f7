"""Model construction: weights from a fixed seed, or from a safetensors checkpoint."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from engine.errors import UserError
from engine.models.code2wav import CodecDecoder
from engine.models.layers import DecoderLayer
from engine.models.talker import CodePredictor, Talker
from engine.models.presets import CODEBOOK_SIZE, CODEBOOKS, PRESETS, Preset

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Models:
    preset: Preset
    talker: Talker
    code_predictor: CodePredictor
    codec: CodecDecoder
    synthetic: bool   # seeded weights: the output length comes from the text


class CheckpointError(UserError, ValueError):
    pass


def build_models(preset: str = "tiny", seed: int = 0, checkpoint: str | None = None,
                 dtype: str = "float32", device: str = "cpu", parts=("talker", "codec")) -> Models:
    """Build the stage models.  `parts` lets each stage process build only what it runs.

    Weights are drawn on the CPU from `seed` (one offset per module), so every part is
    the same whichever parts are built and on whatever device they then run.
    """
    shape = PRESETS[preset]
    makers = {"talker": lambda: Talker(shape.talker),
              "code_predictor": lambda: CodePredictor(shape.code_predictor, shape.talker.hidden),
              "codec": lambda: CodecDecoder(shape.codec)}
    wanted = [name for name in makers if name in parts or (name == "code_predictor" and "talker" in parts)]
    built = {}
    for offset, name in enumerate(makers):
        if name not in wanted:
            continue
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1000 + offset)
            built[name] = makers[name]()
    with torch.no_grad():
        # Random init gives the talker near-uniform logits; widen them so sampling has a shape.
        if "talker" in built:
            built["talker"].codec_head.weight.mul_(8.0)
        if "codec" in built:
            speech_level(built["codec"])
    synthetic = True
    if checkpoint:
        synthetic = load_checkpoint(checkpoint, built)
    for m in built.values():
        for layer in m.modules():
            if isinstance(layer, DecoderLayer):   # the same model: see RMSNorm.fold_into
                layer.fold_norms()
        m.to(device=device, dtype=DTYPES[dtype]).eval().requires_grad_(False)
    return Models(shape, built.get("talker"), built.get("code_predictor"), built.get("codec"), synthetic)


def speech_level(codec: CodecDecoder, rms: float = 0.15) -> None:
    """Scale seeded weights' output conv so the audio has a speech-like level, measured on a probe
    decode (the level reaching it differs by orders of magnitude between presets), and make each tap
    set sum to zero so the output carries no DC offset."""
    conv = codec.out.conv
    conv.weight.sub_(conv.weight.mean(-1, keepdim=True))
    conv.bias.zero_()
    levels = []
    hook = codec.out.register_forward_hook(lambda module, args, out: levels.append(out.pow(2).mean().sqrt()))
    try:
        codec(torch.randint(0, CODEBOOK_SIZE, (1, 8, CODEBOOKS), generator=torch.Generator().manual_seed(0)))
    finally:
        hook.remove()
    conv.weight.mul_(rms / levels[0])


def save_checkpoint(models: Models, path: str | Path) -> None:
    tensors = {}
    modules = {"talker": models.talker, "code_predictor": models.code_predictor, "codec": models.codec}
    for prefix, module in modules.items():
        if module is None:
            raise ValueError(f"cannot save a checkpoint without {prefix}; build every part")
        for key, value in module.state_dict().items():
            tensors[f"{prefix}.{key}"] = value.detach().contiguous().cpu()
    save_file(tensors, str(path), metadata={"preset": models.preset.name, "synthetic": str(models.synthetic).lower()})


def load_checkpoint(path: str | Path, modules: dict[str, torch.nn.Module]) -> bool:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    for prefix, module in modules.items():
        own = {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
        try:
            module.load_state_dict(own, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"{path}: weights for {prefix} do not fit preset: {e}") from None
    return meta.get("synthetic", "false") == "true"
