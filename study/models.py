"""Model and GPU configurations for the simulator, with every assumption written down.

The OrchMLLM paper trains 10B, 18B and 84B vision + audio + text models on H100s but the
summary we have does not give their layer shapes, so these are approximations built from
public models of the right size.  Parameters are counted as L · (4h² + 2h·ffn) + 2 ·
vocab · h (untied embeddings): attention as four h × h matrices (grouped-query attention
is not modelled), a gated SwiGLU MLP of width w as an equivalent two-matrix ffn = 1.5 · w.
For 84b the ffn (36864) is chosen so that a layer has the parameters of a Qwen2-72B layer
(GQA attention + SwiGLU 29568, ≈ 0.87B); the encoder sizes are assumptions (the paper's
encoders are not known to us) that make the totals 10B, 18B and 84B:

| model | LLM (layers, hidden, ffn, vocab)            | vision encoder           | audio encoder            |
|-------|---------------------------------------------|--------------------------|--------------------------|
| 10b   | Llama-3-8B-like: 32, 4096, 21504, 128256    | ViT 0.6B: 32, 1280, 5120 | Whisper-large 0.6B: 32, 1280, 5120 |
| 18b   | Llama-2-13B-like: 40, 5120, 20736, 32000    | ViT 2.5B: 40, 2304, 9216 | 2.5B: 40, 2304, 9216     |
| 84b   | Qwen2-72B-sized: 80, 8192, 36864, 152064    | InternViT-6B-like: 45, 3200, 12800 | 6B: 48, 3200, 12800 |

Compute (FLOPs, forward + backward = 3× forward, `CostModel.from_transformer`): the LLM
is causal with packed variable-length sequences (unpadded) plus the LM head 6·h·vocab per
token; the vision encoder runs full attention within each image / tile / frame, packed
(NaViT / Qwen2-VL style, unpadded); the audio encoder runs full attention within each clip
and pads every clip of a rank's batch to the longest (dynamic padding, padded stage).
The projector from encoder to LLM width is < 1 % of encoder FLOPs and is left out.

Bytes: raw image input 14·14·3 bf16 values per patch (1176 B); raw audio input 2 mel
frames · 128 bins bf16 per encoder position (512 B); text 8 B per token (int32 id + int32
label); one embedding is h_LLM bf16 values.

GPU (`GPUS`): H100 SXM, 989 TFLOP/s dense bf16, 80 GiB HBM.  Training setup assumed for
every strategy: ZeRO-3 / FSDP full sharding over all data-parallel ranks (one rank per
GPU), full activation recomputation per layer, flash attention, chunked cross-entropy.
- kernel efficiency 0.55: fraction of peak reached while a rank computes (large-scale
  Megatron-LM / MegaScale runs report 50–60 % hardware FLOPs utilisation); recomputation
  makes the hardware run 4 forward passes for the 3 counted in model FLOPs.
- memory per rank = static + Σ_stages stored activations + the largest one-layer
  working set + exchange buffers, where static = 16 B/param / D (bf16 param and grad,
  fp32 master, Adam m and v) + 3 · 2 B · largest layer (two gathered layers and one
  unsharded gradient) + 4 GiB (CUDA context, NCCL buffers, allocator fragmentation);
  stored activations = L · 2h bytes per token held (each layer's bf16 input, kept from
  the forward until that stage's backward); working set = 34 · h bytes per token of the
  layer being recomputed (Korthikanti et al. 2022, without the s² term thanks to flash
  attention).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..balancers import CostModel
from ..orchestrator.stages import LLM, Stage

GIB = 2**30
OPTIMIZER_BYTES_PER_PARAM = 16.0  # bf16 param and grad, fp32 master, Adam m and v
STATIC_RESERVE_BYTES = 4 * GIB  # CUDA context, NCCL buffers, allocator fragmentation


@dataclass(frozen=True)
class GPU:
    """Peak dense bf16 FLOP/s, memory, and the fraction of peak kernels reach."""

    name: str
    peak_flops: float
    memory_bytes: float
    kernel_efficiency: float = 0.55


GPUS = {"h100": GPU("H100 SXM", 989e12, 80 * GIB), "a100": GPU("A100 SXM", 312e12, 80 * GIB)}


@dataclass(frozen=True)
class Transformer:
    """A transformer stack: layers, hidden size, (two-matrix equivalent) ffn width, vocabulary."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    vocab_size: int = 0

    @property
    def layer_params(self) -> int:
        h = self.hidden_size
        return 4 * h * h + 2 * h * self.ffn_hidden_size

    @property
    def params(self) -> int:
        """Layers plus input and output embeddings (untied)."""
        return self.num_layers * self.layer_params + 2 * self.vocab_size * self.hidden_size

    def cost(self, causal: bool) -> CostModel:
        """FLOPs of forward + backward over one sequence, LM head included when vocab_size > 0."""
        base = CostModel.from_transformer(num_layers=self.num_layers, hidden_size=self.hidden_size,
                                          ffn_hidden_size=self.ffn_hidden_size, causal=causal)
        return CostModel(linear=base.linear + 6.0 * self.hidden_size * self.vocab_size, quadratic=base.quadratic)

    @property
    def stored_bytes_per_token(self) -> float:
        """bf16 input of every layer, kept for recomputation."""
        return float(self.num_layers * 2 * self.hidden_size)

    @property
    def working_bytes_per_token(self) -> float:
        """Activations of one layer being recomputed (34·h bytes per token, flash attention)."""
        return float(34 * self.hidden_size)


@dataclass(frozen=True)
class Encoder:
    """A modality encoder: its transformer, padded or packed, raw input bytes per unit, algorithm."""

    modality: str
    transformer: Transformer
    padded: bool
    input_bytes_per_unit: float
    algorithm: str


@dataclass(frozen=True)
class ModelConfig:
    """An LLM with its modality encoders (see the module docstring for the assumptions)."""

    name: str
    llm: Transformer
    encoders: tuple[Encoder, ...]
    text_bytes_per_token: float = 8.0
    llm_algorithm: str = "lpt"

    @property
    def params(self) -> int:
        return self.llm.params + sum(encoder.transformer.params for encoder in self.encoders)

    def static_bytes(self, num_ranks: int) -> float:
        """Memory a rank holds whatever it runs: its ZeRO-3 shard of the training state, two gathered
        layers and one unsharded gradient of the largest layer, and the fixed reserve."""
        largest = max(t.layer_params for t in (self.llm, *(e.transformer for e in self.encoders)))
        return self.params * OPTIMIZER_BYTES_PER_PARAM / num_ranks + 3 * 2.0 * largest + STATIC_RESERVE_BYTES

    def transformer_of(self, stage: Stage) -> Transformer:
        if stage.is_llm:
            return self.llm
        for encoder in self.encoders:
            if encoder.modality == stage.modality:
                return encoder.transformer
        raise ValueError(f"model {self.name!r} has no encoder for modality {stage.modality!r}")

    def stages(self) -> tuple[Stage, ...]:
        """The default stage set: one stage per encoder, then the LLM; costs in FLOPs."""
        embedding_bytes = 2.0 * self.llm.hidden_size
        encoders = tuple(Stage(f"{e.modality} encoder", e.modality, e.transformer.cost(causal=False),
                               padded=e.padded, algorithm=e.algorithm, input_bytes_per_unit=e.input_bytes_per_unit,
                               output_bytes_per_token=embedding_bytes) for e in self.encoders)
        return encoders + (Stage("llm", LLM, self.llm.cost(causal=True), algorithm=self.llm_algorithm,
                                 input_bytes_per_unit=self.text_bytes_per_token),)


def _vision(layers: int, hidden: int, ffn: int) -> Encoder:
    return Encoder("image", Transformer(layers, hidden, ffn), padded=False, input_bytes_per_unit=14 * 14 * 3 * 2,
                   algorithm="lpt")


def _audio(layers: int, hidden: int, ffn: int) -> Encoder:
    return Encoder("audio", Transformer(layers, hidden, ffn), padded=True, input_bytes_per_unit=2 * 128 * 2,
                   algorithm="padded")


MODELS: dict[str, ModelConfig] = {
    "10b": ModelConfig("10b", Transformer(32, 4096, 21504, 128256), (_vision(32, 1280, 5120), _audio(32, 1280, 5120))),
    "18b": ModelConfig("18b", Transformer(40, 5120, 20736, 32000), (_vision(40, 2304, 9216), _audio(40, 2304, 9216))),
    "84b": ModelConfig("84b", Transformer(80, 8192, 36864, 152064),
                       (_vision(45, 3200, 12800), _audio(48, 3200, 12800))),
}


def list_models() -> dict[str, str]:
    """Model names and a one-line description with parameter counts."""
    return {name: (f"{m.params / 1e9:.1f}B: LLM {m.llm.params / 1e9:.1f}B, "
                   + ", ".join(f"{e.modality} encoder {e.transformer.params / 1e9:.1f}B" for e in m.encoders))
            for name, m in MODELS.items()}


def check_model(model: str) -> None:
    """ValueError naming `model` and the known ones unless it is a key of `MODELS`."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(sorted(MODELS))}")


def default_stages(model: str = "10b") -> tuple[Stage, ...]:
    """The vision + audio + text stage set of `model` (see `MODELS`): FLOPs cost models, packed
    vision encoder balanced by LPT, padded audio encoder balanced exactly ("padded"), LLM by LPT."""
    check_model(model)
    return MODELS[model].stages()
