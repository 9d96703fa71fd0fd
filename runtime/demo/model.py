"""A tiny vision + audio + text model over packed variable-length sequences.

For tests and the demo only: the runtime never imports it.  Every module works on
sequences packed along dim 0 with their lengths, and attention runs per sequence, so an
item's output does not depend on which other items share its rank: exactly the property
that makes post-balancing leave the gradient unchanged.  Every parameter takes part in
every call, empty input included (a rank holding no item of a stage still runs it), so
FSDP2 and DDP reduce the same gradients on every rank: the runtime's contract for encoders.

    vision: patches (P, patch_dim) -> blocks (bidirectional) -> mean of `pool` patches
            -> projector -> (P / pool, llm_hidden)
    audio:  frames (F, frame_dim) -> stack `stride` frames -> blocks -> projector
            -> (F / stride, llm_hidden)
    llm:    token embedding; causal blocks over the packed LLM sequences -> logits

Every module's forward is the composition of its `segments(lengths)`, single-tensor steps
of a few milliseconds each (a block is its attention and its MLP), so the isolated replay
can time a stage piece by piece (`replay.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _lengths_list(lengths) -> list[int]:
    return [int(length) for length in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]


def compose(segments: list[Callable], x: torch.Tensor) -> torch.Tensor:
    """The segments applied in order: what the module's forward computes."""
    for segment in segments:
        x = segment(x)
    return x


class Block(nn.Module):
    """Pre-norm transformer block; attention stays inside each packed sequence."""

    def __init__(self, hidden: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, lengths) -> torch.Tensor:
        return compose(self.segments(lengths), x)

    def segments(self, lengths) -> list[Callable]:
        """Attention (with its residual), then the MLP (with its residual)."""
        return [partial(self.attend, lengths=lengths), self.feed_forward]

    def attend(self, x: torch.Tensor, lengths) -> torch.Tensor:
        tokens, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(tokens, 3, self.heads, hidden // self.heads).unbind(1)
        sizes = _lengths_list(lengths)
        attended = [F.scaled_dot_product_attention(qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1),
                                                   is_causal=self.causal).transpose(0, 1)
                    for qs, ks, vs in zip(q.split(sizes), k.split(sizes), v.split(sizes)) if qs.shape[0]]
        # no sequence: v's zero rows keep qkv in the graph, so every parameter gets a (zero) gradient
        mixed = torch.cat(attended) if attended else v
        return x + self.out(mixed.reshape(tokens, hidden))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm2(x))


class TinyVisionEncoder(nn.Module):
    """ViT-like: patch embedding, blocks per image, `pool` patches -> one LLM token."""

    def __init__(self, patch_dim: int, hidden: int, llm_hidden: int, layers: int = 2, heads: int = 4, pool: int = 4):
        super().__init__()
        self.pool = pool
        self.embed = nn.Linear(patch_dim, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, causal=False) for _ in range(layers))
        self.projector = nn.Sequential(nn.Linear(hidden, llm_hidden), nn.GELU(), nn.Linear(llm_hidden, llm_hidden))

    def forward(self, patches: torch.Tensor, lengths) -> torch.Tensor:
        return compose(self.segments(lengths), patches)

    def segments(self, lengths) -> list[Callable]:
        return [self.embed, *(segment for block in self.blocks for segment in block.segments(lengths)),
                self.pool_project]

    def pool_project(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(x.reshape(-1, self.pool, x.shape[-1]).mean(dim=1))


class TinyAudioEncoder(nn.Module):
    """Whisper-like in miniature: `stride` frames stacked into one step, blocks per clip."""

    def __init__(self, frame_dim: int, hidden: int, llm_hidden: int, layers: int = 2, heads: int = 4,
                 stride: int = 4):
        super().__init__()
        self.stride = stride
        self.embed = nn.Linear(stride * frame_dim, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, causal=False) for _ in range(layers))
        self.projector = nn.Linear(hidden, llm_hidden)

    def forward(self, frames: torch.Tensor, lengths) -> torch.Tensor:
        return compose(self.segments(lengths), frames)

    def segments(self, lengths) -> list[Callable]:
        steps = [length // self.stride for length in _lengths_list(lengths)]
        return [self.embed_frames, *(segment for block in self.blocks for segment in block.segments(steps)),
                self.projector]

    def embed_frames(self, frames: torch.Tensor) -> torch.Tensor:
        return self.embed(frames.reshape(-1, self.stride * frames.shape[-1]))


class TinyDecoderLM(nn.Module):
    """Decoder-only LM over packed sequences of input embeddings."""

    def __init__(self, vocab: int, hidden: int, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, causal=True) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, embeddings: torch.Tensor, lengths) -> torch.Tensor:
        return compose(self.segments(lengths), embeddings)

    def segments(self, lengths) -> list[Callable]:
        return [*(segment for block in self.blocks for segment in block.segments(lengths)), self.logits]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the tiny model (defaults: the demo's)."""

    vocab: int = 512
    llm_hidden: int = 128
    llm_layers: int = 2
    encoder_hidden: int = 96
    encoder_layers: int = 2
    heads: int = 4
    patch_dim: int = 48
    pool: int = 4
    frame_dim: int = 40
    stride: int = 4


class TinyMultimodalModel(nn.Module):
    """Vision encoder, audio encoder and decoder LLM; `encoders()` maps modality -> module."""

    def __init__(self, config: ModelConfig = ModelConfig()):
        super().__init__()
        self.config = config
        self.vision = TinyVisionEncoder(config.patch_dim, config.encoder_hidden, config.llm_hidden,
                                        config.encoder_layers, config.heads, config.pool)
        self.audio = TinyAudioEncoder(config.frame_dim, config.encoder_hidden, config.llm_hidden,
                                      config.encoder_layers, config.heads, config.stride)
        self.llm = TinyDecoderLM(config.vocab, config.llm_hidden, config.llm_layers, config.heads)

    def encoders(self) -> dict[str, nn.Module]:
        return {"image": self.vision, "audio": self.audio}

    @staticmethod
    def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy summed over positions whose label is not -100."""
        return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
