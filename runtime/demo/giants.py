"""`orchmllm demo --workload giants`: giant items split over context-parallel groups on real gloo ranks.

Every step each rank samples short image+text items; one rank's batch also holds a giant whose cost
is well above a rank's share of the step, so no permutation balances it (the unsplit plan's bound
is that one item).  The tiny multimodal model (image patches projected, text tokens embedded,
sinusoidal positions of the unsplit item, causal attention blocks through
`context_parallel_attention`, a token head) runs each step, from the same parameters, as:

- the reference: every item whole, unbalanced, in one process (rank 0);
- balanced without splitting: `PostBalancingDispatcher(context_parallel=ContextParallel(degrees=(1,)))`;
- balanced with splitting: the same with the run's degrees; its gradients train the model.

Cost models are timed on rank 0 in isolation and fitted (`calibration.py`): the stage's
f(l) from packed batches, the split efficiency η from shards of the giant at each degree; the
planner then balances the time the isolated replay measures (K/V exchange time is not modelled:
gloo on shared cores says nothing about NVLink).  Busy figures are each rank's forward+backward
replayed on rank 0, one rank at a time, with the K/V exchange skipped (`isolated_attention`:
received rows are zeros, so the compute is the rank's own and no peer is needed).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...balancers import CostModel
from ...balancers.context_parallel import ContextParallel
from .. import context_parallel as cp_module
from ..context_parallel import ContextParallelLayout, SplitItem, context_parallel_attention
from ..dispatcher import PostBalancingDispatcher
from ..launch import spawn
from ..reduction import all_reduce_gradients, normalize_loss
from .calibration import fit_packed_cost, fit_split_efficiency
from .report import max_over_mean, rounding_tolerance

IGNORE = -100
SPLIT_ISOLATED_MARGIN = 0.10  # isolated busy max/mean with splitting at most the certified best + this ...
UNSPLIT_GIANT_FLOOR = 1.5  # ... where the unsplit plan's is at least this (else the workload has no giant)
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class GiantsConfig:
    """The model's sizes and the workload's lengths (small items uniform in `small`, one giant a step)."""

    hidden: int = 32
    heads: int = 4
    layers: int = 2
    vocab: int = 64
    patch_dim: int = 12
    small: tuple[int, int] = (16, 64)
    giant: int = 1536
    samples_per_rank: int = 16


class CausalBlock(nn.Module):
    """Pre-norm block: causal attention over each packed sequence (shards over their whole item), MLP."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, layout: ContextParallelLayout) -> torch.Tensor:
        tokens, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(tokens, 3, self.heads, hidden // self.heads).unbind(1)
        x = x + self.out(context_parallel_attention(q, k, v, layout).reshape(tokens, hidden))
        return x + self.mlp(self.norm2(x))


class GiantsModel(nn.Module):
    """Image patches and text tokens into one packed sequence per item; causal blocks; next-token head."""

    def __init__(self, config: GiantsConfig):
        super().__init__()
        self.embed, self.project = nn.Embedding(config.vocab, config.hidden), nn.Linear(config.patch_dim, config.hidden)
        self.frequency = nn.Parameter(torch.linspace(0.01, 1.0, config.hidden))
        self.blocks = nn.ModuleList(CausalBlock(config.hidden, config.heads) for _ in range(config.layers))
        self.norm, self.head = nn.LayerNorm(config.hidden), nn.Linear(config.hidden, config.vocab)

    def forward(self, data: dict, layout: ContextParallelLayout) -> torch.Tensor:
        """Summed next-token loss of the packed micro-batch `data` laid out as `layout`."""
        x = torch.where(data["image"][:, None], self.project(data["patches"]), self.embed(data["ids"]))
        x = x + torch.sin(layout.positions()[:, None].to(x.dtype) * self.frequency)
        for block in self.blocks:
            x = block(x, layout)
        return F.cross_entropy(self.head(self.norm(x)), data["labels"], ignore_index=IGNORE, reduction="sum")


def sample_items(config: GiantsConfig, step: int, rank: int, world_size: int, seed: int, dtype) -> list[dict]:
    """Rank `rank`'s items of `step` (rank step % world_size also samples the giant): per-token tensors."""
    rng = np.random.default_rng([seed, step, rank])
    lengths = rng.integers(config.small[0], config.small[1] + 1, size=config.samples_per_rank).tolist()
    if rank == step % world_size:
        lengths[0] = config.giant
    items = []
    for length in lengths:
        image = np.arange(length) < int(rng.integers(0, length // 2 + 1))  # an image prefix, then text
        ids = rng.integers(0, config.vocab, size=length)
        labels = np.where(np.roll(image, -1) | (np.arange(length) == length - 1), IGNORE, np.roll(ids, -1))
        items.append({"ids": torch.from_numpy(np.where(image, 0, ids)), "image": torch.from_numpy(image),
                      "patches": torch.from_numpy(rng.standard_normal((length, config.patch_dim))).to(dtype)
                      * torch.from_numpy(image)[:, None], "labels": torch.from_numpy(labels)})
    return items


def packed(items: list[dict]) -> dict:
    """Items' per-token tensors packed one after another."""
    return {key: torch.cat([item[key] for item in items]) for key in ("ids", "image", "patches", "labels")}


def whole_layout(lengths) -> ContextParallelLayout:
    """Items unsplit, in one process."""
    return ContextParallelLayout.planned(0, 1, [int(length) for length in lengths], ())


@contextlib.contextmanager
def isolated_attention():
    """Skip the K/V exchange (received rows stay zeros, keys as this rank's own rows are: the flag column
    `context_parallel_attention` checks): a rank's own attention compute, no peer."""
    def skip(sends, recvs, exchange, group, phase):
        flag = max((float(rows[:, -1].max()) for rows in sends.values() if rows.numel()), default=1.0)
        for received in recvs.values():
            received.zero_()
            if phase == "forward" and received.numel():
                received[:, -1] = flag
    original, cp_module._p2p = cp_module._p2p, skip
    try:
        yield
    finally:
        cp_module._p2p = original


def timed(model: GiantsModel, data: dict, layout: ContextParallelLayout, repeats: int) -> float:
    """Least thread CPU seconds of forward+backward over `repeats` runs after a warm-up, in isolation."""
    seconds = []
    with isolated_attention():
        for _ in range(repeats + 1):
            start = time.thread_time()
            model(data, layout).backward()
            seconds.append(time.thread_time() - start)
    model.zero_grad(set_to_none=True)
    return min(seconds[1:])


def text_item(config: GiantsConfig, length: int, rng, dtype) -> dict:
    """A text item of `length` tokens (calibration input)."""
    ids = torch.from_numpy(rng.integers(0, config.vocab, size=length))
    return {"ids": ids, "image": torch.zeros(length, dtype=torch.bool),
            "patches": torch.zeros(length, config.patch_dim, dtype=dtype), "labels": ids.roll(-1)}


def shard_layout(length: int, degree: int) -> ContextParallelLayout:
    """Group rank 0's layout of one item of `length` split at `degree` over ranks 0 .. degree − 1."""
    split = SplitItem(0, length, tuple(range(degree)))
    return ContextParallelLayout.planned(0, degree, [split], [split])


def calibrate(model: GiantsModel, config: GiantsConfig, degrees, dtype, seed: int) -> tuple[CostModel, float]:
    """Rank 0's isolated fit: f(l) from packed batches, η's half-efficiency tokens from group rank 0's
    shard of the giant and of the shortest and longest small item at each degree (`fit_split_efficiency`)."""
    rng = np.random.default_rng([seed, 999])
    batches = [rng.integers(config.small[0], config.small[1] + 1, size=count).tolist() for count in (4, 8, 16, 24)]
    batches += [[config.giant // 4], [config.giant // 2], [config.giant], [config.giant // 2] * 2]
    make = lambda lengths: packed([text_item(config, length, rng, dtype) for length in lengths])  # noqa: E731
    cost, _ = fit_packed_cost(batches, [timed(model, make(batch), whole_layout(batch), 3) for batch in batches])
    cases = [(length, degree) for length in (config.giant, config.small[1], config.small[0])
             for degree in degrees if degree > 1]  # short items too: a shard's fixed costs are η's loss there
    if not cases:
        return cost, 0.0
    whole = {length: timed(model, make([length]), whole_layout([length]), 3) for length, _ in cases}
    layouts = [shard_layout(length, degree) for length, degree in cases]
    seconds = [timed(model, make([layout.num_tokens]), layout, 3) for layout in layouts]
    half, _ = fit_split_efficiency([layout.num_tokens for layout in layouts], [degree for _, degree in cases],
                                   [whole[length] for length, _ in cases], seconds)
    return cost, half


@dataclass(frozen=True)
class GiantsReport:
    """What `orchmllm demo --workload giants` measured; `failed_checks()` is the verdict."""

    ranks: int
    steps: int
    dtype: str
    context_parallel: list
    items_split: int
    degrees_per_step: list
    tokens_lost: int
    tokens_duplicated: int
    samples_lost: int
    grad_max_abs_diff: float
    grad_max_rel_diff: float
    gradient_tolerance: float
    busy_max_over_mean_isolated_split: float
    busy_max_over_mean_isolated_unsplit: float
    busy_max_over_mean_isolated_split_per_step: list
    busy_max_over_mean_isolated_unsplit_per_step: list
    busy_max_over_mean_planned_split: float
    busy_max_over_mean_planned_unsplit: float
    busy_max_over_mean_bound_split: float
    half_efficiency_tokens: float
    cost_model: dict
    wall_seconds: float
    workload: str = "giants"

    def failed_checks(self) -> list[str]:
        """Every check the run failed (empty: passed)."""
        failed = []
        if self.tokens_lost or self.tokens_duplicated or self.samples_lost:
            failed.append(f"{self.tokens_lost} tokens lost, {self.tokens_duplicated} duplicated, "
                          f"{self.samples_lost} samples lost")
        if not self.grad_max_rel_diff <= self.gradient_tolerance:
            failed.append(f"gradients differ from the unsplit reference by {self.grad_max_rel_diff:.3g} (relative), "
                          f"above the {self.dtype} rounding tolerance {self.gradient_tolerance:.2g}")
        if self.busy_max_over_mean_isolated_unsplit < UNSPLIT_GIANT_FLOOR:
            failed.append(f"the unsplit plan's isolated busy max/mean is {self.busy_max_over_mean_isolated_unsplit:.3f}"
                          f" < {UNSPLIT_GIANT_FLOOR}: the workload has no giant to split")
        target = self.busy_max_over_mean_bound_split + SPLIT_ISOLATED_MARGIN  # what the degrees allow, measured
        if self.busy_max_over_mean_isolated_split > target:
            failed.append(f"isolated busy max/mean with splitting {self.busy_max_over_mean_isolated_split:.3f} > "
                          f"{target:.3f} (the best the degrees allow, the split plan's certified bound "
                          f"{self.busy_max_over_mean_bound_split:.3f}, + {SPLIT_ISOLATED_MARGIN})")
        return failed

    def to_json(self) -> dict:
        return {**asdict(self), "failed_checks": self.failed_checks()}


def reference_gradients(model: GiantsModel, config: GiantsConfig, step: int, world_size: int, seed: int,
                        dtype) -> list[torch.Tensor]:
    """Gradients of the step's global mean loss, every item whole and unbalanced, in this one process."""
    items = [item for rank in range(world_size) for item in sample_items(config, step, rank, world_size, seed, dtype)]
    data = packed(items)
    model.zero_grad(set_to_none=True)
    (model(data, whole_layout([len(item["ids"]) for item in items])) / int((data["labels"] != IGNORE).sum())).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def held_counts(values: torch.Tensor, size: int) -> np.ndarray:
    """How many copies of each of `size` ids (tokens, samples) all ranks hold together (one all-reduce)."""
    counts = torch.bincount(values, minlength=size)
    dist.all_reduce(counts)
    return counts.numpy()


def balanced_step(model: GiantsModel, dispatcher: PostBalancingDispatcher, batch: dict, lengths, loss_tokens,
                  total: tuple[int, int]) -> dict:
    """One balanced forward+backward (gradients all-reduced into `.grad`), what it held, and its work."""
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens)
    moved = dispatcher.dispatch(batch, plan, lengths=lengths)
    model.zero_grad(set_to_none=True)
    work = []
    for micro in dispatcher.microbatches(plan, moved):
        normalize_loss(model(micro.data, micro.layout), micro).backward()
        layout = micro.layout
        work.append(({key: value for key, value in micro.data.items() if key in ("ids", "image", "patches", "labels")},
                     (layout.rank, dist.get_world_size(), layout.sequences, layout.splits)))
    all_reduce_gradients(model.parameters(), op="mean")
    tokens, samples = held_counts(moved["token"], total[0]), held_counts(moved["sample"], total[1])
    degree = getattr(plan.balance, "degree", np.ones(len(plan.lengths), dtype=np.int64))
    return {"work": work, "tokens": tokens, "samples": samples, "degree": degree,
            "planned": max_over_mean(plan.balance.loads), "bound": bound_over_mean(plan.balance)}


def bound_over_mean(plan) -> float:
    """The plan's certified lower bound over its mean rank load: the least busy max/mean its degrees allow."""
    mean = float(np.mean(plan.loads))
    return plan.lower_bound / mean if mean > 0 else 1.0


def train(rank: int, world_size: int, steps: int, seed: int, dtype_name: str, degrees: tuple,
          config: GiantsConfig, replay_repeats: int) -> dict:
    """Every rank's part: calibrate (rank 0), then each step the reference (rank 0), the unsplit and the
    split balanced steps from the same parameters, the checks, and an optimizer step; rank 0 then
    replays every rank's recorded work in isolation."""
    dtype = DTYPES[dtype_name]
    torch.manual_seed(seed)
    model = GiantsModel(config).to(dtype)
    fitted = [calibrate(model, config, degrees, dtype, seed) if rank == 0 else None]
    dist.broadcast_object_list(fitted, src=0)
    cost, half = fitted[0]
    spec = dict(gpus_per_node=world_size, seconds_per_cost=1.0, kv_bytes_per_token=0.0, latency_s=0.0,
                half_efficiency_tokens=half)
    dispatchers = {name: PostBalancingDispatcher(cost=cost, per_item_keys={"sample"},
                                                 context_parallel=ContextParallel(degrees=allowed, **spec))
                   for name, allowed in (("unsplit", (1,)), ("split", degrees))}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    per_step, total_tokens = [], 0
    for step in range(steps):
        everything = [sample_items(config, step, r, world_size, seed, dtype) for r in range(world_size)]
        counts = [len(items) for items in everything]
        sizes = [[len(item["ids"]) for item in items] for items in everything]
        offset = sum(sum(lengths) for lengths in sizes[:rank])
        total = (sum(map(sum, sizes)), sum(counts))
        batch = packed(everything[rank])
        batch["token"] = torch.arange(offset, offset + sum(sizes[rank]))
        batch["sample"] = torch.arange(sum(counts[:rank]), sum(counts[:rank + 1]))
        loss_tokens = [int((item["labels"] != IGNORE).sum()) for item in everything[rank]]
        reference = reference_gradients(model, config, step, world_size, seed, dtype) if rank == 0 else None
        results = {name: balanced_step(model, dispatcher, batch, sizes[rank], loss_tokens, total)
                   for name, dispatcher in dispatchers.items()}
        grads = [p.grad for p in model.parameters()]  # the split step's, left by the last call
        difference = None if reference is None else max(float((g - r).abs().max()) for g, r in zip(grads, reference))
        scale = None if reference is None else max(float(r.abs().max()) for r in reference)
        optimizer.step()
        split = results["split"]
        per_step.append({"difference": difference, "scale": scale, "tokens": split["tokens"],
                         "samples": split["samples"], "degree": split["degree"].tolist(),
                         "planned": {name: result["planned"] for name, result in results.items()},
                         "bound": results["split"]["bound"],
                         "work": {name: result["work"] for name, result in results.items()}})
        total_tokens += total[0]
    works = [None] * world_size
    dist.all_gather_object(works, [step["work"] for step in per_step])
    busy = replay(model, works, steps, replay_repeats) if rank == 0 else None
    return {"per_step": [{k: v for k, v in step.items() if k != "work"} for step in per_step], "busy": busy,
            "cost": asdict(cost), "half": half, "terms": total_tokens}


def replay(model: GiantsModel, works: list, steps: int, repeats: int) -> dict:
    """{name: [[isolated busy seconds per rank] per step]}: each rank's recorded micro-batches re-run here."""
    busy = {}
    for name in ("unsplit", "split"):
        busy[name] = [[sum(timed(model, data, ContextParallelLayout.planned(r, size, sequences, splits), repeats)
                           for data, (r, size, sequences, splits) in works[rank][step][name])
                       for rank in range(len(works))] for step in range(steps)]
    return busy


def summarize(records: list, ranks: int, steps: int, dtype: str, degrees: tuple, wall_seconds: float) -> GiantsReport:
    """The report from every rank's record (rank 0's holds the reference and the replay)."""
    first = records[0]
    tokens = sum(np.sum(step["tokens"] == 0) for step in first["per_step"])
    duplicated = sum(np.sum(step["tokens"] > 1) for step in first["per_step"])
    samples = sum(np.sum(step["samples"] == 0) for step in first["per_step"])
    difference = max(step["difference"] for step in first["per_step"])
    scale = max(step["scale"] for step in first["per_step"])
    figures = {name: [max_over_mean(rows) for rows in first["busy"][name]] for name in ("unsplit", "split")}
    planned = {name: float(np.mean([step["planned"][name] for step in first["per_step"]]))
               for name in ("unsplit", "split")}
    return GiantsReport(
        ranks, steps, dtype, list(degrees), int(sum(np.sum(np.asarray(step["degree"]) > 1)
                                                    for step in first["per_step"])),
        [sorted(set(step["degree"])) for step in first["per_step"]], int(tokens), int(duplicated), int(samples),
        difference, difference / scale if scale else difference, rounding_tolerance(dtype, first["terms"]),
        float(np.mean(figures["split"])), float(np.mean(figures["unsplit"])), figures["split"], figures["unsplit"],
        planned["split"], planned["unsplit"], float(np.mean([step["bound"] for step in first["per_step"]])),
        first["half"], first["cost"], wall_seconds)


def run_giants(ranks: int = 4, steps: int = 2, seed: int = 0, dtype: str = "float32", *, degrees=(1, 2, 4),
               config: GiantsConfig = GiantsConfig(), replay_repeats: int = 3, timeout_s: float = 600.0,
               progress=None) -> GiantsReport:
    """Spawn `ranks` gloo processes, train `steps` steps of the giants workload, return the report."""
    degrees = ContextParallel(degrees=degrees, gpus_per_node=max(ranks, 1)).degrees
    if degrees[-1] > ranks:
        raise ValueError(f"`context_parallel` degrees must be at most the {ranks} ranks; got {list(degrees)}")
    start = time.perf_counter()
    if progress is not None:
        progress(f"starting {ranks} gloo ranks (giants workload, degrees {list(degrees)})")
    records = spawn(train, ranks, args=(steps, seed, dtype, degrees, config, replay_repeats), timeout_s=timeout_s,
                    collective_timeout_s=min(timeout_s, 120.0))
    return summarize(records, ranks, steps, dtype, degrees, time.perf_counter() - start)
