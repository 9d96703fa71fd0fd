"""The demo's result: a frozen report built from every rank's record, and its pass/fail check.

Busy-time figures come in three kinds, side by side:
- `..._isolated`: each rank's recorded per-stage work replayed with no other rank
  running (`replay.py`); what the check uses, since contention cannot enter it;
- the concurrent figures (no suffix): CPU time of the compute while every rank runs,
  as the training itself ran (contention between ranks included);
- `..._planned`: the cost models' prediction, the step plan's per-rank load summed over
  stages.
The `identical_work` figures (every rank running the same batch) are the noise floor of
each measurement: max/mean above 1 there is measurement noise, not imbalance.

With `max_tokens_per_microbatch` the balanced step runs as M gradient-accumulation
micro-batches, synchronised across ranks one by one, so it costs Σ_m max_r busy(r, m): the
`microbatch_busy_max_over_mean...` figures are Σ_m max_r / Σ_m mean_r per step (and, per
cell, max_r / mean_r of each micro-batch); the balanced per-rank figures sum a rank's
micro-batches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}  # u = eps / 2
ROUNDING_TAIL = 8.0  # λ of the probabilistic rounding bound: P(|error| > λ·sqrt(n)·u·Σ|x|) <= 2·exp(-λ²/2)
BALANCED_ISOLATED_TARGET = 1.05  # isolated busy max/mean of the balanced step


def rounding_tolerance(dtype: str, terms: int) -> float:
    """The largest relative gradient difference (max |Δ| / max |g|) that summation order alone
    explains, for gradients whose entries are sums of at most `terms` products.

    The balanced and unbalanced runs add the same terms (one per token, patch or frame of the
    global batch) in other orders and groupings: other ranks, micro-batches, GEMM blockings.
    Rounding errors of a sum of n terms in any order behave as a random walk, |error| <=
    λ·sqrt(n)·u·Σ|x| with probability at least 1 - 2·exp(-λ²/2) (Higham and Mary, SIAM J. Sci.
    Comput. 41(5), 2019), u the unit roundoff.  λ = 8 puts that at 3e-14 per entry (below 1e-6
    over 10**7 entries); two runs double it.  Taking an entry's Σ|x| at the scale of the largest
    entry gives 2·λ·sqrt(n)·u: 9.5e-5 in float32 at n = 10**4 (measured: at most 0.15·sqrt(n)·u
    over seeds and 2k-60k terms, float32 and float64).  A real error, a sample lost or counted
    twice or a per-rank mean loss, moves the gradient by about 1 / samples, far above it.

    >>> f"{rounding_tolerance('float32', 10_000):.2g}", f"{rounding_tolerance('float64', 10_000):.2g}"
    ('9.5e-05', '1.8e-13')
    """
    return 2.0 * ROUNDING_TAIL * float(np.sqrt(max(int(terms), 1))) * UNIT_ROUNDOFF[dtype]


def max_over_mean(values) -> float:
    """max / mean of per-rank values (1.0 when they are all zero).

    >>> max_over_mean([2.0, 1.0, 3.0])
    1.5
    """
    values = np.asarray(values, dtype=np.float64)
    return float(values.max() / values.mean()) if values.mean() > 0 else 1.0


def synchronised_max_over_mean(cells) -> float:
    """Σ_m max_r / Σ_m mean_r of per-(micro-batch, rank) values: what synchronised micro-batches
    cost over what perfectly balanced ones would (1.0 when all are zero).

    >>> synchronised_max_over_mean([[2.0, 1.0], [1.0, 1.0]])
    1.2
    """
    cells = np.asarray(cells, dtype=np.float64)
    mean = cells.mean(axis=1).sum()
    return float(cells.max(axis=1).sum() / mean) if mean > 0 else 1.0


def _id_errors(sent: list, received: list) -> tuple[int, int]:
    """(lost, duplicated) sample ids between two sorted global id lists."""
    sent_ids, received_ids = np.asarray(sent), np.asarray(received)
    lost = int(np.setdiff1d(sent_ids, received_ids).size)
    duplicated = int(received_ids.size - np.unique(received_ids).size)
    return lost, duplicated


@dataclass(frozen=True)
class DemoReport:
    """What `run_demo` measured (see the module docstring for the kinds of busy figures).

    Gradient fields: the worst step's difference between the balanced and unbalanced
    all-reduced gradients (`demo.compare_gradients`).  Busy ratios: max/mean over ranks
    per step, and their mean over steps.  Times in seconds; planning and exchange summed
    over steps and averaged over ranks (`..._least_waiting_rank`: per step the rank that
    waited least, an upper bound on the exchange's own cost).
    """

    ranks: int
    steps: int
    dtype: str
    grad_max_abs_diff: float
    grad_max_rel_diff: float
    grad_rel_l2: float
    grad_max_rel_diff_per_tensor: float
    busy_max_over_mean_unbalanced: float
    busy_max_over_mean_balanced: float
    busy_max_over_mean_identical_work: float
    busy_max_over_mean_unbalanced_per_step: list
    busy_max_over_mean_balanced_per_step: list
    busy_max_over_mean_identical_work_per_step: list
    busy_max_over_mean_unbalanced_isolated: float
    busy_max_over_mean_balanced_isolated: float
    busy_max_over_mean_identical_work_isolated: float
    busy_max_over_mean_unbalanced_isolated_per_step: list
    busy_max_over_mean_balanced_isolated_per_step: list
    busy_max_over_mean_identical_work_isolated_per_step: list
    busy_max_over_mean_unbalanced_planned: float
    busy_max_over_mean_balanced_planned: float
    busy_max_over_mean_unbalanced_planned_per_step: list
    busy_max_over_mean_balanced_planned_per_step: list
    busy_seconds_per_rank_balanced: list
    busy_seconds_per_rank_unbalanced: list
    busy_seconds_per_rank_balanced_isolated: list
    busy_seconds_per_rank_unbalanced_isolated: list
    stage_makespan_over_mean_planned: list
    samples_lost: int
    samples_duplicated: int
    exchange_seconds: float
    exchange_seconds_least_waiting_rank: float
    exchange_bytes_sent: int
    planning_seconds: float
    planning_wait_seconds: float
    planning_hidden_fraction: float
    step_seconds: float
    overhead_fraction: float
    overhead_fraction_least_waiting_rank: float
    calibration_seconds: float  # timing the cost models' batches (rank 0, in isolation; 0 with FLOP costs)
    concurrent_seconds: float
    replay_seconds: float
    replay_share: float  # replay_seconds / (wall_seconds - replay_seconds): what the replay adds
    wall_seconds: float
    cost_models: dict
    cost_fit_rel_rms: dict
    num_microbatches: list  # of the balanced step, per step (1 without micro-batching)
    replay_repeats: int  # rounds of the isolated replay
    gradient_terms: int  # the most rows a weight gradient sums over in a step (`rounding_tolerance`)
    max_tokens_per_microbatch: int | None = None
    microbatch_busy_max_over_mean: float | None = None
    microbatch_busy_max_over_mean_isolated: float | None = None
    microbatch_busy_max_over_mean_identical_work_isolated: float | None = None  # its noise floor
    microbatch_busy_max_over_mean_planned: float | None = None
    microbatch_busy_max_over_mean_per_step: list | None = None
    microbatch_busy_max_over_mean_isolated_per_step: list | None = None
    microbatch_busy_max_over_mean_identical_work_isolated_per_step: list | None = None
    microbatch_busy_max_over_mean_planned_per_step: list | None = None
    microbatch_busy_max_over_mean_per_cell: list | None = None  # per step, per micro-batch: max_r / mean_r
    microbatch_busy_max_over_mean_isolated_per_cell: list | None = None
    microbatch_busy_max_over_mean_identical_work_isolated_per_cell: list | None = None
    microbatch_busy_max_over_mean_planned_per_cell: list | None = None

    @property
    def balanced_isolated(self) -> float:
        """The isolated balanced figure the check uses: Σ_m max_r / Σ_m mean_r when micro-batched."""
        if self.max_tokens_per_microbatch is None:
            return self.busy_max_over_mean_balanced_isolated
        return self.microbatch_busy_max_over_mean_isolated

    @property
    def balanced_isolated_floor(self) -> float:
        """The noise floor of `balanced_isolated`: the same figure for identical work on every rank."""
        if self.max_tokens_per_microbatch is None:
            return self.busy_max_over_mean_identical_work_isolated
        return self.microbatch_busy_max_over_mean_identical_work_isolated

    @property
    def gradient_tolerance(self) -> float:
        """The largest relative gradient difference that is still rounding (`rounding_tolerance`)."""
        return rounding_tolerance(self.dtype, self.gradient_terms)

    def to_json(self) -> dict:
        """The report as JSON-serialisable data (the keys are the field names)."""
        return asdict(self)

    def failed_checks(self) -> list[str]:
        """The checks that fail, each as a sentence (empty: the demo passed).

        Gradients within the dtype's rounding tolerance for sums of `gradient_terms` terms
        (micro-batched or not); no sample lost or duplicated; with more than one rank, the isolated
        balanced busy max/mean (`balanced_isolated`) at most BALANCED_ISOLATED_TARGET and below
        the isolated unbalanced one.
        """
        failed = []
        tolerance = self.gradient_tolerance
        if self.grad_max_rel_diff > tolerance:
            failed.append(f"gradients differ by {self.grad_max_rel_diff:.3g} (relative) > {tolerance:.2g}, "
                          f"{self.dtype} rounding of sums of {self.gradient_terms} terms")
        if self.samples_lost or self.samples_duplicated:
            failed.append(f"{self.samples_lost} samples lost, {self.samples_duplicated} duplicated")
        balanced, unbalanced = self.balanced_isolated, self.busy_max_over_mean_unbalanced_isolated
        if self.ranks > 1 and balanced > BALANCED_ISOLATED_TARGET:
            failed.append(f"isolated busy max/mean balanced {balanced:.3f} > {BALANCED_ISOLATED_TARGET} (noise floor "
                          f"{self.balanced_isolated_floor:.3f})")
        if self.ranks > 1 and balanced >= unbalanced:
            failed.append(f"isolated busy max/mean balanced {balanced:.3f} is not below unbalanced {unbalanced:.3f}")
        return failed


def summarize(records: list, ranks: int, steps: int, dtype: str, wall_seconds: float,
              max_tokens_per_microbatch: int | None = None) -> DemoReport:
    """The demo's report from every rank's record (`demo.train`'s return value) and the
    whole run's wall time (start-up, calibration, training and replay)."""
    lost = duplicated = 0
    for step in range(steps):
        for mode in ("ids_unbalanced", "ids_balanced"):
            step_lost, step_duplicated = _id_errors(records[0]["ids_sent"][step], records[0][mode][step])
            lost, duplicated = lost + step_lost, duplicated + step_duplicated

    def per_step(key):
        return [max_over_mean([np.sum(r[key][s]) for r in records]) for s in range(steps)]

    def cells(key, step):  # (micro-batch, rank) values of one step
        return np.array([r[key][step] for r in records], dtype=np.float64).T

    ratios = {f"{name}{suffix}": per_step(key) for name, suffix, key in (
        ("unbalanced", "", "busy_unbalanced"), ("balanced", "", "busy_balanced"),
        ("identical_work", "", "busy_identical"), ("unbalanced", "_isolated", "isolated_unbalanced"),
        ("balanced", "_isolated", "isolated_balanced"), ("identical_work", "_isolated", "isolated_identical"))}
    planned = {mode: [max_over_mean(np.sum(loads, axis=0)) for loads in records[0][f"planned_{mode}"]]
               for mode in ("unbalanced", "balanced")}
    microbatch = {}
    if max_tokens_per_microbatch is not None:
        sources = {"": [cells("busy_balanced", s) for s in range(steps)],
                   "_isolated": [cells("isolated_balanced", s) for s in range(steps)],
                   "_identical_work_isolated": [cells("isolated_identical_cells", s) for s in range(steps)],
                   "_planned": [np.asarray(loads, dtype=np.float64) for loads in records[0]["planned_balanced"]]}
        for suffix, values in sources.items():
            synchronised = [synchronised_max_over_mean(v) for v in values]
            microbatch[f"microbatch_busy_max_over_mean{suffix}"] = float(np.mean(synchronised))
            microbatch[f"microbatch_busy_max_over_mean{suffix}_per_step"] = synchronised
            microbatch[f"microbatch_busy_max_over_mean{suffix}_per_cell"] = [[max_over_mean(c) for c in v]
                                                                             for v in values]
    step_seconds = float(np.mean([sum(r["step_seconds"]) for r in records]))
    exchange = float(np.mean([sum(r["exchange_seconds"]) for r in records]))
    # Every rank leaves a collective together, so a rank's exchange time is its wait for
    # the last one to arrive plus the exchange itself; per step, the least-waiting rank
    # bounds the exchange's own cost from above.
    exchange_least = float(sum(min(r["exchange_seconds"][s] for r in records) for s in range(steps)))
    wait = float(np.mean([sum(r["plan_wait_seconds"]) for r in records]))
    prefetched_planning = float(np.mean([sum(r["planning_seconds"][1:]) for r in records]))
    prefetched_wait = float(np.mean([sum(r["plan_wait_seconds"][1:]) for r in records]))
    replay = float(max(r["replay_seconds"] for r in records))
    return DemoReport(
        ranks=ranks, steps=steps, dtype=dtype,
        **{key: max(d[key] for r in records for d in r["grad_diff"]) for key in records[0]["grad_diff"][0]},
        **{f"busy_max_over_mean_{key}": float(np.mean(values)) for key, values in ratios.items()},
        **{f"busy_max_over_mean_{key}_per_step": values for key, values in ratios.items()},
        **{f"busy_max_over_mean_{mode}_planned": float(np.mean(values)) for mode, values in planned.items()},
        **{f"busy_max_over_mean_{mode}_planned_per_step": values for mode, values in planned.items()},
        busy_seconds_per_rank_balanced=[float(np.sum(r["busy_balanced"])) for r in records],
        busy_seconds_per_rank_unbalanced=[float(sum(r["busy_unbalanced"])) for r in records],
        busy_seconds_per_rank_balanced_isolated=[float(np.sum(r["isolated_balanced"])) for r in records],
        busy_seconds_per_rank_unbalanced_isolated=[float(sum(r["isolated_unbalanced"])) for r in records],
        stage_makespan_over_mean_planned=records[0]["stage_imbalance"],
        samples_lost=lost, samples_duplicated=duplicated,
        exchange_seconds=exchange, exchange_seconds_least_waiting_rank=exchange_least,
        exchange_bytes_sent=int(sum(sum(r["bytes_sent"]) for r in records)),
        planning_seconds=float(np.mean([sum(r["planning_seconds"]) for r in records])),
        planning_wait_seconds=wait,
        planning_hidden_fraction=(max(0.0, 1.0 - prefetched_wait / prefetched_planning)
                                  if prefetched_planning > 0 else 0.0),
        step_seconds=step_seconds,
        overhead_fraction=(exchange + wait) / step_seconds if step_seconds > 0 else 0.0,
        overhead_fraction_least_waiting_rank=(exchange_least + wait) / step_seconds if step_seconds > 0 else 0.0,
        calibration_seconds=float(max(r["calibration_seconds"] for r in records)),
        concurrent_seconds=float(max(r["concurrent_seconds"] for r in records)),
        replay_seconds=replay, wall_seconds=float(wall_seconds),
        replay_share=replay / (wall_seconds - replay) if wall_seconds > replay else float("inf"),
        cost_models=records[0]["costs"], cost_fit_rel_rms=records[0]["fit_errors"],
        num_microbatches=records[0]["num_microbatches"], replay_repeats=records[0]["replay_repeats"],
        gradient_terms=max(records[0]["gradient_terms"]),
        max_tokens_per_microbatch=max_tokens_per_microbatch,
        **microbatch)
