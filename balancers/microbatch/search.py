"""Local search on micro-batch cells: lower Σ_m max_r load(r, m) by moves, swaps and regrouping.

Only the most loaded cell of a micro-batch counts, so every step works on one such cell a
(load L, its micro-batch's second load S) and one item i in it, and takes, over every other
cell b and every item j elsewhere, the change that lowers the objective most:

    move i to b:       a -> L - c_i,          b -> load_b + c_i
    swap i with j:     a -> L - c_i + c_j,    b -> load_b + c_i - c_j      (c_j < c_i)
    change = (new max of a's micro-batch - L) + (rise of b's micro-batch max, if another)

subject to both cells' tokens <= T; ties by the lowest index.  Between passes the cells
are regrouped (`regroup`).  Every item tried costs n + M·D + STEP_WORK
operations of the problem's work budget, so the result never depends on the clock; when
the budget buys fewer than MIN_STEPS steps (2560 ranks × 32 items), only the regrouping runs.
Unpadded cells only (a padded cell's cost is not additive); padded plans are regrouped.
"""

from __future__ import annotations

import numpy as np

from .plan import MicroBatchProblem, cell_loads, cell_token_sums

RELATIVE_GAIN = 1e-12
STEP_WORK = 2_000  # an item's evaluation costs this much beyond its n + M·D array elements (numpy calls)
MIN_STEPS = 8
ROW_CHUNK = 1 << 18  # values one vectorised pass of `_Search.best_change` holds per array


class _Search:
    def __init__(self, problem: MicroBatchProblem, cell_of: np.ndarray, num_microbatches: int):
        self.problem = problem
        self.cell_of = cell_of.copy()
        self.size = num_microbatches * problem.num_ranks
        self.microbatch_of_cell = np.arange(self.size) // problem.num_ranks
        self.refresh()

    def refresh(self) -> None:
        self.loads = np.bincount(self.cell_of, weights=self.problem.item_costs, minlength=self.size)
        self.tokens = cell_token_sums(self.problem, self.cell_of, self.size)
        self.levels = self.loads.reshape(-1, self.problem.num_ranks).max(axis=1)

    def best_change(self, a: int) -> tuple[float, int, int, int]:
        """(change, item, target cell, swapped item or -1) of the best step out of cell a: every item of a at
        once (in rows of at most ROW_CHUNK values), the first strict minimum below 0 in item order, then
        target cell, then partner.  A swap lowers the step only if the partner costs less than the item, by
        less than `reach` (a cell of a's micro-batch must stay below a's load; another's may rise above its
        level by less than a falls to its second): only those partners are evaluated, the least item among
        equal changes taken (`np.argmin` in item order), so the choice is that of every partner."""
        problem, d = self.problem, self.problem.num_ranks
        m = a // d
        own = self.loads[m * d:(m + 1) * d].copy()
        load = own[a - m * d]
        own[a - m * d] = -np.inf
        runner = int(np.argmax(own))
        second = own[runner]
        own[runner] = -np.inf
        third = own.max() if d > 2 else -np.inf
        second = max(second, 0.0) if d > 1 else 0.0
        third = max(third, 0.0)
        runner += m * d
        room = problem.max_tokens_per_microbatch - self.tokens
        excluded = np.where(np.arange(self.size) == runner, third, second)
        alone = self.size == d  # one micro-batch: every cell is a's, no other micro-batch's rise to add
        same = self.microbatch_of_cell == m
        rise = self.levels[self.microbatch_of_cell]
        reach = load - self.loads[m * d:(m + 1) * d].min()
        if not alone:
            reach = max(reach, (load - second) + float((rise - self.loads)[~same].max()))
        reach += 2e-9 * max(load, float(self.levels.max()))  # far past rounding
        items = np.flatnonzero(self.cell_of == a)
        items = items[np.lexsort((items, -problem.item_costs[items]))]
        costs, lengths = problem.item_costs[items], problem.lengths[items]
        by_cost = problem.cost_order[self.cell_of[problem.cost_order] != a]
        rising_costs = -problem.item_costs[by_cost]
        first = np.searchsorted(rising_costs, -costs, "right")
        count = np.maximum(np.searchsorted(rising_costs, reach - costs) - first, 0)
        best = (0.0, -1, -1, -1)
        begin = 0
        for end in _row_chunks(count + self.size):
            rows = slice(begin, end)
            # moves, a row per item
            grown = self.loads + costs[rows, None]
            change = np.maximum(np.maximum(excluded, (load - costs[rows])[:, None]), grown) - load
            if not alone:
                change = np.where(same, change, (np.maximum(second, load - costs[rows]) - load)[:, None]
                                  + np.maximum(grown - rise, 0.0))
            change[(room < lengths[rows, None]) | (np.arange(self.size) == a)] = np.inf
            targets = np.argmin(change, axis=1)
            moves = change[np.arange(targets.size), targets]
            # swaps, the partners of every item one after another (in cost order)
            row = np.repeat(np.arange(end - begin), count[rows])
            starts = np.cumsum(count[rows]) - count[rows]
            partners = by_cost[np.arange(row.size) - starts[row] + first[rows][row]]
            cells = self.cell_of[partners]
            delta = costs[rows][row] - problem.item_costs[partners]
            shift = lengths[rows][row] - problem.lengths[partners]
            new_a, new_b = load - delta, self.loads[cells] + delta
            swaps = np.maximum(np.maximum(excluded[cells], new_a), new_b) - load
            if not alone:
                swaps = np.where(same[cells], swaps,
                                 np.maximum(second, new_a) - load + np.maximum(new_b - rise[cells], 0.0))
            swaps[(delta <= 0) | (room[cells] < shift) | (room[a] < -shift)] = np.inf
            lowest, partner = _lowest_first(swaps, partners, starts, count[rows])
            for k, item in enumerate(items[rows].tolist()):
                if moves[k] < best[0]:
                    best = (float(moves[k]), item, int(targets[k]), -1)
                if partner[k] >= 0 and lowest[k] < best[0]:
                    best = (float(lowest[k]), item, int(self.cell_of[partner[k]]), int(partner[k]))
            begin = end
        return best

    def step(self) -> tuple[bool, int]:
        """Apply the best change out of some micro-batch's most loaded cell; (changed, work).

        A change must gain more than rounding could fake (RELATIVE_GAIN of the total
        cost), so float sums in another order never make the search cycle.
        """
        d = self.problem.num_ranks
        least_gain = RELATIVE_GAIN * float(self.loads.sum())
        work = 0
        by_level = np.lexsort((np.arange(self.levels.size), -self.levels))
        for m in by_level.tolist():
            block = self.loads[m * d:(m + 1) * d]
            a = int(np.argmax(block))
            if d > 1 and np.count_nonzero(block == block[a]) > 1:
                continue  # a tied maximum cannot fall by changing one cell
            change, item, target, swapped = self.best_change(m * d + a)
            tried = int(np.count_nonzero(self.cell_of == m * d + a)) + 1
            work += tried * (self.problem.num_items + self.size + STEP_WORK)
            if change < -least_gain:
                self.cell_of[item] = target
                if swapped >= 0:
                    self.cell_of[swapped] = m * d + a
                self.refresh()
                return True, work
        return False, work


def _row_chunks(weights: np.ndarray) -> list[int]:
    """Ends of consecutive runs of rows whose weights sum to at most ROW_CHUNK (a row alone when heavier)."""
    ends, total = [], 0
    for row, weight in enumerate(weights.tolist()):
        if row and total + weight > ROW_CHUNK:
            ends.append(row)
            total = 0
        total += weight
    return ends + [weights.size]


def _lowest_first(values: np.ndarray, ids: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> tuple:
    """Per run of `values` (`starts`, `counts`): its least value and the least of the `ids` holding it
    (an argmin over the run in id order); (inf, -1) for an empty run."""
    lowest, first = np.full(counts.size, np.inf), np.full(counts.size, -1)
    full = np.flatnonzero(counts)
    if full.size:
        lowest[full] = np.minimum.reduceat(values, starts[full])
        tied = np.where(values == np.repeat(lowest[full], counts[full]), ids, np.iinfo(np.int64).max)
        first[full] = np.minimum.reduceat(tied, starts[full])
    return lowest, first


def regroup(problem: MicroBatchProblem, cell_of: np.ndarray, num_microbatches: int) -> np.ndarray:
    """Cells renumbered so that micro-batch m holds the (m·D .. m·D + D - 1)-th most loaded cells."""
    loads = cell_loads(problem, cell_of, num_microbatches * problem.num_ranks)
    order = np.lexsort((np.arange(loads.size), -loads))  # most loaded first, ties by cell
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    return position[cell_of]


def searches(problem: MicroBatchProblem, num_microbatches: int) -> bool:
    """Whether `improve` searches after regrouping: unpadded items and a budget for MIN_STEPS steps of
    ~8 items (fewer are not worth starting)."""
    step_work = (problem.num_items + num_microbatches * problem.num_ranks + STEP_WORK) * 8
    return not problem.padded and problem.num_items > 0 and step_work * MIN_STEPS <= problem.work_limit


def ends_above(problem: MicroBatchProblem, loads: np.ndarray, budget: int, above: float) -> bool:
    """With one micro-batch (the step cost is max(loads)): whether every plan the search can still
    reach from these cell loads with this budget costs more than `above`.

    A step lowers one cell and raises another, so after k more steps all but 2k cells keep
    their loads bit for bit (each summed over the same items in item order); while the maximum stays
    above `above`, the most loaded cell holds more than above / max c items, each of which costs the
    step its work (`_Search.step`), so the budget buys at most k steps: the (2k + 1)-th largest load
    above `above` is a proof."""
    top = float(problem.item_costs.max()) if problem.num_items else 0.0
    if top <= 0.0 or not loads.size:
        return False
    # fewest items of a cell over `above` (the margin covers float sums of up to ~10**9 items)
    fewest = max(0.0, min(float(problem.num_items), np.floor(above / top * (1.0 - 1e-6)) + 1.0))
    step_work = (int(fewest) + 1) * (problem.num_items + loads.size + STEP_WORK)
    kept = loads.size - 2 * -(-budget // step_work)  # cells no step can reach
    return kept > 0 and float(np.partition(loads, kept - 1)[kept - 1]) > above


def improve(problem: MicroBatchProblem, cell_of: np.ndarray, num_microbatches: int,
            above: float | None = None) -> np.ndarray:
    """Regroup and search until nothing helps or the work budget is spent; cells per item.

    `above` (one micro-batch only): the search stops, its plan so far returned, once its plan
    provably ends costing more than that (`ends_above`): a caller that drops such a plan for one
    of that cost gets the same answer sooner."""
    cell_of = regroup(problem, cell_of, num_microbatches)
    budget = problem.work_limit
    if not searches(problem, num_microbatches):
        return cell_of
    if num_microbatches != 1:
        above = None
    while budget > 0:
        search = _Search(problem, cell_of, num_microbatches)
        changed = False
        while budget > 0:
            if above is not None and ends_above(problem, search.loads, budget, above):
                return search.cell_of
            moved, work = search.step()
            budget -= work
            if not moved:
                break
            changed = True
        cell_of = regroup(problem, search.cell_of, num_microbatches)
        if not changed or np.array_equal(cell_of, search.cell_of):
            break
    return cell_of
