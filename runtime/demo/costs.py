"""The demo's stage cost models: FLOP formulas, or the dataset's own batches timed in isolation.

Timed models are fitted on rank 0 from rank-sized packed batches of each stage, timed the way
the isolated replay times recorded work (`replay.py`), and broadcast, so every rank plans with
the same numbers and the plan is balanced by the clock of the figures that check it.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...balancers import CostModel
from .calibration import fit_packed_cost
from .data import SyntheticMultimodal
from .model import ModelConfig, TinyMultimodalModel
from .replay import StageWork, on_rank_zero, replay_local, run_stage


def busy_clock(device: torch.device):
    """CPU time of this thread on CPU; synchronised wall time on CUDA."""
    if device.type == "cuda":
        def clock():
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return clock
    return time.thread_time


def flops_costs(config: ModelConfig) -> dict:
    """Per-stage FLOP cost models of the tiny model, in each stage's length unit."""
    vision = CostModel.from_transformer(num_layers=config.encoder_layers, hidden_size=config.encoder_hidden,
                                        num_heads=config.heads, causal=False)
    audio = CostModel.from_transformer(num_layers=config.encoder_layers, hidden_size=config.encoder_hidden,
                                       num_heads=config.heads, causal=False)
    llm = CostModel.from_transformer(num_layers=config.llm_layers, hidden_size=config.llm_hidden,
                                     num_heads=config.heads, causal=True)
    head = 3 * 2 * config.llm_hidden * config.vocab
    return {"image": vision,
            "audio": CostModel(linear=audio.linear / config.stride, quadratic=audio.quadratic / config.stride ** 2),
            "llm": CostModel(linear=llm.linear + head, quadratic=llm.quadratic)}


def _stage_lengths(data: SyntheticMultimodal) -> dict:
    """Item lengths of every stage in 16 rank-batches of the dataset (steps no run uses)."""
    pool = [s for step in range(1000, 1004) for r in range(4) for s in data.samples(step, r)]
    return {"image": [g.length for s in pool for g in s.segments if g.modality == "image"],
            "audio": [g.length for s in pool for g in s.segments if g.modality == "audio"],
            "llm": [s.llm_length for s in pool]}


def stage_work(model: TinyMultimodalModel, stage: str, lengths, dtype: torch.dtype, device: torch.device,
               generator: torch.Generator) -> StageWork:
    """Random inputs of one stage ("image", "audio" or "llm") on a packed batch of the given item lengths.

    >>> work = stage_work(TinyMultimodalModel(ModelConfig()), "llm", [3, 5], torch.float32, torch.device("cpu"),
    ...                   torch.Generator().manual_seed(0))
    >>> work.num_rows, work.lengths.tolist(), work.labels.shape
    (8, [3, 5], torch.Size([8]))
    """
    config, rows = model.config, int(sum(lengths))
    width = {"image": config.patch_dim, "audio": config.frame_dim, "llm": config.llm_hidden}[stage]
    inputs = torch.randn(rows, width, generator=generator, dtype=dtype).to(device)
    labels = (torch.randint(0, config.vocab, (rows,), generator=generator).to(device) if stage == "llm" else None)
    return StageWork(stage, inputs, torch.tensor(list(lengths), dtype=torch.int64), labels)


def calibration_batches(data: SyntheticMultimodal, count: int, seed: int) -> dict:
    """Per stage, `count` packed batches of the dataset's own items, each of a rank's size
    give or take half (a stage's items per rank-batch of `_stage_lengths`): the cost model is
    fitted where the step plans use it.

    >>> batches = calibration_batches(SyntheticMultimodal(ModelConfig(), 4, 0), 3, seed=0)
    >>> sorted(batches), [2 <= len(batch) <= 7 for batch in batches["llm"]]
    (['audio', 'image', 'llm'], [True, True, True])
    """
    rng, lengths = np.random.default_rng(seed), _stage_lengths(data)
    batches = {}
    for name, pool in lengths.items():
        per_rank = len(pool) / 16
        sizes = rng.integers(max(1, round(per_rank / 2)), round(3 * per_rank / 2) + 2, count)
        batches[name] = [sorted(rng.choice(pool, int(size)).tolist()) for size in sizes]
    return batches


def calibrate_in_isolation(model: TinyMultimodalModel, data: SyntheticMultimodal, dtype: torch.dtype,
                           device: torch.device, rank: int, world_size: int, seed: int = 0, batches: int = 12,
                           rounds: int = 3) -> tuple[dict, dict]:
    """Rank 0 times `batches` rank-sized packed batches per stage the way the isolated replay
    times recorded work (`replay.replay_local`: one process, the works of a stage in lockstep
    piece by piece, every batch of a stage in each of `rounds` rounds) while the other ranks
    wait, and fits each stage's cost model on them: the plan is then balanced by the clock of
    the isolated figures that check it, with no contention between ranks in the timings.
    ({modality: CostModel}, {modality: RMS error}) on every rank (a collective over the world)."""
    def fit():
        drawn = calibration_batches(data, batches, seed)
        generator = torch.Generator().manual_seed(seed)
        works = {name: [[stage_work(model, name, lengths, dtype, device, generator)] for lengths in stage_batches]
                 for name, stage_batches in drawn.items()}
        seconds = replay_local(model, works, busy_clock(device), rounds)
        return calibrate({name: (drawn[name], seconds[name]) for name in drawn})

    return on_rank_zero(fit, rank, world_size)


def calibrate(timings: dict) -> tuple[dict, dict]:
    """Fit each stage's cost model: timings[modality] = (list of batch lengths, list of seconds).
    ({modality: CostModel}, {modality: RMS error})."""
    fitted = {name: fit_packed_cost(batches, seconds) for name, (batches, seconds) in timings.items()}
    return {name: fit[0] for name, fit in fitted.items()}, {name: fit[1] for name, fit in fitted.items()}


def warm_up(model: TinyMultimodalModel, data: SyntheticMultimodal, dtype: torch.dtype, device: torch.device) -> None:
    """One forward+backward per stage on a rank-sized batch: first-touch costs (allocator,
    page faults, lazy init) would otherwise land in the first measured step."""
    generator = torch.Generator().manual_seed(0)
    for name, lengths in _stage_lengths(data).items():
        run_stage(model, stage_work(model, name, lengths[: max(1, len(lengths) // 16)], dtype, device, generator))
    model.zero_grad(set_to_none=True)
