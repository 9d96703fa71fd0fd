"""Exact min-max balancing for padded (fixed-shape) batches: sorted runs + exact parametric search.

minimise max_r |r| · f(max_{i on r} l_i)  subject to  |r| · max_{i on r} l_i <= cap, i.e.

    minimise max(loads) where loads[r] = len(items[r]) * f(max(lengths[i] for i in items[r]))
    (0 for an empty rank) and len(items[r]) * max(lengths[i] for i in items[r]) <= cap.

Structure (exchange argument).  Sort the items by length, longest first.  Take any
optimal plan and the rank R holding the longest item, with c items.  Swap R's items for
the c longest items overall: R keeps count c and maximum l_1, so its cost and tokens are
unchanged; every other rank gives away items and receives ones no longer than them, so
its count stays and its maximum cannot grow: cost and tokens do not increase (f is
non-decreasing).  Repeat on the remaining ranks and items: an optimal plan exists in
which every rank holds a contiguous run of the sorted items.  The same swap, read with
costs rounded to float64 (rounding is monotone), holds for the exact float arithmetic in
which `rank_loads` scores a plan, so the optimum found here is exact for that scoring.

Algorithm.  For a makespan T, a run starting at sorted item i can take
k = min(kT, floor(cap / l_i), items left) items, kT the largest k with k · f(l_i) <= T.
Taking the longest feasible run first is optimal (what is left is a suffix of what any
other choice leaves), so T is feasible iff the greedy needs <= D runs.  The optimum is
one of the values k · f(l_i).  The search probes the lower bound max(f(l_1), sum f / D),
then where the greedy's run count would reach D were it inversely proportional to T (a
secant step), galloping when probes keep falling on one side and bisecting once the
optimum is bracketed whenever two probes have not halved the bracket (run counts are
steps, so near the optimum the secant can crawl), always snapping both ends to such
values: a feasible probe lowers the upper end to the makespan the greedy actually
reached, an infeasible one raises the lower end to the next value at which one of its
first D + 1 runs could grow (below that they are unchanged, hence still too many).  It
ends when the two ends meet, so the answer is exact with no floating-point tolerance.  A
probe costs O(B) numpy work for the B distinct lengths plus one Python step per stretch
of consecutive blocks whose runs take the same number of items (at most B); with the
sort, O(n log n + B · probes), about 3-25 probes (8 for the audio stage at 2560 ranks).
Source: the sorted-runs structure is the classic argument for bottleneck 1-D
partitioning (Pinar & Aykanat 2004, "Fast optimal load balancing algorithms for 1D
partitioning"); guarantee: optimal.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ..problem import INT64_MAX, InfeasibleError, KernelResult, Problem, Status, as_lengths, sorted_order
from ..validation import as_int


class _Runs:
    """Length-sorted items grouped in blocks of equal length, for probing makespans T.

    Block b holds sorted positions [ends[b-1], ends[b]) with item cost costs[b], and a
    rank led by one of its items may hold at most room[b] items under the cap.
    """

    def __init__(self, sorted_lengths: np.ndarray, sorted_costs: np.ndarray, cap: int | None):
        n = int(sorted_lengths.size)
        self.num_items = n
        ends = np.append(np.flatnonzero(np.diff(sorted_lengths)) + 1, n)
        self.sizes = np.diff(np.concatenate(([0], ends)))
        firsts = ends - self.sizes
        self.ends_array = ends
        self.ends = ends.tolist()
        self.costs = sorted_costs[firsts]
        block_lengths = sorted_lengths[firsts]
        if cap is None:
            room = np.full(ends.size, n, dtype=np.int64)
        else:  # a cap past int64 binds no rank: every padded rank's tokens fit int64 (`check_token_range`)
            room = np.where(block_lengths > 0, min(cap, INT64_MAX) // np.maximum(block_lengths, 1), n)
        self.room = np.minimum(room, n)
        self.positive = self.costs > 0

    def counts(self, makespan: float) -> np.ndarray:
        """Per block, the largest k <= room with k · cost <= makespan (exact float compare)."""
        if makespan == math.inf:
            return self.room.copy()
        costs = self.costs
        with np.errstate(divide="ignore", invalid="ignore"):
            guess = np.where(self.positive, np.floor(makespan / costs), np.inf)
        count = np.minimum(guess, self.room + 1).astype(np.int64)
        # The quotient may be one off in floating point: step to the exact largest k.
        while True:
            over = self.positive & (count > 0) & (count * costs > makespan)
            if not over.any():
                break
            count -= over
        while True:
            under = self.positive & (count < self.room) & ((count + 1) * costs <= makespan)
            if not under.any():
                break
            count += under
        return np.minimum(count, self.room)

    def probe(self, makespan: float, num_ranks: int,
              starts: list[int] | None = None) -> tuple[bool, float, float, int]:
        """Greedy runs under `makespan`: (feasible, makespan reached, next value to try, runs).

        When infeasible, every value below the third entry is infeasible too.  When
        feasible, the second entry is a feasible value no larger than `makespan`.  Run
        starts (sorted positions) are appended to `starts` when it is given.
        """
        count = self.counts(makespan)
        grows = count < self.room  # runs the makespan cuts short: they grow at (k+1)·cost
        # Stretches: maximal ranges of blocks with the same run size and `grows`.  Runs
        # starting anywhere in a stretch all take the same number of items, so the walk
        # below jumps a whole stretch at a time.
        changes = np.flatnonzero((count[1:] != count[:-1]) | (grows[1:] != grows[:-1])) + 1
        stretch_end = self.ends_array[np.append(changes, count.size) - 1].tolist()
        limits = count[np.concatenate(([0], changes))].tolist()
        ends, n = self.ends, self.num_items
        start = runs = block = stretch = 0
        groups: list[tuple[int, int, int]] = []  # (first block, last block, run size) of full runs
        proof = None  # groups up to the (D+1)-th run, which alone prove infeasibility
        last_run = 0.0
        while start < n:
            stretch = bisect.bisect_right(stretch_end, start, stretch)
            block = bisect.bisect_right(ends, start, block)
            limit = limits[stretch]
            if limit == 0:
                groups.append((block, block, 0))
                runs = num_ranks + 1
                break
            left = n - start
            if left <= limit:
                if starts is not None:
                    starts.append(start)
                last_run = left * float(self.costs[block])
                runs += 1
                break
            full = min(-(-(stretch_end[stretch] - start) // limit), left // limit)
            if starts is not None:
                starts.extend(range(start, start + full * limit, limit))
            last_block = bisect.bisect_right(ends, start + (full - 1) * limit, block)
            groups.append((block, last_block, limit))
            runs += full
            start += full * limit
            block = last_block
            if proof is None and runs > num_ranks:
                proof = len(groups)
        first, last, size = np.asarray(groups[:proof], dtype=np.int64).reshape(-1, 3).T
        # Costs fall along the sorted order: a group's costliest run starts in its first
        # block, and its runs grow first where the cost is lowest, in its last block.
        reached = max(float((size * self.costs[first]).max(initial=0.0)), last_run)
        growing = grows[first]
        next_value = float(((size[growing] + 1) * self.costs[last[growing]]).min(initial=math.inf))
        return runs <= num_ranks, reached, next_value, runs

    def optimum(self, num_ranks: int) -> float | None:
        """Smallest feasible makespan (exact), or None when the cap alone needs > D runs."""
        feasible, high, _, _ = self.probe(math.inf, num_ranks)
        if not feasible:
            return None
        # Every plan costs at least the longest item and the mean of sum f(l) (a padded
        # rank costs at least the sum of its items).  The float sum may round up: step
        # down a little so the bound never excludes the exact optimum.
        total = math.fsum((self.sizes * self.costs).tolist()) / num_ranks
        low = min(max(total * (1.0 - 1e-9), float(self.costs[0])), high)
        # Try the lower bound, then where the greedy's runs would number D were they
        # inversely proportional to the makespan (a secant step: runs · makespan varies
        # slowly), capped just below the best feasible value found, where an infeasible
        # probe proves that value optimal.  Probes that keep falling on one side gallop
        # away from it (steps growing 4x from 2**-10); a bracket that two probes did not
        # halve is bisected.
        mid, last_feasible, step, widths = low, None, 0.0, []
        while low < high:
            feasible, reached, next_value, runs = self.probe(mid, num_ranks)
            step = step * 4 if feasible == last_feasible else 2.0**-10
            if feasible:
                high, guess = reached, min(mid * runs / num_ranks, reached * (1.0 - step))
            else:
                low, guess = next_value, max(mid * runs / num_ranks, next_value * (1.0 + step))
            if feasible or widths:  # both ends come from probes: the optimum is bracketed
                widths.append(high - low)
                if len(widths) > 2 and widths[-1] > 0.5 * widths[-3]:
                    guess = low + (high - low) * 0.5
            mid, last_feasible = max(low, min(guess, math.nextafter(high, 0.0))), feasible
        return high


def min_cap(lengths, num_ranks) -> int:
    """Smallest `max_tokens_per_rank` for which a padded plan exists (count · max l per rank)."""
    lengths = as_lengths(lengths)
    num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
    sorted_lengths = lengths[sorted_order(lengths)]
    runs = _Runs(sorted_lengths, sorted_lengths.astype(np.float64), None)
    return int(runs.optimum(num_ranks))


def solve(problem: Problem) -> KernelResult:
    """Exact optimum of the padded cost; raises InfeasibleError naming the smallest cap."""
    order = problem.length_order
    runs = _Runs(problem.lengths[order], problem.item_costs[order], problem.max_tokens_per_rank)
    best = runs.optimum(problem.num_ranks)
    if best is None:
        needed = min_cap(problem.lengths, problem.num_ranks)
        raise InfeasibleError(
            f"no padded plan fits max_tokens_per_rank={problem.max_tokens_per_rank} on "
            f"{problem.num_ranks} ranks (count · max length per rank); the smallest cap that "
            f"works is {needed}", min_cap=needed)
    starts: list[int] = []
    runs.probe(best, problem.num_ranks, starts)
    sizes = np.diff(np.append(starts, problem.num_items))
    assignment = np.empty(problem.num_items, dtype=np.int64)
    assignment[order] = np.repeat(np.arange(len(starts), dtype=np.int64), sizes)
    return KernelResult(assignment, Status.OPTIMAL, lower_bound=best)
