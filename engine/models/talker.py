"""Stage 0: the talker and its code predictor.

The talker is an autoregressive decoder over a conditioning prompt.  Each step it
emits the codebook-0 token of one codec frame (or the stop token).  The code
predictor then fills codebooks 1..15 of that frame, one after another, from the
talker's hidden state.  The next talker input is the sum of the frame's 16
codebook embeddings.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.models import tokenizer as tok
from engine.models.layers import Decoder
from engine.models.presets import CODEBOOK_SIZE, CODEBOOKS, CODEC_BOS, CODEC_VOCAB, SAMPLES_PER_FRAME, DecoderShape
from engine.models.upload import upload

MAX_REF_FRAMES = 64


class Talker(nn.Module):
    def __init__(self, shape: DecoderShape):
        super().__init__()
        h = shape.hidden
        self.shape = shape
        self.text_embed = nn.Embedding(tok.TEXT_VOCAB, h)
        self.speaker_embed = nn.Embedding(len(tok.VOICES), h)
        self.language_embed = nn.Embedding(len(tok.LANGUAGES), h)
        self.task_embed = nn.Embedding(len(tok.TASK_TYPES), h)
        self.ref_proj = nn.Linear(257, h)                     # log-magnitude STFT bins of reference audio
        self.codec_embed = nn.Embedding(CODEC_VOCAB, h)       # codebook 0 and specials
        self.residual_embed = nn.Parameter(torch.empty(CODEBOOKS - 1, CODEBOOK_SIZE, h))
        nn.init.normal_(self.residual_embed, std=0.02)
        # where each residual codebook's rows start in residual_embed read as one [15 * 2048, hidden] table
        self.register_buffer("residual_offsets", torch.arange(CODEBOOKS - 1) * CODEBOOK_SIZE, persistent=False)
        self.decoder = Decoder(shape)
        self.codec_head = nn.Linear(h, CODEC_VOCAB, bias=False)

    @torch.no_grad()
    def prompt_embeds(self, req) -> torch.Tensor:
        """[S, hidden] conditioning prompt: task, language, voice/instructions/reference, text, codec BOS."""
        dev = self.codec_head.weight.device
        tables = {"task": self.task_embed, "language": self.language_embed, "voice": self.speaker_embed,
                  "text": self.text_embed, "codec": self.codec_embed}
        parts = [self.ref_proj(upload(x, dev, self.ref_proj.weight.dtype)) if kind == "reference"
                 else tables[kind](upload(torch.tensor(x, dtype=torch.long), dev)) for kind, x in prompt_parts(req)]
        return torch.cat(parts).to(self.codec_head.weight.dtype)

    def frame_embeds(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16] -> [B, hidden]: the next talker input.  The fifteen residual rows are summed in one
        lookup (a gather and an add each were thirty launches of every frame step)."""
        table = self.residual_embed.view(-1, self.residual_embed.shape[-1])
        return self.codec_embed(codes[:, 0]) + F.embedding_bag(codes[:, 1:] + self.residual_offsets, table, mode="sum")

    def forward(self, embeds, positions, cache):
        hidden = self.decoder(embeds, positions, cache)
        return hidden, self.codec_head(hidden)


def prompt_parts(req) -> list[tuple[str, list[int] | torch.Tensor]]:
    """The prompt's layout, one (vocabulary, ids) part after another; a reference clip is its features.

    Both stage-0 backends read this: the built-in talker embeds each part with its own
    table, the vLLM backend maps each part into one token-id space.
    """
    parts: list[tuple[str, list[int] | torch.Tensor]] = [
        ("task", [tok.TASK_TYPES.index(req.task_type)]), ("language", [tok.LANGUAGES.index(req.language.lower())])]
    if req.task_type == "CustomVoice":
        parts.append(("voice", [tok.VOICES.index(req.voice.lower())]))
    elif req.task_type == "VoiceDesign":
        parts.append(("text", [tok.TEXT_INSTRUCT] + tok.encode(req.instructions)))
    else:
        parts.append(("reference", reference_features(req.ref_audio, req.ref_sample_rate)))
        parts.append(("text", [tok.TEXT_REF] + tok.encode(req.ref_text)))
    parts.append(("text", [tok.TEXT_BOS] + tok.encode(req.text) + [tok.TEXT_EOS]))
    parts.append(("codec", [CODEC_BOS]))
    return parts


def reference_features(audio: np.ndarray, sample_rate: int) -> torch.Tensor:
    """One 257-bin log-magnitude vector per 1920-sample hop of the reference, at most MAX_REF_FRAMES."""
    x = torch.as_tensor(np.asarray(audio, dtype=np.float32))
    if sample_rate != 24000:  # linear resample; the reference only conditions the voice
        n = max(1, int(round(len(x) * 24000 / sample_rate)))
        x = torch.nn.functional.interpolate(x[None, None], size=n, mode="linear", align_corners=False)[0, 0]
    if len(x) < 512:
        x = torch.nn.functional.pad(x, (0, 512 - len(x)))
    spec = torch.stft(x, n_fft=512, hop_length=SAMPLES_PER_FRAME, window=torch.hann_window(512),
                      return_complex=True, center=True)
    return torch.log1p(spec.abs()).T[:MAX_REF_FRAMES]


class CodePredictor(nn.Module):
    """Fills codebooks 1..15 of a frame.  Input sequence: [talker hidden, e0(c0), e1(c1), ...]."""

    def __init__(self, shape: DecoderShape, talker_hidden: int):
        super().__init__()
        h = shape.hidden
        self.shape = shape
        self.in_proj = nn.Linear(talker_hidden, h, bias=False)
        self.embed0 = nn.Embedding(CODEC_VOCAB, h)
        self.embeds = nn.Parameter(torch.empty(CODEBOOKS - 2, CODEBOOK_SIZE, h))   # codebooks 1..14 as inputs
        nn.init.normal_(self.embeds, std=0.02)
        self.decoder = Decoder(shape, max_positions=CODEBOOKS)
        self.heads = nn.Parameter(torch.empty(CODEBOOKS - 1, h, CODEBOOK_SIZE))    # one head per codebook 1..15
        nn.init.normal_(self.heads, std=h ** -0.5)

    def embed(self, j: int, codes: torch.Tensor) -> torch.Tensor:
        """Input embedding for position j+1, from the token of codebook j."""
        return self.embed0(codes) if j == 0 else self.embeds[j - 1][codes]

    def logits(self, j: int, hidden_j: torch.Tensor) -> torch.Tensor:
        """Logits of codebook j (1..15) from the hidden state at position j."""
        return hidden_j @ self.heads[j - 1]
