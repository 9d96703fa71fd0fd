"""The shaped starts of the pipeline planner (`planner`): the items cut afresh into cells of the schedule's best
shape by one LPT over all M·D cells (`lpt_shaped`), the replicas that take the items overflowing a cell alone
starting their other cells higher (`_starts`), and where more than D items overflow (two such starts, of which
1F1B and interleaved search the faster) the first's cells from below (`first_from_below`), which often show it
the slower without its LPT over every item.
"""

from __future__ import annotations

import numpy as np

from ..kernels.lpt import greedy_from, greedy_prefix
from ..microbatch.cells import lpt_cells
from ..microbatch.plan import MicroBatchProblem, cell_token_sums
from ..problem import token_sums
from ..sums import rounding_unit
from .profile import best_profile, pinned_scales
from .spec import Pipeline

SCALE_RANGE, SCALE_STEPS = 4.0, 12  # the level scale's range and bisection steps (`_starts`)
PINNED_SHARE = 0.16  # GPipe's second shaped start made, however slow its start, where the D largest hold this
PINNED_SPREAD = 1.25  # the D largest items' spread (largest / D-th) above which 1F1B's second start is made alone
SECOND_PREFIX = 4  # the second start's cells from below take its LPT's first 4·D choices (`first_from_below`)
FEW_PREFIX = 0.75  # the first's, where at most M·D items (one a cell or fewer), the first 3/4 of its choices


def _layout(problem: MicroBatchProblem, m: int, pipeline: Pipeline, mean: float) -> tuple | None:
    """`lpt_shaped`'s (offsets per placeholder, their unit, the placeholders' base, slot_of): cell k·D + r holds
    the k-th placeholder (by -(base + offset), index), run in slot slot_of[k]; None where the offsets count more
    units than float64 holds (the overhead ~1e300 times the costs, probe59 P1: no shaped start, it would hold NaN)."""
    shape = best_profile(pipeline, m)[1]
    offsets = mean * (shape.max() - shape)
    top = float(problem.sorted_costs[0]) if problem.num_items else 0.0
    unit = rounding_unit(problem.sorted_costs)
    with np.errstate(over="ignore"):
        offsets = offsets / unit
    if not np.isfinite(offsets).all():
        return None
    offsets = np.round(offsets) * unit
    base = 2.0 * top if top > 0 else 1.0
    return offsets, unit, base, np.lexsort((np.arange(m), -(base + offsets)))


def lpt_shaped(problem: MicroBatchProblem, num_microbatches: int, pipeline: Pipeline, mean: float,
               most: bool = False) -> tuple | None:
    """(replica, slot) per item of cells cut afresh into the schedule's best shape x (`profile.best_profile`),
    and their `cell_accounts` (loads, tokens), (M, D) each, where the integer LPT below summed them (else None):
    LPT over all M·D cells within the budget (`microbatch.cells.lpt_cells`), the D cells of slot k starting
    X̄·(max x - x_k) up so that they end near X̄·x_k (X̄ = `mean` = Σ c / D + M·o), replica r running cell
    k·D + r in slot k; None where LPT finds no room or the offsets overflow (`_layout`).  The placeholders cost
    2·max c + the offsets rounded to 2**-30 of max c (to whole units below 2**30 where the costs are integers),
    so integer costs stay on LPT's integer keys (`lpt`: loads below 2**53 units); there, and where the cells fit
    the budget uncapped, the same LPT runs from the offsets as start loads (`lpt.greedy_from`), without the
    placeholders, its exact sums the cells' costs.  The start loads are raised where items overflow a cell
    (`_starts`; `most`: where more than D do, the D largest)."""
    m, d = num_microbatches, problem.num_ranks
    if (layout := _layout(problem, m, pipeline, mean)) is None:
        return None
    offsets, unit, base, slot_of = layout
    replica_of, slot_of_cell = np.tile(np.arange(d), m), np.repeat(slot_of, d)
    start = _starts(problem, pipeline, mean, offsets, slot_of, unit, most)
    greedy = greedy_from(problem.sorted_costs, m * d, problem.cost_order, start, problem.lengths)
    if greedy is not None:
        cell, sums, tokens = greedy  # the tokens where the plain planner's LPT summed them (flat shape)
        tokens = cell_token_sums(problem, cell, m * d) if tokens is None else tokens
        if tokens.max() <= problem.max_tokens_per_microbatch:
            in_slots = np.argsort(slot_of)  # row k: the cells run in slot k
            return (np.take(replica_of, cell), np.take(slot_of_cell, cell),
                    (sums.reshape(m, d)[in_slots], tokens.reshape(m, d)[in_slots]))
    cell = lpt_cells(problem, m, offsets, base)  # capped where the budget needs it
    return None if cell is None else (np.take(replica_of, cell), np.take(slot_of_cell, cell), None)


def overflowing(problem: MicroBatchProblem, pipeline: Pipeline, num_microbatches: int, mean: float) -> int:
    """How many items overflow the best shape's largest target X̄·x_top alone (cost + o above it), up to D + 1."""
    top = mean * float(best_profile(pipeline, num_microbatches)[1].max())
    cells = problem.sorted_costs[:problem.num_ranks + 1] + problem.microbatch_overhead
    return int(np.searchsorted(-cells, -top, side="left"))


def pinned_heavy(problem: MicroBatchProblem) -> bool:
    """Whether the D largest items hold at least PINNED_SHARE of the work: there GPipe's second shaped start (those
    items pinned) searched to steps up to 12 % faster than the first's though it started slower (bench_pipeline's
    long mix: 0.18-0.55 at M 8-16), where below (default, vision: 0.10-0.13; long at M 32: 0.10-0.12) it ended
    slower (`planner._shaped_starts`)."""
    return float(problem.sorted_costs[:problem.num_ranks].sum()) >= PINNED_SHARE * problem.total_cost


def second_alone(problem: MicroBatchProblem, num_microbatches: int, pipeline: Pipeline) -> bool:
    """Whether 1F1B and interleaved make the second shaped start alone where more than D items overflow a cell
    (`planner._shaped_starts`), the first neither bounded (`first_from_below`) nor made: where the D largest items
    hold less than PINNED_SHARE of the work (`pinned_heavy`) and the largest is above PINNED_SPREAD times the D-th,
    more than M·D items would let the bound be made, and (1F1B) M <= 4·P.  There its probe replicas ran 1.2-1.24x
    the second's step (D = 2560 x 32, M = 16), and no held-out row made the first; the bound was ~0.12 of the
    planning there (issue 28).  The first searched to steps up to 0.1 % faster where the D largest were alike
    (long_tail, 48 samples a replica: one capped length) and started up to 14 % faster at M = 8·P (1F1B, M = 32,
    P = 4, default and vision, D = 512)."""
    d = problem.num_ranks
    return problem.num_items > num_microbatches * d and not pinned_heavy(problem) and \
        float(problem.sorted_costs[0]) > PINNED_SPREAD * float(problem.sorted_costs[d - 1]) and \
        (pipeline.schedule == "interleaved" or num_microbatches <= 4 * pipeline.stages)


def _starts(problem: MicroBatchProblem, pipeline: Pipeline, mean: float, offsets: np.ndarray, slot_of: np.ndarray,
            unit: float, most: bool = False) -> np.ndarray:
    """`lpt_shaped`'s start loads of the cells (cell k·D + r in slot slot_of[k]), rounded to `unit`: the offsets,
    and where at most D items overflow the largest target X̄·x_top alone (cost + o above it), the other cells of
    the replicas that take them start higher.

    LPT puts the largest items first on the cells of least start, ties by index: item j < k in cell k0·D + j
    (k0 the first slot of the largest target).  Such an item makes its replica slow in any cell; there the
    other cells are filled to λ_j·s·their target (`profile.pinned_scales`: the time of replica j then meets the
    target's, scaled by s), and s, the level every other cell is filled to, is where the replicas hold every
    cost: D·X̄ = (D - k)·s·X̄ + Σ_j (c_j + o) + λ_j·s·(X̄ - X̄·x_top) (bisected).  More than D such items (a
    replica would hold several; D = 2560 × 32 at M = 16: 9000-12000): the offsets alone, or with `most` the D
    largest taken so (the other cells then fill unevenly: at D = 2560, M = 16 the 1F1B and interleaved starts
    1.065 and 1.022x the bound, GPipe 1.65x, where the offsets alone give 1.38, 1.25 and 1.54x; `arrange` times
    both and searches the faster, GPipe both)."""
    m, d = slot_of.size, problem.num_ranks
    start, shape = offsets[slot_of], best_profile(pipeline, m)[1]
    pinned = overflowing(problem, pipeline, m, mean)
    pinned = min(pinned, d) if most else pinned
    if pinned == 0 or pinned > d or m == 1 or not mean > 0:  # mean 0: costs below float64's least (5e-324 / D)
        return np.repeat(start, d)
    k0 = int(np.argmin(start))  # the first placeholder of least offset (largest target): slot slot_of[k0]
    target = mean * shape
    ratios, scales = pinned_scales(pipeline, m)
    cells, rest = (problem.sorted_costs[:pinned] + problem.microbatch_overhead) / mean, 1.0 - float(shape.max())
    low, high = 1.0, SCALE_RANGE  # s, bisected: what the replicas hold, over X̄, rises with it
    for _ in range(SCALE_STEPS):
        level = 0.5 * (low + high)
        held = (d - pinned) * level + float(cells.sum()) + float(np.interp(cells / level, ratios, scales).sum()) \
            * level * rest
        low, high = (level, high) if held < d else (low, level)
    kept = np.interp(cells / high, ratios, scales)
    start = np.round(high * (float(target.max()) - target[slot_of]) / unit) * unit
    starts = np.repeat(start[:, None], d, axis=1)  # (M, D): row k the k-th placeholder's cells
    starts[:, :pinned] += np.round((1 - kept)[None, :] * high * target[slot_of][:, None] / unit) * unit
    starts[k0, :pinned] = start[k0]
    return starts.ravel()


def first_from_below(problem: MicroBatchProblem, num_microbatches: int, pipeline: Pipeline, mean: float,
                     most: bool = False) -> np.ndarray | None:
    """Cells (D, M) at most the costs of the first shaped start's where more than D items overflow a cell alone
    (`lpt_shaped` from the offsets alone: `_starts`; with `most` the second's, the D largest pinned), from its LPT's
    first M·D choices (with `most` SECOND_PREFIX·D: the pinned replicas hold its step, met from 2·D choices at
    D = 2560 x 32, M = 16, seeds 7 and 11, ~0.9 ms against ~1.5 for M·D; where at most M·D items, the first FEW_PREFIX
    of them: D = 2560 x 32, M = 32, seeds 7, 13, 29, their probe replicas 1.04-1.05x (1F1B) and 1.16-1.17x
    (interleaved) the second's step, at half the items 1.01-1.02x / 1.11-1.12x, at a quarter 0.90x / 1.01x; ~1.7 ms
    against ~3 for the whole start) (`lpt.greedy_prefix`: they are the whole LPT's, exact), or None where they may
    not be its cells' (LPT not on exact integer keys, or those items over the budget: its capped LPT from the same
    offsets, `lpt_cells`, takes them alike only within it) or they are all its items.  Each of its cells holds them and
    more (costs >= 0), and a replica's time never falls where a cell's cost rises (`schedules.step_rows`), so their
    replicas' times are at most the start's: where one runs longer than the other start's step, it is the slower
    without its LPT over every item (D = 2560 x 32, M = 16: the first 40 960 of 81 920 items; the first start's probe
    replicas 1.2-1.24x the second's step; the second's (GPipe) meet its step).  With `most`, only where the raised
    LPT over every item fits the budget (else that start is the capped LPT from the offsets alone, not bounded here:
    the planner's choice of starts is then a heuristic, never a wrong plan).  Uniform stages."""
    m, d = num_microbatches, problem.num_ranks
    cells = m * d
    count = min(SECOND_PREFIX, m) * d if most else cells if problem.num_items > cells else \
        int(FEW_PREFIX * problem.num_items)
    if problem.num_items <= count:
        return None
    if (layout := _layout(problem, m, pipeline, mean)) is None:
        return None
    offsets, unit, base, slot_of = layout
    start = _starts(problem, pipeline, mean, offsets, slot_of, unit, most)
    prefix = greedy_prefix(problem.sorted_costs, cells, start, count, base)
    if prefix is None:
        return None
    cell, loads = prefix  # cell of the j-th largest item
    if token_sums(cell, problem.lengths[problem.cost_order[:count]], cells).max() > problem.max_tokens_per_microbatch:
        return None
    return loads.reshape(m, d)[np.argsort(slot_of)].T + problem.microbatch_overhead
