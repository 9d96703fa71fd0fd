"""The comparison engine of `orchmllm compare`: every balancer and peer on the same stages.

For each configuration (D ranks, samples per rank, the stages' items) every algorithm
balances every stage; a row records the makespan against the lower bound, the speed-up
over leaving every item where it was sampled (`BASELINE`), the solve time and the bytes
the plan moves within and across nodes.  Peers' solve times are those of our
reimplementations (`study.peers`), not of the peers' own code; rows say so (`timed`).  An algorithm another
package registered (a plugin: `registry.plugin_origin`) is its own kind, "plugin", whatever kind its record claims:
its rows name where it comes from, and orchmllm's summary ("best") never takes its plans.

>>> stage = file_stages(np.array([5, 1, 4, 2, 3, 3]), 2, CostModel(), False, 1.0)[0]
>>> comparison = run_comparison([CompareConfig(2, None, (stage,))], ["lpt"], gpus_per_node=8)
>>> [(row.algorithm, row.makespan, row.speedup_vs_none) for row in comparison.rows]
[('none', 10.0, 1.0), ('lpt', 9.0, 1.111...)]
>>> comparison.summaries[0].best.algorithms
{'items': 'lpt'}
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..balancers import CostModel, Kind, algorithms, balance, balance_microbatches, get_algorithm
from ..balancers.kernels.identity import chunk_sources
from ..balancers.microbatch.api import MAX_CELLS
from ..balancers.plan import LOCALITY_SUFFIX, BalancePlan
from ..balancers.registry import BASELINE_LABEL, plugin_origin, skipped_entry
from ..balancers.validation import SizeLimitError, as_real
from ..topology import Topology, traffic
from .microbatch_peers import MICROBATCH_PEERS
from .peers import peer_mode
from .records import FieldsAsJson

BASELINE = BASELINE_LABEL  # every item stays on the rank that sampled it (a name the registry reserves)
MAX_STEP_SAMPLES = MAX_CELLS  # D × samples per rank a compared or simulated step draws: 2**22, as a plan's cells
PEER_TIMING = "our reimplementation"  # what a peer's solve_seconds measure
PLUGIN_TIMING = "the plugin's code"  # what a plugin's solve_seconds measure


@dataclass(frozen=True, eq=False)
class CompareStage:
    """The items one stage balances in one step: lengths, the rank that sampled each, costs, bytes."""

    name: str
    lengths: np.ndarray
    sources: np.ndarray
    cost: CostModel
    padded: bool
    item_bytes: np.ndarray


@dataclass(frozen=True, eq=False)
class CompareConfig:
    """One configuration to compare on: D ranks, samples per rank (None for a lengths file), stages."""

    num_ranks: int
    items_per_rank: int | None
    stages: tuple[CompareStage, ...]


def file_stages(lengths: np.ndarray, num_ranks: int, cost: CostModel, padded: bool,
                bytes_per_token: float) -> tuple[CompareStage, ...]:
    """A lengths file as one stage, its items listed rank by rank (as an all-gather lists them).

    ValueError when `bytes_per_token` is not finite and >= 0, or times the longest length
    overflows float64 (the planners' traffic sums would be inf).
    """
    bytes_per_token = as_real(bytes_per_token, "bytes_per_token")
    with np.errstate(over="ignore"):
        item_bytes = lengths * bytes_per_token
    if item_bytes.size and not np.isfinite(item_bytes.max()):
        raise ValueError(f"`bytes_per_token` = {bytes_per_token} times the longest length {lengths.max()} "
                         f"overflows float64")
    return (CompareStage("items", lengths, chunk_sources(lengths.size, num_ranks), cost, padded, item_bytes),)


def check_batch_size(num_ranks: int, samples_per_rank: int) -> None:
    """SizeLimitError when a step of `num_ranks` × `samples_per_rank` samples passes
    `MAX_STEP_SAMPLES`, checked before sampling allocates them."""
    samples = num_ranks * samples_per_rank
    if samples > MAX_STEP_SAMPLES:
        raise SizeLimitError(f"{num_ranks} ranks × {samples_per_rank} samples per rank make {samples} samples, "
                             f"beyond 2**22 = {MAX_STEP_SAMPLES}, the most one compared or simulated step draws; "
                             f"use fewer ranks or samples per rank")


def workload_stages(batch, stages) -> tuple[CompareStage, ...]:
    """Every stage's items of `batch`; bytes are an item's input (the LLM: text + embeddings it
    receives), as the planner counts them (`orchestrator.planner.input_bytes`)."""
    from ..orchestrator.planner import input_bytes, stage_items

    result = []
    for stage in stages:
        item_sample, _, item_length = stage_items(batch, stage)
        if item_length.size:
            result.append(CompareStage(stage.name, np.asarray(item_length), batch.sample_source[item_sample],
                                       stage.cost, stage.padded, input_bytes(batch, stages, stage)))
    return tuple(result)


def peer_names() -> list[str]:
    """The registered peers' heuristics (kind `peer`, orchmllm's reimplementations), in registration order."""
    return [record.name for record in algorithms(kind=Kind.PEER) if plugin_origin(record) is None]


def row_source(name: str) -> tuple[str, str]:
    """Whose algorithm `name` is, as its rows say, and their label: ("orchmllm", ""), ("peer", its description), or
    ("plugin", where it comes from and its description) for one registered by another package or a register_*
    call, whatever kind its record claims (probe18 P18-12: a plugin's rows read as orchmllm's own)."""
    record = None if name == BASELINE else get_algorithm(name.removesuffix(LOCALITY_SUFFIX))
    origin = None if record is None else plugin_origin(record)
    if origin is not None:
        return "plugin", origin + (f": {record.description}" if record.description else "")
    if record is not None and record.kind is Kind.PEER:
        return "peer", record.description
    return "orchmllm", ""


def known_names() -> list[str]:
    """Every name `compare` accepts: algorithms, their +locality variants, peers.  A plugin is one whatever kind its
    record claims (`row_source`), with its +locality variant (probe19 P19-08: one claiming "baseline" had none);
    orchmllm's peers and baseline have none (`no_locality_variant`)."""
    records = algorithms()
    ours = [record for record in records if plugin_origin(record) is not None or record.kind is not Kind.PEER]
    return ([record.name for record in ours] + [record.name + LOCALITY_SUFFIX for record in ours
                                                if not no_locality_variant(record)] + peer_names())


def no_locality_variant(record) -> str:
    """Why algorithm `record` has no +locality variant in `compare`, or "" where it has one."""
    if plugin_origin(record) is not None:
        return ""
    if record.kind is Kind.BASELINE:
        return ("it is the baseline, which keeps every item on the rank that sampled it: the locality pass has "
                "nothing to keep")
    if record.kind is Kind.PEER:
        return "it is a peer's heuristic, compared as its system runs it, without a locality pass"
    return ""


def algorithm_names(text: str | None) -> list[str]:
    """The algorithm and peer names in `text` (comma-separated), or the default set: the
    records registered as default, plus auto+locality.

    A registered name with the suffix "+locality" runs communication-aware: within 0.2 % of
    the plain makespan, items stay on their rank, else on their node, as far as possible.

    >>> algorithm_names("lpt, verl_kk,lpt")
    ['lpt', 'verl_kk']
    """
    if text is None:
        records = algorithms(default=True)
        return ([record.name for record in records if record.kind is not Kind.PEER] + [f"auto{LOCALITY_SUFFIX}"]
                + [record.name for record in records if record.kind is Kind.PEER])
    known = known_names()
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError(f"name at least one algorithm; got {text!r}")
    for name in names:
        base = name.removesuffix(LOCALITY_SUFFIX)
        if name not in known and base != name and base in known:
            raise ValueError(f"algorithm {base!r} has no {LOCALITY_SUFFIX} variant: "
                             f"{no_locality_variant(get_algorithm(base))}; name {base!r}")
        if name not in known:
            raise ValueError(skipped_entry(base, "algorithm") or
                             f"unknown algorithm {name!r}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def compare_topology(num_ranks: int, gpus_per_node: int) -> Topology:
    """Whole nodes of `gpus_per_node` GPUs (one node when D is smaller)."""
    return Topology.for_world_size(num_ranks, gpus_per_node=min(gpus_per_node, num_ranks))


def plan_for(name: str, stage: CompareStage, num_ranks: int, time_limit: float | None, topology,
             max_tokens_per_rank: int | None = None) -> BalancePlan:
    """The plan of algorithm, peer or baseline `name` for one stage's items."""
    options = dict(cost=stage.cost, padded=stage.padded, time_limit=time_limit,
                   max_tokens_per_rank=max_tokens_per_rank)
    if name == BASELINE:
        return balance(stage.lengths, num_ranks, algorithm="identity", sources=stage.sources, **options)
    if name.endswith(LOCALITY_SUFFIX):
        return balance(stage.lengths, num_ranks, algorithm=name.removesuffix(LOCALITY_SUFFIX), sources=stage.sources,
                       item_bytes=stage.item_bytes, topology=topology, **options)
    return balance(stage.lengths, num_ranks, algorithm=name, **options)


def does_not_apply(name: str, padded: bool) -> str:
    """Why algorithm `name` cannot balance a stage of this padding ("" when it can), from its record."""
    return "" if name == BASELINE else get_algorithm(name.removesuffix(LOCALITY_SUFFIX)).why_not(padded)


def plugin_failure(name: str, error: RuntimeError) -> str:
    """One line saying that plugin algorithm `name` failed (its kernel raised, or returned a broken plan: the
    RuntimeError naming it), and where the plugin comes from; `error` raised again for orchmllm's own (a bug)."""
    origin = plugin_origin(get_algorithm(name.removesuffix(LOCALITY_SUFFIX)))
    if origin is None:
        raise error
    return f"{origin} failed: {' '.join(str(error).split())}"


def ratio(value: float, reference: float) -> float:
    """value / reference, 1.0 when both are 0 (a step with no work is balanced).

    >>> ratio(3.0, 2.0), ratio(0.0, 0.0), ratio(1.0, 0.0)
    (1.5, 1.0, inf)
    """
    if reference > 0:
        return value / reference
    return 1.0 if value == 0 else math.inf


@dataclass(frozen=True)
class CompareRow(FieldsAsJson):
    """One algorithm on one stage of one configuration; the figures are None when it does not apply."""

    ranks: int
    items_per_rank: int | None
    stage: str
    algorithm: str
    kind: str  # "orchmllm", "peer" or "plugin" (`row_source`)
    label: str  # a peer's one-line description; where a plugin comes from and its description
    num_items: int
    mode: str  # the variant a peer ran ("" when it has one)
    makespan: float | None = None
    lower_bound: float | None = None
    makespan_over_bound: float | None = None
    imbalance: float | None = None
    speedup_vs_none: float | None = None
    solve_seconds: float | None = None
    bytes_moved: float | None = None
    bytes_inter_node: float | None = None
    status: str = "n/a"
    note: str = ""
    timed: str = "orchmllm"  # whose code solve_seconds measure: "orchmllm", PEER_TIMING or PLUGIN_TIMING

    @property
    def applies(self) -> bool:
        return self.makespan is not None


@dataclass(frozen=True)
class BestPlans:
    """The best registered algorithm of every stage and the step's summed slowest-rank work."""

    algorithms: Mapping[str, str]
    work: float
    speedup_vs_none: float

    def to_json(self) -> dict:
        return {"algorithms": dict(self.algorithms), "work": self.work, "speedup_vs_none": self.speedup_vs_none}


@dataclass(frozen=True)
class BestPeer(FieldsAsJson):
    """The peer (or plugin) whose plans sum lowest over all stages."""

    algorithm: str
    work: float
    speedup_vs_none: float


@dataclass(frozen=True)
class LocalityEffect(FieldsAsJson):
    """An algorithm against its +locality variant, summed over stages: work and bytes."""

    algorithm: str
    work: float
    bytes_moved: float
    bytes_inter_node: float
    work_locality: float
    bytes_moved_locality: float
    bytes_inter_node_locality: float


@dataclass(frozen=True)
class CompareSummary:
    """Per configuration: slowest-rank work summed over stages, as sampled vs the best plans."""

    ranks: int
    items_per_rank: int | None
    stages: tuple[str, ...]
    work_before: float
    work_ideal: float
    best: BestPlans | None = None
    best_peer: BestPeer | None = None
    best_plugin: BestPeer | None = None
    locality: tuple[LocalityEffect, ...] = ()

    def to_json(self) -> dict:
        payload = {"ranks": self.ranks, "items_per_rank": self.items_per_rank, "stages": list(self.stages),
                   "work_before": self.work_before, "work_ideal": self.work_ideal}
        for key, value in (("best", self.best), ("best_peer", self.best_peer), ("best_plugin", self.best_plugin)):
            if value is not None:
                payload[key] = value.to_json()
        payload["locality"] = [entry.to_json() for entry in self.locality]
        return payload


@dataclass(frozen=True, eq=False)
class StageRun:
    """What a row's figures came from, for plots: the stage, the plan, the topology."""

    stage: CompareStage
    plan: BalancePlan
    topology: Topology


@dataclass(frozen=True, eq=False)
class Comparison:
    """Rows of every run, a summary per configuration, and the runs behind the rows.

    `runs` is keyed by (ranks, items_per_rank, stage name, algorithm).
    """

    rows: tuple[CompareRow, ...]
    summaries: tuple[CompareSummary, ...]
    runs: Mapping[tuple, StageRun] = field(repr=False)

    def to_json(self) -> dict:
        return {"rows": [row.to_json() for row in self.rows], "summary": [s.to_json() for s in self.summaries]}


def run_comparison(configs: Sequence[CompareConfig], algorithms: Sequence[str], *, gpus_per_node: int,
                   time_limit: float | None = None, report_not_applicable: bool = False,
                   advance: Callable[[], None] = lambda: None) -> Comparison:
    """Run the baseline and every algorithm on every stage of every configuration.

    An algorithm that cannot balance a stage (a padded-only solver on an unpadded stage, an
    exact model beyond its size limit) is left out, or reported as an "n/a" row with the
    reason when `report_not_applicable`.  A plugin that fails (`plugin_failure`) gets a "failed"
    row and a warning naming it; the others run on.
    `advance()` is called once per (stage, algorithm), for a progress bar.
    """
    rows, runs = [], {}
    for config in configs:
        topology = compare_topology(config.num_ranks, gpus_per_node)
        for stage in config.stages:
            baseline = None
            for name in [BASELINE, *algorithms]:
                kind, label = row_source(name)
                head = dict(ranks=config.num_ranks, items_per_rank=config.items_per_rank, stage=stage.name,
                            algorithm=name, kind=kind, label=label, num_items=int(stage.lengths.size),
                            mode=peer_mode(name, stage.lengths.size, config.num_ranks) if kind == "peer" else "",
                            timed={"peer": PEER_TIMING, "plugin": PLUGIN_TIMING}.get(kind, "orchmllm"))
                plan, reason, status = None, does_not_apply(name, stage.padded), "n/a"
                if not reason:
                    try:
                        plan = plan_for(name, stage, config.num_ranks, time_limit, topology)
                    except SizeLimitError as error:
                        reason = " ".join(str(error).split())
                    except RuntimeError as error:  # a plugin's kernel raised or returned a broken plan
                        reason, status = plugin_failure(name, error), "failed"
                        warnings.warn(f"{reason}; its rows say failed", RuntimeWarning, stacklevel=2)
                if plan is None:
                    if report_not_applicable or status == "failed":
                        rows.append(CompareRow(**head, note=reason, status=status))
                    advance()
                    continue
                move = traffic(stage.sources, plan.assignment, stage.item_bytes, topology)
                baseline = plan.makespan if baseline is None else baseline
                rows.append(CompareRow(
                    **head, makespan=plan.makespan, lower_bound=plan.lower_bound,
                    makespan_over_bound=ratio(plan.makespan, plan.lower_bound), imbalance=plan.imbalance,
                    speedup_vs_none=ratio(baseline, plan.makespan), solve_seconds=plan.solve_seconds,
                    bytes_moved=move.bytes_moved, bytes_inter_node=move.bytes_inter_node, status=str(plan.status)))
                runs[(config.num_ranks, config.items_per_rank, stage.name, name)] = StageRun(stage, plan, topology)
                advance()
    return Comparison(tuple(rows), summarize(rows), runs)


def _best_plans(mine: list[CompareRow], stages: list[str], baseline: dict, before: float) -> BestPlans | None:
    ours = [row for row in mine if row.kind == "orchmllm" and row.algorithm != BASELINE]
    if not ours:
        return None
    chosen = {stage: min((row for row in ours if row.stage == stage),
                         key=lambda row: (row.makespan, row.algorithm), default=baseline[stage])
              for stage in stages}
    work = sum(row.makespan for row in chosen.values())
    return BestPlans({stage: row.algorithm for stage, row in chosen.items()}, work, ratio(before, work))


def _best_of(kind: str, mine: list[CompareRow], stages: list[str], before: float) -> BestPeer | None:
    """The algorithm of rows of `kind` ("peer" or "plugin") whose plans, on every stage, sum lowest."""
    totals = {}
    for name in dict.fromkeys(row.algorithm for row in mine if row.kind == kind):
        named = [row for row in mine if row.algorithm == name]
        if len(named) == len(stages):
            totals[name] = sum(row.makespan for row in named)
    if not totals:
        return None
    name = min(totals, key=lambda n: (totals[n], n))
    return BestPeer(name, totals[name], ratio(before, totals[name]))


def _locality_effects(mine: list[CompareRow], stages: list[str]) -> tuple[LocalityEffect, ...]:
    effects = []
    for aware in sorted({row.algorithm for row in mine if row.algorithm.endswith(LOCALITY_SUFFIX)}):
        plain = aware.removesuffix(LOCALITY_SUFFIX)
        groups = [[row for row in mine if row.algorithm == name] for name in (plain, aware)]
        if len(groups[0]) == len(groups[1]) == len(stages):
            sums = [[sum(getattr(row, key) for row in group) for key in ("makespan", "bytes_moved", "bytes_inter_node")]
                    for group in groups]
            effects.append(LocalityEffect(plain, *sums[0], *sums[1]))
    return tuple(effects)


def summarize(rows: Sequence[CompareRow]) -> tuple[CompareSummary, ...]:
    """Per configuration: slowest-rank work summed over stages, as sampled vs the best plans.

    "best" takes orchmllm's best algorithm of every stage (stages are balanced independently;
    never a plugin's); "best_peer" the peer heuristic whose plans sum lowest over all stages,
    "best_plugin" likewise among plugins.
    """
    summaries = []
    for num_ranks, items_per_rank in sorted({(row.ranks, row.items_per_rank or 0) for row in rows}):
        mine = [row for row in rows if row.ranks == num_ranks and (row.items_per_rank or 0) == items_per_rank
                and row.applies]
        stages = list(dict.fromkeys(row.stage for row in mine))
        baseline = {row.stage: row for row in mine if row.algorithm == BASELINE}
        before = sum(row.makespan for row in baseline.values())
        # every row bounds its stage's one problem: the largest bound any of them proved (the padded exact's optimum,
        # say), not the baseline row's generic one (probe22 P22-05: 1.17x for a plan proven optimal)
        ideal = sum(max(row.lower_bound for row in mine if row.stage == stage) for stage in stages)
        summaries.append(CompareSummary(
            num_ranks, items_per_rank or None, tuple(stages), before, ideal,
            _best_plans(mine, stages, baseline, before), _best_of("peer", mine, stages, before),
            _best_of("plugin", mine, stages, before), _locality_effects(mine, stages)))
    return tuple(summaries)


@dataclass(frozen=True)
class MicroBatchRow(FieldsAsJson):
    """One micro-batch algorithm (ours or a reimplemented peer) on one configuration's last stage:
    its micro-batch count M and Σ_m max_r cost over the certified bound."""

    ranks: int
    items_per_rank: int | None
    stage: str
    algorithm: str
    kind: str  # "orchmllm" or "peer"
    max_tokens_per_microbatch: int
    num_microbatches: int
    step_cost: float
    lower_bound: float
    step_cost_over_bound: float
    solve_seconds: float
    timed: str = "orchmllm"


def compare_microbatches(configs: Sequence[CompareConfig], max_tokens_per_microbatch: int
                         ) -> tuple[tuple[MicroBatchRow, ...], dict]:
    """`balance_microbatches` and every reimplemented micro-batch peer on the last stage (the LLM, or a
    lengths file's only stage) of every configuration; the rows, and the plans by
    (ranks, items_per_rank, algorithm) for plots.  "none" is the naive per-rank sequential fill;
    the peers do not model padding, so a padded stage runs ours alone."""
    rows, plans = [], {}
    for config in configs:
        stage = config.stages[-1]
        runs = {"ours": balance_microbatches} if stage.padded else {**MICROBATCH_PEERS, "ours": balance_microbatches}
        for name, run in runs.items():
            kind = "orchmllm" if name == "ours" else "peer"
            options = dict(max_tokens_per_microbatch=max_tokens_per_microbatch, cost=stage.cost)
            options.update(padded=stage.padded) if kind == "orchmllm" else options.update(sources=stage.sources)
            plan = run(stage.lengths, config.num_ranks, **options)
            plans[(config.num_ranks, config.items_per_rank, name)] = plan
            rows.append(MicroBatchRow(
                ranks=config.num_ranks, items_per_rank=config.items_per_rank, stage=stage.name, algorithm=name,
                kind=kind, max_tokens_per_microbatch=max_tokens_per_microbatch,
                num_microbatches=plan.num_microbatches, step_cost=plan.step_cost, lower_bound=plan.lower_bound,
                step_cost_over_bound=ratio(plan.step_cost, plan.lower_bound), solve_seconds=plan.solve_seconds,
                timed=PEER_TIMING if kind == "peer" else "orchmllm"))
    return tuple(rows), plans
