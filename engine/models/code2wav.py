"""Stage 1: the codec decoder, frames [T, 16] -> 24 kHz audio [T * 1920].

Everything is causal with a bounded receptive field (CodecShape.receptive_field
frames), so decoding a window with enough left context gives the same samples as
decoding the whole sequence.  That is what lets async_chunk stream.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.kv_cache import CausalView
from engine.models.layers import Decoder
from engine.models.presets import CODEBOOK_SIZE, CODEBOOKS, SAMPLES_PER_FRAME, CodecShape, DecoderShape


class CausalConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int = 3):
        super().__init__()
        self.pad = kernel - 1
        self.conv = nn.Conv1d(cin, cout, kernel)

    def forward(self, x):  # [B, C, T]
        return self.conv(F.pad(x, (self.pad, 0)))


class Upsample(nn.Module):
    """Frame-local transposed conv (kernel == stride) followed by a causal conv."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.up = nn.ConvTranspose1d(cin, cout, rate, stride=rate)
        self.conv = CausalConv(cout, cout)

    def forward(self, x):
        x = F.silu(self.up(x))
        return x + F.silu(self.conv(x))


class CodecDecoder(nn.Module):
    def __init__(self, shape: CodecShape):
        super().__init__()
        h = shape.hidden
        self.shape = shape
        self.embeds = nn.Parameter(torch.empty(CODEBOOKS, CODEBOOK_SIZE, h))
        nn.init.normal_(self.embeds, std=0.5)
        self.pre_conv = CausalConv(h, h)
        head_dim = h // shape.heads
        self.transformer = Decoder(DecoderShape(hidden=h, layers=shape.layers, heads=shape.heads,
                                                kv_heads=shape.heads, head_dim=head_dim,
                                                intermediate=shape.intermediate, rope_theta=10000.0))
        blocks, cin = [], h
        for rate in shape.pre_upsample:
            blocks.append(Upsample(cin, cin, rate))
        for rate, cout in zip(shape.upsample, shape.upsample_channels):
            blocks.append(Upsample(cin, cout, rate))
            cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.out = CausalConv(cin, 1)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor, first_position: int | torch.Tensor = 0) -> torch.Tensor:
        """codes [B, T, 16] -> audio [B, T * 1920]; row b's positions start at first_position (one int, or
        one per row: rotary is relative).  Everything is causal, so frames padded on after a row's end
        change none of its samples."""
        b, t, _ = codes.shape
        if isinstance(first_position, torch.Tensor):
            first_position = first_position.to(codes.device)[:, None]
        x = self.embeds[torch.arange(CODEBOOKS, device=codes.device), codes].sum(2)   # [B, T, h]
        x = x.to(self.pre_conv.conv.weight.dtype)
        x = x + self.pre_conv(x.transpose(1, 2)).transpose(1, 2)
        positions = (torch.arange(t, device=codes.device) + first_position).expand(b, t)
        x = self.transformer(x, positions, CausalView(positions, self.shape.window)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        audio = torch.tanh(self.out(x)[:, 0])
        assert audio.shape[1] == t * SAMPLES_PER_FRAME
        return audio
