"""Local search on a pipeline step: lower the slowest replica's schedule time.

The step is max_r T_r, T_r the pipeline time of replica r's cells in their order
(`schedules.replica_times`).  Each step takes the slowest replica r (lowest index on ties)
and the best of

    reorder:  swap two of r's slots                          T_r -> T_r(new order)
    move:     item i of r to cell (r', k') of one of the LIGHT_REPLICAS fastest replicas,
              within the token budget T                     T_r, T_r' -> new times

that lowers max(T_r, T_r') below the old T_r by more than RELATIVE_GAIN; ties by the
lowest slot pair, item, replica, slot.  GPipe (uniform stages) offers an item only the least cell of r' that
fits it: its closed form (Σ x + (P - 1)·max x) / P rises with the cell the item joins (one row, not M).

Before these steps, rounds lower many slow replicas at once (`rounds`; unpadded cells): at D = 2560
the shaped start has a few dozen slow replicas, each holding one of the largest items, and a step
lowers one of them by one item.  A round takes the ROUND_REPLICAS slowest replicas (at most
D / (ROUND_ITEMS + 1)); for each, its ROUND_ITEMS items of least promise max(r's time without it,
the fastest replica's time + its cost) (a cell's cost weighs at most 1 in a replica's time), each
offered to its own one of the fastest replicas (the c-th candidates of the slowest replicas to the
fastest ones) in every cell where it fits; every offer that lowers max(T_r, T_r') below r's time
at the round's start is taken (r's own time then timed again when several items left it).  Where a
round leaves the step as it was, the slowest replica takes one full step as below.  Rounds end when
one moves nothing, when WINDOW rounds in a row lowered the step by less than ROUND_GAIN of it, behind a
`rival` where a round's gain, kept up for the whole budget left, stays above it (`_hopeless`; D = 2560 x 32,
M = 32, seed 11: a start 5 % (1F1B) or 24 % (interleaved) above the rival spent 8 / 18 ms in rounds before its
search was dropped), at the floor, or once they evaluated ROUND_TIMINGS rows per replica (the cost of timing the
whole step that many times), fewer where the gap left at their start is small: one per ROUND_GAP of step / floor - 1
(what they may gain at most; the first round always runs; the budget not granted is not `run`'s either).  It
stops once the step is at most `floor`, the larger of the certified lower bound τ·X̄ raised by STOP_GAP (what
is left to gain is less than that: at D = 2560 a step lowers one of thousands of near-tied replicas, the whole
search < 0.15 % for more time than the plain planning) and the certified bound itself (no plan is faster),
when WINDOW steps in a row lowered the step (the max) by less than WINDOW_GAIN of it, or at a window's start
when that is certain (the (WINDOW + 1)-th largest time is already within WINDOW_GAIN of the max), after a step
where the L steps the budget left buys at the charge of those made can lower the step by at most L·LEFT_RATE of it
(and STOP_GAP in all: the (L + 1)-th largest time is that close to the max), and behind a
`rival` (a step the caller found already) at a window's end where the window's gain, kept up for the budget
left, stays above it, or at its start and a window's end where the steps the budget left buys cannot bring it
level (`CellSearch._out_of_reach`).
Candidates are evaluated together, one row each (in runs of at most WALK_ENTRIES operations; a
step with more than MOVE_ROWS move rows tries its swaps alone; a step's moves after its swaps and r's rows
without each item, those that may be its choice alone, `CellSearch._moves_kept`, the others charged as if
timed); a row costs the schedule's operation count (2·P·M·v) of the work budget, so the result never depends on
the clock.  A search that cannot lower enough replicas to reach a rival is not made (`behind`).  Padded
cells (count · max cost) are not additive: only the reordering runs.  With first-stage costs
(`Pipeline.stage_times`), every row carries the cells' first-stage parts too, moved and swapped
with their costs.
"""

from __future__ import annotations

import numpy as np

from .candidates import added, heaviest, lightest, swap_pairs, swapped, without_each
from .schedules import gpipe_time, replica_times
from .spec import Pipeline

LIGHT_REPLICAS = 4
RELATIVE_GAIN = 1e-12
WINDOW, WINDOW_GAIN = 4, 1e-4
ROUND_REPLICAS, ROUND_ITEMS, ROUND_GAIN = 32, 4, 1e-3
ROUND_TIMINGS = 4  # rounds evaluate at most this many rows per replica (D = 2560 x 32, seed 7: 4 vs 8 vs none)
ROUND_GAP = 0.0625  # and one per this much of the gap left (D = 2560 x 32, M = 16, seed 7: 1F1B 4 -> 1 round, ~1 %)
STOP_GAP = 0.005  # seeds 1-2 of bench_pipeline's grid: the largest of 0.002/0.005/0.01 within 0.5 % of no stop
SUMS_DRIFT = 1e-9  # far above how far float sums and walks lie from the exact times (relative)
MOVE_ROWS = 2**16  # a step's move rows at most (D = 2560 x 32, M = 16: ~2000), else it tries swaps alone
WALK_ENTRIES = 2**22  # rows timed at once hold at most this many operations (`_timed`: 32 MB a float array)
LEFT_RATE = 1e-4  # a run's least mean gain a step (D = 2560 x 32, M = 16, seeds 300-309: 1F1B runs of up to 32 steps,
# 37 ms, where the budget left could gain <= 0.8e-4 a step; held out: seeds 390-409, D 64/512)
STAGED_ROWS = 512  # moves kept a step above which one item's are timed first (`_landed`: a walk's own cost ~700 rows)


class CellSearch:
    """Items in cells (replica, slot) of one step, their costs, tokens and replica times."""

    def __init__(self, pipeline: Pipeline, item_costs: np.ndarray, lengths: np.ndarray, padded: bool,
                 cell_cost: np.ndarray, cell_tokens: np.ndarray, replica: np.ndarray, slot: np.ndarray,
                 max_tokens: int, work: int, times: np.ndarray, first: tuple | None = None, floor: float = 0.0,
                 rival: float = np.inf):
        self.pipeline, self.item_costs, self.lengths, self.padded = pipeline, item_costs, lengths, padded
        # the caller's cells until a swap or move first writes them (`_write`: most searches at D = 2560 stall at once)
        self.cost, self.tokens, self.shared = cell_cost, cell_tokens, True
        # `first`: (the cells' first-stage parts, the items'), or None (uniform stages)
        self.first_stage, self.item_first_stage = (None, None) if first is None else first
        self.replica, self.slot = replica, slot
        self.max_tokens, self.work = max_tokens, work
        self.floor = floor  # the step it stops at (0: none)
        self.rival = rival  # a step found already: it stops where its rate cannot reach it (`_hopeless`)
        self.num_ranks, self.num_microbatches = self.cost.shape
        self.row_work = 2 * pipeline.stages * self.num_microbatches * pipeline.virtual_stages
        self.times = times.copy()  # `replica_times` of the cells as given, charged here
        self.moved = set()  # replicas whose costs moves changed by float sums (swaps only permute them)
        self.members = {}  # replica -> its items, ascending: found on first use (a scan of all), kept by moves
        self.work -= self.num_ranks * self.row_work
        self.swaps = swap_pairs(self.num_microbatches)

    def evaluate(self, rows: tuple) -> np.ndarray:
        """Pipeline times of these rows (cell costs, their first-stage parts or None), charged to the budget."""
        self.work -= rows[0].shape[0] * self.row_work
        if self.pipeline.schedule == "gpipe" and rows[1] is None:  # its closed form: the same time, O(M) a row
            return gpipe_time(*self.pipeline.stage_times(rows[0]), self.pipeline.stages)
        return replica_times(self.pipeline, *self.pipeline.stage_times(*rows))

    def _timed(self, build, count: int) -> np.ndarray:
        """`evaluate` of the rows `build(at)` makes for ascending runs `at` of range(count), each of at most
        WALK_ENTRIES operations, the times in order: each row is timed alone, so the same floats as at once, in
        bounded memory (probe26 P26-09: 8 ranks x 1024 items at M 512, P 8 made 7.6 GiB of move rows)."""
        size = max(1, WALK_ENTRIES // self.row_work)
        return np.concatenate([np.zeros(0)] + [self.evaluate(build(np.arange(start, min(start + size, count))))
                                               for start in range(0, count, size)])

    def run(self) -> None:
        """Improve until no step gains, the budget is spent, the step is at most the floor,
        WINDOW steps lowered the step by less than WINDOW_GAIN (many replicas tied at the top: each step
        lowers one), or where the steps the budget left buys can gain little (`_little_left`; before the first, the
        most it buys)."""
        steps, mark, spent, begun = 0, float(self.times.max()), self.work, self.work
        if self._out_of_reach():
            return
        while self.work > 0 and float(self.times.max()) > self.floor:
            if self._little_left(steps, begun):
                return
            steps += 1
            if steps % WINDOW == 0:
                if float(self.times.max()) > mark * (1 - WINDOW_GAIN) or self._hopeless(mark, spent) or \
                        self._out_of_reach():
                    return
                mark, spent = float(self.times.max()), self.work
            if steps % WINDOW in (0, 1) and stalled(self.times, mark):
                return
            if not self._step(int(np.argmax(self.times))):
                return

    def _little_left(self, steps: int, begun: int) -> bool:
        """Whether the steps the budget left buys (L, at the mean charge of the `steps` made since the budget was
        `begun`; before the first, the most it buys, `steps_bought`) can lower the step by at most L·LEFT_RATE of it,
        and STOP_GAP in all: a step lowers one replica and raises none above the old max, so after L steps the max is
        at least the (L + 1)-th largest time now (D = 2560 x 32, M = 32, interleaved, seed 29: L <= 11 for <= 2.5e-4,
        one step ~4 ms, 0.2 of the plain planning)."""
        bought = -(-max(self.work, 0) * steps // max(begun - self.work, 1)) if steps else \
            steps_bought(self.work, len(self.swaps), self.row_work)
        size = self.times.size
        if bought >= size:
            return False
        top = float(self.times.max())
        return top - float(np.partition(self.times, size - bought - 1)[size - bought - 1]) <= \
            top * min(STOP_GAP, bought * LEFT_RATE)

    def behind(self) -> bool:
        """Whether the step is above `rival` by more than SUMS_DRIFT (the planner drops such a search)."""
        return float(self.times.max()) > self.rival * (1 + SUMS_DRIFT)

    def _out_of_reach(self) -> bool:
        """Whether `run` must end `behind`: a step lowers one replica (the slowest) and raises another below its old
        time, and charges its swaps' rows at least (one where none), so after the L steps the budget left buys, the
        step is at least the (L + 1)-th largest time now (a search from a far slower start, D = 2560 x 32, M = 32,
        interleaved: ~13 000 rows walked, then dropped)."""
        steps, size = steps_bought(self.work, len(self.swaps), self.row_work), self.times.size
        return steps < size and float(np.partition(self.times, size - steps - 1)[size - steps - 1]) > \
            self.rival * (1 + SUMS_DRIFT)

    def _hopeless(self, mark: float, spent: int) -> bool:
        """Whether the step, lowered from `mark` while the budget fell from `spent`, stays above `rival` at that
        rate for the budget left (a search behind a step found already, which it would only match by far more work)."""
        behind = float(self.times.max()) - self.rival
        return behind > 0 and (mark - float(self.times.max())) * max(self.work, 0) < behind * (spent - self.work)

    def _step(self, r: int) -> bool:
        """Replica r's best swap or move (module docstring), made when it lowers r; whether it did."""
        target = self.times[r] * (1 - RELATIVE_GAIN)
        swaps = self._swap_rows(r)
        moves = None if self.padded or self.work <= len(self.swaps) * self.row_work else self._move_rows(r)
        if moves is not None and moves[0].size + moves[2][0].size > MOVE_ROWS:
            moves = None  # too many to time in a step: swaps only (probe26 P26-09: 2M rows a step at M 512)
        if moves is None:
            times = self.evaluate(swaps)
        else:  # the swaps' rows and r's without each item, then the moves' that may be the best (`_moves_kept`)
            count, own = len(self.swaps), moves[0].size
            times = self._timed(lambda at: tuple(None if rows is None else np.concatenate([rows[at[at < count]], moved])
                                                 for rows, moved in zip(swaps, moves[-1](at[at >= count] - count))),
                                count + own)
            times = np.concatenate([times, self._landed(times[:count], times[count:], moves)])
        reorder = self._best_swap(times[:len(self.swaps)])
        move = None if moves is None else self._best_move(*moves[:-1], times[len(self.swaps):])
        if reorder is not None and (move is None or reorder[0] <= move[0]) and reorder[0] < target:
            self._swap(r, *reorder[1])
        elif move is not None and move[0] < target:
            self._move(r, *move[1])
        else:
            return False
        return True

    def rounds(self) -> None:
        """Item moves off many slow replicas at once, before `run` (module docstring)."""
        count = round_count(self.num_ranks)
        if self.padded or count < 1:
            return
        done, mark = 0, float(self.times.max())
        self.work -= self.rounds_forfeit()  # nor do `run`'s steps take it
        stop = self.work - int(self._rounds_granted() * self.num_ranks * self.row_work)
        while self.work > max(stop, 0) and float(self.times.max()) > self.floor:
            before, spent = float(self.times.max()), self.work
            if stalled(self.times, before, count + 1, ROUND_GAIN):  # more replicas near the max than a round lowers
                return
            moved = self._round(count)
            if float(self.times.max()) >= before:
                moved += self._step(int(np.argmax(self.times)))
            done += 1
            if not moved or (done % WINDOW == 0 and float(self.times.max()) > mark * (1 - ROUND_GAIN)) or \
                    self._hopeless(before, spent):
                return
            mark = mark if done % WINDOW else float(self.times.max())

    def _rounds_granted(self) -> float:
        """Rows per replica the rounds may time: ROUND_TIMINGS, less where the gap to the floor is small (the most
        the rounds gain)."""
        gap = float(self.times.max()) / self.floor - 1 if self.floor > 0 else np.inf
        return min(ROUND_TIMINGS, gap / ROUND_GAP)

    def rounds_forfeit(self) -> int:
        """The work the rounds give up before they start (ROUND_TIMINGS rows per replica less those granted)."""
        return int((ROUND_TIMINGS - self._rounds_granted()) * self.num_ranks * self.row_work)

    def _round(self, count: int) -> int:
        """One round of `rounds` over the `count` slowest replicas: the number of items moved."""
        slow = heaviest(self.times, count)
        fast = lightest(self.times, count * ROUND_ITEMS).reshape(ROUND_ITEMS, count)  # candidate c of g: fast[c, g]
        owner, is_slow = np.full(self.num_ranks, -1), np.zeros(self.num_ranks, dtype=bool)
        owner[slow], is_slow[slow] = np.arange(count), True
        items = np.flatnonzero(is_slow[self.replica])  # a gather of bytes: 3x faster than of the owners (D·M items)
        group = owner[self.replica[items]]
        by_group = np.argsort(group, kind="stable")
        items, group = items[by_group], group[by_group]
        grids = ((self.cost, self.item_costs), (self.first_stage, self.item_first_stage))
        # a cell's cost weighs at most 1 in a replica's time: the partner's time + the item's cost bounds its new one
        landing = self.times[fast[0, group]] + self.item_costs[items]
        own = np.full(items.size, np.inf)  # r's time without the item: timed where it may be among the least
        timed = _may_lead(self.times[slow[group]], self.item_costs[items], landing, group, count)
        own[timed] = self.evaluate(without_each(grids, self.replica, self.slot, items[timed]))
        self.work -= int(items.size - np.count_nonzero(timed)) * self.row_work  # charged as if timed
        promise = np.maximum(own, landing)
        chosen = _least_per_group(promise, group, count, ROUND_ITEMS)
        nth = np.arange(chosen.size) - np.searchsorted(group[chosen], group[chosen])
        chosen_items, partner = items[chosen], fast[nth, group[chosen]]
        pick, slots = np.nonzero(self.tokens[partner] + self.lengths[chosen_items][:, None] <= self.max_tokens)
        if not pick.size:
            return 0
        # an item lands at most its cost above its partner's time: where that stays below its replica's time without
        # it, every slot it fits ties there and the first is taken (`_least_per_group`), so that one alone is timed
        settled = (self.times[partner] + self.item_costs[chosen_items]) * (1 + SUMS_DRIFT) < own[chosen]
        leaving, ahead = self._known_moves(slow, group[chosen], chosen_items, own[chosen], settled, pick)
        timed = ~settled[pick] | (np.arange(pick.size) == np.searchsorted(pick, pick))
        self.work -= int(pick.size - np.count_nonzero(timed)) * self.row_work  # charged as if timed
        pick, slots = pick[timed], slots[timed]
        def rows(at: np.ndarray) -> tuple:  # the offers' rows, then the known replicas' after their moves
            offer, known = at[at < pick.size], at[at >= pick.size] - pick.size
            return tuple(None if grid is None else np.concatenate([
                added(grid, values, partner[pick[offer]], chosen_items[pick[offer]], slots[offer]), after[known]])
                for (grid, values), after in zip(grids, ahead[1]))
        landed = self._timed(rows, pick.size + ahead[1][0].shape[0])
        landed, ahead_times = landed[:pick.size], landed[pick.size:]
        worst = np.maximum(own[chosen[pick]], landed)
        best = _least_per_group(worst, pick, chosen.size, 1)  # each chosen item's best offer
        best = best[worst[best] < self.times[slow[group[chosen[pick[best]]]]] * (1 - RELATIVE_GAIN)]
        offer = pick[best]
        self._move(slow[group[chosen[offer]]], chosen_items[offer], partner[offer], slots[best], own[chosen[offer]],
                   landed[best])
        moves = np.bincount(group[chosen[offer]], minlength=count)
        known = moves[ahead[0]] == leaving[ahead[0]]  # all (`_known_moves`); else timed below, their charge returned
        self.times[slow[ahead[0][known]]] = ahead_times[known]
        self.work += int(np.count_nonzero(~known)) * self.row_work
        several = moves > 1
        several[ahead[0][known]] = False
        again = slow[several]
        if again.size:  # several items left these: their time is that of none of the single moves
            self.times[again] = self.evaluate(tuple(None if grid is None else grid[again]
                                                    for grid in (self.cost, self.first_stage)))
        return int(moves.sum())

    def _known_moves(self, slow, groups, items, own, settled, fitting) -> tuple:
        """(items leaving each slow replica, (the groups whose moves are known before the offers are timed, their
        replicas' rows after those moves)) of a round (`_round`; per chosen item its group, own time, whether settled,
        and the chosen indices with a fitting slot).  A settled offer ends at own (the partner stays below it), so it is
        taken exactly where own is below r's time; a group of settled or unfitting items alone knows its moves, and
        where several leave, r's time after them is timed with the offers (one walk of the schedule fewer a round)."""
        fits = np.zeros(settled.size, dtype=bool)
        fits[fitting] = True
        leaves = settled & fits & (own < self.times[slow[groups]] * (1 - RELATIVE_GAIN))
        count = slow.size
        leaving = np.bincount(groups[leaves], minlength=count)
        ahead = np.flatnonzero((np.bincount(groups[fits & ~settled], minlength=count) == 0) & (leaving > 1))
        position = np.full(count, -1)
        position[ahead] = np.arange(ahead.size)
        gone = leaves & (position[groups] >= 0)  # in chosen order, as `_move` takes them
        rows = []
        for grid, values in ((self.cost, self.item_costs), (self.first_stage, self.item_first_stage)):
            if grid is None:
                rows.append(None)
                continue
            row = grid[slow[ahead]]
            cells = (position[groups[gone]], self.slot[items[gone]])
            np.subtract.at(row, cells, values[items[gone]])  # `_move`'s float sums, in its order
            np.maximum.at(row, cells, 0)
            rows.append(row if grid is self.cost else np.minimum(row, rows[0]))  # a part at most its cell's cost
        return leaving, (ahead, tuple(rows))

    def _swap_rows(self, r: int) -> tuple:
        """r's cell costs (and first-stage parts) with each pair of `swaps` exchanged, one row per pair."""
        return tuple(None if grid is None else swapped(grid[r], self.swaps) for grid in (self.cost, self.first_stage))

    def _best_swap(self, times: np.ndarray):
        if not times.size:
            return None
        best = int(np.argmin(times))
        return float(times[best]), (int(self.swaps[best, 0]), int(self.swaps[best, 1]), float(times[best]))

    def _items(self, r: int) -> np.ndarray:
        """Replica r's items, ascending (the slowest replica recurs: 68 distinct in 152 steps, D = 2560)."""
        if r not in self.members:
            self.members[r] = np.flatnonzero(self.replica == r)
        return self.members[r]

    def _write(self) -> None:
        """The cells and their items' places copied before the first change (they are the caller's until then)."""
        if self.shared:
            self.cost, self.tokens, self.replica, self.slot = (array.copy() for array in (self.cost, self.tokens,
                                                                                          self.replica, self.slot))
            self.first_stage = None if self.first_stage is None else self.first_stage.copy()
            self.shared = False

    def _swap(self, r: int, first: int, second: int, time: float) -> None:
        self._write()
        for array in (self.cost, self.tokens, self.first_stage):
            if array is not None:
                array[r, [first, second]] = array[r, [second, first]]
        mine = self._items(r)
        slots = self.slot[mine]
        self.slot[mine[slots == first]], self.slot[mine[slots == second]] = second, first
        self.times[r] = time

    def _move_rows(self, r: int):
        """(items, others, fitting (item, other, slot) indices, the rows at given positions of all of them, made on
        demand): r's costs without each of its items, then each light replica's costs with an item added to a slot
        where it fits; None when r has no item or no other replica."""
        items = self._items(r)
        others = lightest(self.times, LIGHT_REPLICAS + 1)
        others = others[others != r][:LIGHT_REPLICAS]
        if not items.size or not others.size:
            return None
        fit = self.tokens[others][None, :, :] + self.lengths[items][:, None, None] <= self.max_tokens  # item, other, M
        if self.pipeline.schedule == "gpipe" and self.first_stage is None:  # (Σ x + (P - 1)·max x) / P, any order:
            # an item's cell in another replica times it no faster than its least cell that fits (the first on ties)
            least = np.argmin(np.where(fit, self.cost[others][None, :, :], np.inf), axis=2)
            fit &= np.arange(self.num_microbatches) == least[:, :, None]
        fits = np.nonzero(fit)
        item_index, other_index, slot_index = fits  # r's rows without each item, then each fit's other row with it
        grids = ((self.cost, self.item_costs), (self.first_stage, self.item_first_stage))

        def rows(at: np.ndarray) -> tuple:  # rows `at` of them all, ascending
            own, fit = at[at < items.size], at[at >= items.size] - items.size
            return tuple(None if grid is None else np.concatenate([left, added(
                grid, values, others[other_index[fit]], items[item_index[fit]], slot_index[fit])])
                for (grid, values), left in zip(grids, without_each(grids, self.replica, self.slot, items[own])))
        return items, others, fits, rows

    def _landed(self, swap_times: np.ndarray, own_times: np.ndarray, moves: tuple) -> np.ndarray:
        """The others' times with each move's item (`moves` of `_move_rows`; r's times without each, `own_times`), +inf
        where not timed: the moves that may be the step's choice (`_moves_kept`), and where more than STAGED_ROWS are,
        the item's of least own time first (ties by index): a move whose own time is above the least of their
        worse times is not the best (D = 2560 x 32, M = 32, interleaved: 1920 moves kept a step, then 128 timed, none
        after).  Those not timed are charged as if timed: the budget as before."""
        items, others, fits, rows = moves
        landed, kept = np.full(fits[0].size, np.inf), self._moves_kept(swap_times, own_times, items, others, fits)
        if kept.size > STAGED_ROWS:
            own = own_times[fits[0][kept]]
            first = kept[fits[0][kept] == fits[0][kept[np.argmin(own)]]]
            landed[first] = self._timed(lambda at: rows(items.size + first[at]), first.size)
            kept = kept[(own <= np.maximum(own_times[fits[0][first]], landed[first]).min()) & np.isinf(landed[kept])]
        landed[kept] = self._timed(lambda at: rows(items.size + kept[at]), kept.size)
        self.work -= int(np.count_nonzero(np.isinf(landed))) * self.row_work
        return landed

    def _moves_kept(self, swap_times: np.ndarray, own_times: np.ndarray, items: np.ndarray, others: np.ndarray,
                    fits: tuple) -> np.ndarray:
        """The moves (indices into `fits`, ascending) that may be `_step`'s choice: those whose replica's time without
        the item (`own_times`, which the move keeps) is at most a time some swap or move surely reaches, the best
        swap's or max(own, the other's time + the item's cost) (a cell's cost weighs at most 1 in a replica's time;
        SUMS_DRIFT for the walks' rounding).  Every other move ends above that, so it is neither the best move nor,
        tied, the first, nor better than the swap (D = 2560 x 32: 1F1B M 16 192-256 of 1920 move rows kept, interleaved
        M 32 1920 of 4096, `_landed` times 128 of those)."""
        item_index, other_index, _ = fits
        own = own_times[item_index]
        landing = (self.times[others[other_index]] + self.item_costs[items[item_index]]) * (1 + SUMS_DRIFT)
        reach = min(float(swap_times.min(initial=np.inf)), float(np.maximum(own, landing).min(initial=np.inf)))
        return np.flatnonzero(own <= reach)

    def _best_move(self, items: np.ndarray, others: np.ndarray, fits: tuple, times: np.ndarray):
        """The best move's (worse of the two new times, (item, other, slot, r's time, other's time))."""
        item_index, other_index, slot_index = fits
        if not item_index.size:
            return None
        own_times, new_times = times[:items.size], times[items.size:]
        worst = np.maximum(own_times[item_index], new_times)
        best = int(np.argmin(worst))
        i, o, k = items[item_index[best]], others[other_index[best]], slot_index[best]
        return float(worst[best]), (int(i), int(o), int(k), float(own_times[item_index[best]]),
                                    float(new_times[best]))

    def _move(self, sources, items, others, slots, own_times, other_times) -> None:
        """Each item (one or an array of them) moved from its replica in `sources` to cell (other, slot), in this
        order, the replicas then timed `own_times` and `other_times`; no replica both gives and takes one, and the
        sources' times are stale where several items left one (`_round` times those again)."""
        sources, items, others, slots = (np.atleast_1d(array) for array in (sources, items, others, slots))
        self._write()
        cells = self.slot[items]
        for grid, values in ((self.cost, self.item_costs), (self.tokens, self.lengths),
                             (self.first_stage, self.item_first_stage)):
            if grid is not None:
                np.subtract.at(grid, (sources, cells), values[items])  # in order: a cell's float sum as one by one
                # below 0 only by rounding, the cell then emptied: clamped after each or after all, this 0
                np.maximum.at(grid, (sources, cells), 0)
                np.add.at(grid, (others, slots), values[items])
        if self.first_stage is not None:  # a part at most its cell's cost (float sums of what is left may cross)
            self.first_stage[sources, cells] = np.minimum(self.first_stage[sources, cells], self.cost[sources, cells])
        self.replica[items], self.slot[items] = others, slots
        for r, other, item in zip(sources.tolist(), others.tolist(), items.tolist()):
            if r in self.members:
                self.members[r] = self.members[r][self.members[r] != item]
            if other in self.members:
                self.members[other] = np.insert(self.members[other], np.searchsorted(self.members[other], item), item)
        self.times[sources], self.times[others] = own_times, other_times
        self.moved.update(sources.tolist(), others.tolist())


def _may_lead(times: np.ndarray, costs: np.ndarray, landing: np.ndarray, group: np.ndarray, groups: int
              ) -> np.ndarray:
    """Which items may be among the ROUND_ITEMS of least promise max(own, landing) of their group (`_round`), own
    their replica's time without them, untimed: it lies in [time - cost, time] (a cell's cost weighs at most 1 in a
    replica's time; SUMS_DRIFT for the walks' rounding), so an item whose least promise is above its group's
    ROUND_ITEMS-th least greatest one is not (D = 2560 x 32, M = 16: 1F1B 960 -> ~450 rows timed a round).  That bar
    is max(time, the ROUND_ITEMS-th least landing) (its group's time is one): the time where that many land at most
    there, else found by sorting those groups' items alone.

    >>> costs = np.array([1.0, 2.0, 3.0, 0.5, 5.0, 9.0])  # one replica of time 10, its partner's 8
    >>> _may_lead(np.full(6, 10.0), costs, 8.0 + costs, np.zeros(6, dtype=np.int64), 1).tolist()
    [True, True, True, True, False, False]
    """
    level = times * (1 + SUMS_DRIFT)
    bar = np.full(groups, -np.inf)
    bar[group] = level
    few = np.bincount(group[landing <= level], minlength=groups) < ROUND_ITEMS
    if few.any():
        mine = np.flatnonzero(few[group])
        most = np.maximum(level[mine], landing[mine])
        chosen = _least_per_group(most, group[mine], groups, ROUND_ITEMS)
        bar[few] = -np.inf
        np.maximum.at(bar, group[mine[chosen]], most[chosen])
    return np.maximum(times * (1 - SUMS_DRIFT) - costs, landing) <= bar[group]


def _least_per_group(values: np.ndarray, group: np.ndarray, groups: int, count: int) -> np.ndarray:
    """Indices of the `count` least values of each group in [0, groups) (ties by index), by group.

    >>> _least_per_group(np.array([3.0, 1.0, 2.0, 5.0, 4.0]), np.array([0, 0, 0, 1, 1]), 2, 2).tolist()
    [1, 2, 4, 3]
    """
    order = np.lexsort((np.arange(values.size), values, group))
    ranked = group[order]
    return order[np.arange(order.size) - np.searchsorted(ranked, np.arange(groups))[ranked] < count]


def steps_bought(work: int, swaps: int, row_work: int) -> int:
    """The most steps of `run` a budget of `work` buys: each charges its `swaps` rows at least (one where none)."""
    return -(-max(work, 0) // (max(swaps, 1) * row_work))


def round_count(num_ranks: int) -> int:
    """The slow replicas a round lowers (`rounds`): ROUND_REPLICAS, at most D / (ROUND_ITEMS + 1)."""
    return min(ROUND_REPLICAS, num_ranks // (ROUND_ITEMS + 1))


def stalled(times: np.ndarray, mark: float, count: int = WINDOW, gain: float = WINDOW_GAIN) -> bool:
    """Whether `count` steps must end in a stall: a step lowers one replica and raises none above the old
    max, so after `count` steps the max is at least the (`count` + 1)-th largest time now (> `mark`·(1 - gain))."""
    if times.size <= count:
        return False
    return float(np.partition(times, times.size - count - 1)[times.size - count - 1]) > mark * (1 - gain)
