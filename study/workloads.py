"""Synthetic multimodal workloads with documented length distributions, and user workload files.

A workload is a mix of sample kinds with weights; `sample_workload(name, num_ranks,
samples_per_rank, seed)` draws num_ranks · samples_per_rank i.i.d. samples and deals them
to ranks in order (sample i on rank i // samples_per_rank), as random DP sampling does.
Modalities: "image" (vision encoder: images, document tiles, video frames) and "audio".

Sample kinds (encoder units -> LLM tokens; all segments precede the text):
- chat: text only, context + generated tokens of a real conversation request, resampled
  from `data/azure_conv_lengths.csv` (mean 1375, median 1416, p99 4299 tokens).
- code: text only, context + generated tokens of a real coding-assistant request, resampled
  from `data/azure_code_lengths.csv` (mean 2076, median 1486, p99 7461, max 7733 tokens).
- long_tail: text only, a synthetic long-tailed mix: 85 % lognormal (median 512 tokens,
  σ = 1.0), 15 % Pareto (α = 1.1 from 2048 tokens), at least 16 and truncated to an 8k
  context (LONG_TAIL_MAX = 8192 tokens, so any one sample fits the benchmarks' budgets).
- image_qa: one image at dynamic resolution (Qwen2-VL style): height and width
  log-uniform in [224, 1344] px, rounded down to multiples of 28; 14-px patches
  (256..9216 patches), 2×2 patch merge -> patches / 4 tokens.  Text: a prompt uniform in
  [8, 64] tokens + an answer (generated tokens of a real request, median 134).
- document: OCR / document QA with dynamic tiling (InternVL style): 2..12 tiles uniform
  + one thumbnail, each tile a 448-px image = 1024 patches -> 256 tokens.  Text
  log-uniform in [128, 2048] tokens (transcription or dense answer).
- asr: speech recognition, one clip whose duration follows the LibriSpeech
  train-clean-100 (3× speed-perturbed) statistics in shared/data/README.md (p25 11.4,
  p50 13.8, p75 15.3, p99 18.1, max 27.2 s; minimum assumed 1 s), interpolated
  log-linearly between quantiles.  Encoder: 100 mel frames/s, stride-2 conv -> 50
  positions/s (Whisper); 4× pooling -> 12.5 tokens/s.  Text: 16-token prompt +
  3.5 transcript tokens per second (≈2.7 words/s).
- audio_qa: spoken question answering, clip durations from the WenetSpeech L statistics
  (p25 1.4, p50 2.0, p75 3.0, p99 8.4, max 405 s; minimum assumed 0.2 s), cut to the 30 s
  encoder window.  Text: question uniform in [8, 64] + a real answer length.
- video: 8..32 frames uniform, each a 336-px frame = 576 patches -> 144 tokens, one
  vision segment per frame.  Text: prompt uniform in [32, 256] + a real answer length.
- long_video: a long video, 64..512 frames uniform (e.g. 1-8.5 min at 1 frame/s), frames as
  in video (so 9 216..73 728 vision tokens, each frame its own encoder item).  Text as video.
- long_document: a long text document (books, papers, code repositories of long-context
  training): log-uniform in [8k, 128k] tokens (LONG_DOCUMENT_TOKENS; mean ≈ 44k), text only.

The "long" workload is the default mix at 90 % of its weights plus 5 % long videos and 5 %
long documents: the items that may cost more than a rank's share of the step (giant items,
`study.context_parallel_sim`).

The text lengths come from the Azure LLM inference trace (Azure Public Dataset,
CC-BY 4.0): Patel, Choukse, Zhang, Shah, Goiri, Maleki, Bianchini, "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024; see data/README.md.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from ..balancers.validation import is_int, json_value
from ..orchestrator.samples import Batch, Sample, Segment

MODALITIES = ("image", "audio")
IMAGE, AUDIO = 0, 1

# (probability, seconds) knots of the published duration statistics (shared/data/README.md).
LIBRISPEECH_SECONDS = ((0.0, 1.0), (0.25, 11.4), (0.5, 13.8), (0.75, 15.3), (0.99, 18.1), (1.0, 27.2))
WENETSPEECH_SECONDS = ((0.0, 0.2), (0.25, 1.4), (0.5, 2.0), (0.75, 3.0), (0.99, 8.4), (1.0, 405.1))
AUDIO_WINDOW_SECONDS = 30.0
AUDIO_POSITIONS_PER_SECOND = 50
AUDIO_POSITIONS_PER_TOKEN = 4
PATCH_PIXELS = 14
MERGE = 4  # 2×2 patches -> one token
LONG_TAIL_MAX = 8192  # tokens: the long-tailed mix is truncated to an 8k context
LONG_VIDEO_FRAMES = (64, 512)
LONG_DOCUMENT_TOKENS = (8192, 131072)


TRACES = ("conv", "code")  # the Azure LLM inference traces shipped in data/ (samples of 4096 requests)


def trace_table(name: str = "conv") -> np.ndarray:
    """(4096, 2) int64 [context_tokens, generated_tokens] of an Azure LLM inference trace (CC-BY 4.0):
    "conv" (conversation service) or "code" (coding assistant).

    Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting",
    ISCA 2024; Azure Public Dataset.  See data/README.md for the sampling.

    >>> trace_table("code").shape
    (4096, 2)
    """
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; choose one of {list(TRACES)}")
    with resources.files(__package__).joinpath(f"data/azure_{name}_lengths.csv").open("r") as handle:
        return np.loadtxt(handle, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)


def text_length_table() -> np.ndarray:
    """`trace_table("conv")`: the conversation trace that the multimodal kinds draw text from."""
    return trace_table("conv")


def quantile_sample(rng: np.random.Generator, knots, size: int) -> np.ndarray:
    """Draw from the distribution with these (probability, value) knots, log-linear in between."""
    probs = np.array([p for p, _ in knots])
    logs = np.log([v for _, v in knots])
    return np.exp(np.interp(rng.random(size), probs, logs))


class _Kind:
    """Segments of one sample kind: per sample its text and a list of (modality, length, tokens)."""

    def __init__(self, rng: np.random.Generator, table: np.ndarray):
        self.rng, self.table = rng, table

    def answer(self, n: int) -> np.ndarray:
        return self.table[self.rng.integers(0, len(self.table), n), 1]

    def _text_only(self, text):
        return text, np.zeros(text.size, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0)

    def chat(self, n):
        return self._text_only(self.table[self.rng.integers(0, len(self.table), n)].sum(axis=1))

    def code(self, n):
        table = trace_table("code")
        return self._text_only(table[self.rng.integers(0, len(table), n)].sum(axis=1))

    def long_tail(self, n):
        body = np.exp(self.rng.normal(np.log(512), 1.0, n))
        tail = 2048 * (1 - self.rng.random(n)) ** (-1 / 1.1)  # Pareto, α = 1.1, from 2048
        text = np.where(self.rng.random(n) < 0.15, tail, body)
        return self._text_only(np.clip(text, 16, LONG_TAIL_MAX).astype(np.int64))

    def image_qa(self, n):
        side = np.exp(self.rng.uniform(np.log(224), np.log(1344), size=(n, 2)))
        pixels = (side // (2 * PATCH_PIXELS)) * (2 * PATCH_PIXELS)
        patches = ((pixels[:, 0] // PATCH_PIXELS) * (pixels[:, 1] // PATCH_PIXELS)).astype(np.int64)
        text = self.rng.integers(8, 65, n) + self.answer(n)
        return text, np.ones(n, dtype=np.int64), np.full(n, IMAGE), patches, patches // MERGE

    def document(self, n):
        tiles = self.rng.integers(2, 13, n) + 1
        total = int(tiles.sum())
        text = np.exp(self.rng.uniform(np.log(128), np.log(2048), n)).astype(np.int64)
        return text, tiles, np.full(total, IMAGE), np.full(total, 1024), np.full(total, 1024 // MERGE)

    def _audio(self, n, knots):
        seconds = np.minimum(quantile_sample(self.rng, knots, n), AUDIO_WINDOW_SECONDS)
        positions = np.ceil(seconds * AUDIO_POSITIONS_PER_SECOND).astype(np.int64)
        tokens = -(-positions // AUDIO_POSITIONS_PER_TOKEN)
        return seconds, positions, tokens

    def asr(self, n):
        seconds, positions, tokens = self._audio(n, LIBRISPEECH_SECONDS)
        text = 16 + np.ceil(3.5 * seconds).astype(np.int64)
        return text, np.ones(n, dtype=np.int64), np.full(n, AUDIO), positions, tokens

    def audio_qa(self, n):
        _, positions, tokens = self._audio(n, WENETSPEECH_SECONDS)
        text = self.rng.integers(8, 65, n) + self.answer(n)
        return text, np.ones(n, dtype=np.int64), np.full(n, AUDIO), positions, tokens

    def video(self, n, frames=(8, 32)):
        frames = self.rng.integers(frames[0], frames[1] + 1, n)
        total = int(frames.sum())
        text = self.rng.integers(32, 257, n) + self.answer(n)
        return text, frames, np.full(total, IMAGE), np.full(total, 576), np.full(total, 576 // MERGE)

    def long_video(self, n):
        return self.video(n, LONG_VIDEO_FRAMES)

    def long_document(self, n):
        low, high = np.log(LONG_DOCUMENT_TOKENS)
        return self._text_only(np.exp(self.rng.uniform(low, high, n)).astype(np.int64))


KINDS = ("chat", "image_qa", "document", "asr", "audio_qa", "video", "code", "long_tail", "long_video",
         "long_document")
DEFAULT_MIX = {"chat": 0.30, "image_qa": 0.25, "document": 0.10, "video": 0.05, "asr": 0.15, "audio_qa": 0.15}

# name -> (description, {kind: weight})
WORKLOADS: dict[str, tuple[str, dict[str, float]]] = {
    "default": ("tri-modal mix: 30% chat, 25% image QA, 10% documents, 5% video, 15% ASR, 15% audio QA", DEFAULT_MIX),
    "long": ("long content: the default mix at 90% + 5% long videos (64-512 frames) + 5% long documents (8k-128k "
             "tokens)", {**{kind: 0.9 * weight for kind, weight in DEFAULT_MIX.items()}, "long_video": 0.05,
                         "long_document": 0.05}),
    "vision": ("vision + text: 30% chat, 40% image QA, 20% documents, 10% video",
               {"chat": 0.30, "image_qa": 0.40, "document": 0.20, "video": 0.10}),
    "speech": ("audio + text: 30% chat, 35% ASR, 35% audio QA", {"chat": 0.30, "asr": 0.35, "audio_qa": 0.35}),
    **{kind: (f"only {kind} samples (see the module docstring)", {kind: 1.0}) for kind in KINDS},
}


def llm_stage_lengths(num_ranks: int, per_rank: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, sources) of one LLM stage, `per_rank` sequences sampled by every rank: text
    lognormal(6.3, 0.9) + 16 tokens, at most 4096; half with 1-4 image tiles of 576 tokens;
    30 % with up to 30 s of audio at 25 tokens/s (a compact mix for balancer-level tests
    and benchmarks, where `sample_workload` builds whole batches)."""
    rng = np.random.default_rng(seed)
    n = num_ranks * per_rank
    text = np.minimum(np.exp(rng.normal(6.3, 0.9, n)).astype(np.int64) + 16, 4096)
    tiles = rng.integers(1, 5, n) * 576 * (rng.random(n) < 0.5)
    audio = np.minimum(np.exp(rng.normal(2.3, 0.6, n)) * 25, 750).astype(np.int64) * (rng.random(n) < 0.3)
    return text + tiles + audio, np.repeat(np.arange(num_ranks), per_rank)


def list_workloads() -> dict[str, str]:
    """Embedded workload names and their one-line descriptions."""
    return {name: description for name, (description, _) in WORKLOADS.items()}


def check_workload(name: str) -> None:
    """ValueError naming `name` and the embedded workloads unless it is one of them."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(sorted(WORKLOADS))}")


def sample_workload(name: str, num_ranks: int, samples_per_rank: int, seed: int = 0) -> Batch:
    """Draw num_ranks · samples_per_rank samples of workload `name`; sample i sits on rank i // samples_per_rank."""
    check_workload(name)
    for arg, value in (("num_ranks", num_ranks), ("samples_per_rank", samples_per_rank)):
        if not is_int(value) or value < 1:
            raise ValueError(f"`{arg}` must be a positive int; got {value!r}")
    rng = np.random.default_rng(seed)
    kinds_of = _Kind(rng, text_length_table())
    mix = WORKLOADS[name][1]
    names = sorted(mix)
    weights = np.array([mix[k] for k in names])
    n = num_ranks * samples_per_rank
    kind = rng.choice(len(names), size=n, p=weights / weights.sum())
    text = np.zeros(n, dtype=np.int64)
    owners, modality, length, tokens = [], [], [], []
    for code, kind_name in enumerate(names):
        members = np.flatnonzero(kind == code)
        if not members.size:
            continue
        kind_text, per_sample, kind_modality, kind_length, kind_tokens = getattr(kinds_of, kind_name)(members.size)
        text[members] = kind_text
        if kind_modality.size:
            owners.append(np.repeat(members, per_sample))
            modality.append(kind_modality)
            length.append(kind_length)
            tokens.append(kind_tokens)
    if owners:
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        columns = [np.concatenate(c).astype(np.int64)[order] for c in (modality, length, tokens)]
        owner = owner[order]
    else:
        owner, columns = np.zeros(0, dtype=np.int64), [np.zeros(0, dtype=np.int64)] * 3
    return Batch.from_arrays(num_ranks=num_ranks, modalities=MODALITIES, sample_text=text,
                             sample_source=np.arange(n) // samples_per_rank, segment_sample=owner,
                             segment_modality=columns[0], segment_length=columns[1], segment_tokens=columns[2])


def _field(line: int, where: str, record: dict, key: str, required: bool = True):
    if key not in record:
        if required:
            raise ValueError(f"line {line}: {where} needs the key {key!r}")
        return None
    value = record[key]
    if not is_int(value) or value < 0:
        raise ValueError(f"line {line}: {where} {key!r} must be a non-negative integer; got {value!r}")
    if value >= 2**53:  # token counts sum exactly in float64 costs and int64 arrays
        raise ValueError(f"line {line}: {where} {key!r} must be below 2**53; got {value}")
    return value


def parse_sample_line(text: str, line: int, source: int, sample_id: int, modalities=None) -> Sample:
    """One JSON-lines record -> Sample; every error names `line`.

    With `modalities` (the names a model's encoders take), a segment of any other
    modality is an error: no stage would balance it.

    >>> parse_sample_line('{"text": 7, "segments": [{"modality": "video", "length": 8, "tokens": 2}]}', 3, 0, 0,
    ...                   modalities=["image", "audio"])
    Traceback (most recent call last):
    ...
    ValueError: line 3: segment 0 has modality 'video', which no stage encodes; stages encode ['audio', 'image']
    """
    record = json_value(text, f"line {line}")
    if not isinstance(record, dict):
        raise ValueError(f"line {line}: expected a JSON object like {{\"text\": 212, \"segments\": [...]}}")
    unknown = sorted(set(record) - {"text", "segments"})
    if unknown:
        raise ValueError(f"line {line}: unknown key {unknown[0]!r}; a sample has 'text' and 'segments'")
    segments_in = record.get("segments", [])
    if not isinstance(segments_in, list):
        raise ValueError(f"line {line}: 'segments' must be a list")
    segments = []
    for j, entry in enumerate(segments_in):
        where = f"segment {j}"
        if not isinstance(entry, dict):
            raise ValueError(f"line {line}: {where} must be an object with modality, length, tokens")
        extra = sorted(set(entry) - {"modality", "length", "tokens", "position"})
        if extra:
            raise ValueError(f"line {line}: {where} has unknown key {extra[0]!r}")
        modality = entry.get("modality")
        if not isinstance(modality, str) or not modality or modality == "llm":
            raise ValueError(f"line {line}: {where} needs a 'modality' name (a non-empty string other than 'llm')")
        if modalities is not None and modality not in modalities:
            raise ValueError(f"line {line}: {where} has modality {modality!r}, which no stage encodes; "
                             f"stages encode {sorted(modalities)}")
        segments.append(Segment(modality, _field(line, where, entry, "length"), _field(line, where, entry, "tokens"),
                                _field(line, where, entry, "position", required=False)))
    text_tokens = _field(line, "the sample", record, "text")
    try:
        return Sample(text_tokens, tuple(segments), source=source, id=sample_id)
    except ValueError as error:
        raise ValueError(f"line {line}: {error}") from None


def _read_samples(path, samples_per_rank: int, modalities=None) -> list[Sample]:
    """Every sample of a JSON-lines file, each line validated; sample i on rank i // samples_per_rank."""
    samples = []
    with open(path, encoding="utf-8-sig") as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                index = len(samples)
                samples.append(parse_sample_line(text, number, index // samples_per_rank, index, modalities))
    return samples


def check_workload_file(path, modalities=None) -> int:
    """Validate every line of a JSON-lines workload file; return its number of samples.

    `modalities`, when given, are the only segment modalities allowed (see
    `parse_sample_line`).  Raises ValueError naming the first bad line, or saying that no
    sample holds a token.
    """
    samples = _read_samples(path, 1, modalities)
    if samples and not any(sample.text or sample.segments for sample in samples):
        raise ValueError(f"workload file {path}: none of its {len(samples)} samples holds a token (text 0, no "
                         f"segments): there is no work to balance")
    return len(samples)


def load_workload_file(path, samples_per_rank: int, num_ranks: int) -> Batch:
    """Read JSON lines, one sample per line, and deal them to ranks in file order.

    Line format: {"text": 212, "segments": [{"modality": "image", "length": 1024,
    "tokens": 256}, {"modality": "audio", "length": 1500, "tokens": 375, "position": 40}]}.
    `position` is optional (default: right after the previous segment, so segments sit in
    order before the text).  Blank lines are skipped.  The first num_ranks ·
    samples_per_rank samples are used, samples_per_rank per rank; fewer is an error.
    Every line is validated, used or not: malformed lines raise ValueError naming the
    line number.
    """
    for arg, value in (("num_ranks", num_ranks), ("samples_per_rank", samples_per_rank)):
        if not is_int(value) or value < 1:
            raise ValueError(f"`{arg}` must be a positive int; got {value!r}")
    needed = num_ranks * samples_per_rank
    samples = _read_samples(path, samples_per_rank)
    if len(samples) < needed:
        raise ValueError(f"workload file {path} has {len(samples)} samples; {num_ranks} ranks × "
                         f"{samples_per_rank} samples per rank need {needed}")
    return Batch.from_samples(samples[:needed], num_ranks)
