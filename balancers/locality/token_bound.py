"""The token-bound rounds of `take_anywhere` (`deal.take_anywhere`), where LPT rounds place one item or a few.

    while the least-loaded rank has no token room for the largest waiting item:
        if some k-th least-loaded rank fits the k-th largest item with a margin: the deal of those ranks
        else: an LPT round: the largest item to the least-loaded rank with token room (above no target
            there), and each other k-th largest item that fits the k-th least-loaded rank

Where token room binds (a nearly full micro-batch) thousands of such rounds come in a row, most
placing one item.  They make exactly the choices of those rounds made one by one from scratch, at
O(log) a round but for the few rounds in which a rank may pair (`_Streak`), and with the ranks kept
by (load, rank) through them with no sort.  The deal rounds between them in which the least-loaded
rank has token room again and few ranks keep (one, mostly) are made in the same streak.
"""

from __future__ import annotations

import numpy as np

from ..kernels.lpt import round_length
from .partial_plan import PartialPlan

NEVER = 2**62  # the first fit of a rank that fits no waiting item (`_Streak.first_fits`)
ROUNDING = 8 * np.finfo(np.float64).eps  # a relative slack above any rounding of a sum or difference
STREAK_KEEPERS = 8  # a streak makes the deal rounds in which at most this many ranks keep (each moved up, O(D))


def _deal(state: PartialPlan, waiting: np.ndarray, count: int, width: int, keeping: np.ndarray, ranks: np.ndarray,
          margin: float, most: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` waiting items dealt round robin to `width` ranks, of which those at `keeping`
    (`ranks` theirs) keep the longest prefix of their deal that fits (summed cost a hair short of the
    target, tokens within the cap); returns the kept items' indices in `waiting`, pass by pass, and
    their ranks.  `most`, where every item costs the same, every sum of costs is exact (`PartialPlan.exact_cost`)
    and no cap binds: the most copies of the cost within target - margin; a rank holding m of them then keeps the
    first most - m of its deal, the same prefix read without the items' costs and running sums."""
    index = keeping + width * np.arange(-(-count // width))[:, None]  # every keeping rank's deal, pass by pass
    inside = index < count
    if most is not None:
        held = np.rint(state.loads[ranks] / state.exact_cost).astype(np.int64)
        fits = np.arange(index.shape[0])[:, None] < most - held
    else:
        items = waiting[np.where(inside, index, 0)]
        fits = (state.loads[ranks] + np.cumsum(np.where(inside, state.costs[items], 0.0), axis=0)
                <= state.target - margin)
        if state.cap < np.inf:
            fits &= state.tokens[ranks] + np.cumsum(np.where(inside, state.lengths[items], 0.0), axis=0) <= state.cap
    passes, columns = np.nonzero(fits & inside)  # running sums only grow: a prefix of every rank's deal
    return index[passes, columns], ranks[columns]


def _by_load(loads: np.ndarray, ranks: np.ndarray, num_ranks: int) -> np.ndarray:
    """The permutation that puts `ranks` (of `loads`, nearly sorted) in (load, rank) order: a stable sort of the
    loads (a few runs), then of (run of equal loads, rank) where it left equal loads out of rank order."""
    moved = np.argsort(loads, kind="stable")
    ranks, loads = ranks[moved], loads[moved]
    tied = loads[1:] == loads[:-1]
    if (tied & (ranks[1:] < ranks[:-1])).any():
        run = np.concatenate(([0], np.cumsum(~tied)))
        moved = moved[np.argsort(run * num_ranks + ranks, kind="stable")]
    return moved


def _resort(loads: np.ndarray, order: np.ndarray) -> None:
    """Re-sort `order`, the ranks by (load, rank) before some loads grew, in place (`_by_load`); the same as
    `ranks_by_load`, without sorting from scratch."""
    order[:] = order[_by_load(loads[order], order, loads.size)]


def _token_bound_rounds(state: PartialPlan, waiting: np.ndarray, allowed: int, margin: float, order: np.ndarray,
                        window: int) -> tuple[np.ndarray, int]:
    """The next rounds of `take_anywhere` (at most `allowed` LPT rounds) from one in which the least-loaded
    rank has no token room for the largest item, while some rank has; returns the items still waiting and
    the LPT rounds done.  A round in which the least-loaded rank has token room is take_anywhere's deal
    (`_Streak.first_kept`): made here where 1 to STREAK_KEEPERS ranks keep (most such rounds mid-streak),
    else the streak ends (take_anywhere deals, an LPT round where none keeps, and starts a new one).

    Such a round is the deal of the ranks that keep their first item (`_deal`), or, if none does,
    an LPT round: its largest item to the least-loaded rank with token room (so above no target
    there) and each other k-th largest item that fits the k-th least-loaded rank (`_lpt_round`).
    Where token room binds, thousands of rounds in a row are such, most placing one item: each
    round here costs O(log) but the few that may pair (`_Streak`), and the ranks stay sorted by
    moving the ranks that took items (`order`, the ranks by (load, rank), kept in place).
    """
    if state.cap == np.inf or state.tokens[order[0]] + state.lengths[waiting[0]] <= state.cap:
        return waiting, 0
    streak, rounds = _Streak(state, waiting, order), 0
    while rounds < allowed and streak.front < streak.waiting.size:
        position = streak.token_room()
        if position is None:
            break
        if not position:  # the least-loaded rank has token room: take_anywhere's deal, here where few ranks keep
            roomy, keeping = streak.first_kept(margin)
            if not 0 < keeping.size <= STREAK_KEEPERS:
                break
            streak.deal(roomy, window * roomy, keeping, margin)
            continue
        if streak.front >= streak.bound:
            roomy, keeping = streak.keeping(margin)
            if keeping.size:
                streak.deal(roomy, window * roomy, keeping, margin)
                continue
            pairs = streak.pairs()
            pairs = pairs[pairs != position]
            if pairs.size:
                rounds += 1
                streak.place(np.concatenate(([0], pairs)), np.concatenate(([position], pairs)))
                continue
            streak.next_bound(position)
        if streak.bound - streak.front > 1 and allowed - rounds > 1:
            rounds += streak.place_run(position, min(streak.bound - streak.front, allowed - rounds))
            continue
        rounds += 1
        streak.place_first(position)
    return streak.waiting[streak.front:], rounds


class _Streak:
    """Token-bound rounds over `waiting` from `front` on and the ranks in `order` (kept sorted in place,
    with their loads and tokens): the k-th rank pairs with the k-th item from the front when it fits it.

    Pairs are checked (O(D)) only from round `bound` on, a lower bound of the first round in which
    a rank pairs: the waiting costs descend and so does the running minimum of their lengths, so no
    rank fits an item before its `first_fit` (`first_fits`); a rank not moved stays in place or moves
    down one place a round, so it pairs no earlier than when the front reaches first_fit - position.
    """

    def __init__(self, state: PartialPlan, waiting: np.ndarray, order: np.ndarray):
        self.state, self.order, self.front, self.waiting = state, order, 0, waiting.copy()
        costs, lengths = state.costs[waiting], state.lengths[waiting]
        self.values = np.stack((costs, lengths, -costs, -np.minimum.accumulate(lengths)))
        self.costs, self.lengths, self.negated_costs, self.negated_least = self.values  # views: kept through `taken`
        self.monotone = bool((self.negated_least == -self.lengths).all())  # else a fit may come before a checked item
        self.sorted_loads, self.sorted_tokens = state.loads[order], state.tokens[order]
        self.slack = 4 * np.finfo(np.float64).eps * state.target
        # Ranks too loaded for the last item, or past the last one, never pair unless they take items
        paired = min(waiting.size, _below(self.sorted_loads, state.target - self.costs[-1], self.slack))
        self.steps = np.arange(order.size)  # the positions, sliced where a round needs a run of them
        self.first_fit = np.full(order.size, NEVER, dtype=np.int64)  # by position, kept in `order`'s order
        self.first_fit[1:paired] = self.first_fits(self.sorted_loads[1:paired], self.sorted_tokens[1:paired])
        self.sorted = (order, self.sorted_loads, self.sorted_tokens, self.first_fit)  # the arrays kept by position
        self.prefix, self.prefix_tokens = 0, np.inf  # the ranks before `prefix` hold `prefix_tokens` or more
        self.reset()

    def first_fits(self, loads, tokens):
        """For ranks holding `loads` and `tokens`, a lower bound of the first waiting item that fits each
        (as rounded: a slack keeps it a bound), NEVER or above where none does."""
        target, cap = self.state.target, self.state.cap
        first = np.maximum(self.negated_costs.searchsorted(loads - target - ROUNDING * (target + abs(loads))),
                           self.negated_least.searchsorted(tokens - cap - ROUNDING * cap))
        return first + (first >= self.costs.size) * NEVER

    def first_fit_of(self, rank: int) -> int:
        """`first_fits` of one rank, in Python floats (the same IEEE sums, without arrays of one)."""
        load, held = float(self.state.loads[rank]), float(self.state.tokens[rank])
        target, cap = self.state.target, self.state.cap
        first = max(int(self.negated_costs.searchsorted(load - target - ROUNDING * (target + abs(load)))),
                    int(self.negated_least.searchsorted(held - cap - ROUNDING * cap)))
        return first + NEVER if first >= self.costs.size else first

    def reset(self) -> None:
        """The bound over the ranks paired with an item."""
        end = min(self.order.size, self.waiting.size - self.front)
        self.bound = int((self.first_fit[1:end] - self.steps[1:end]).min()) if end > 1 else NEVER

    def token_room(self) -> int | None:
        """The position of the least-loaded rank with token room for the first item (0: not a token-bound
        round); None where none has."""
        length, cap, tokens = self.lengths[self.front], self.state.cap, self.sorted_tokens
        if tokens[0] + length <= cap:
            return 0
        start = self.prefix if self.prefix_tokens + length > cap else 0  # the ranks before it have no room
        if tokens[start] + length <= cap:
            return start  # rounds that take one item move ranks at or past it only
        position = start + int(np.argmax(tokens[start:] + length <= cap))
        if tokens[position] + length > cap:
            return None
        self.prefix_tokens = min(self.prefix_tokens if start else np.inf, tokens[start:position].min())
        self.prefix = position
        return position

    def first_kept(self, margin: float) -> tuple[int, np.ndarray]:
        """Where the least-loaded rank has token room, `take_anywhere`'s deal round: how many ranks have room
        for the first item, and the positions of the ranks of its deal that keep their first item
        (`deal._first_kept`)."""
        front, state = self.front, self.state
        roomy = _fitting(self.sorted_loads, float(self.costs[front]), state.target)
        stop = front + min(roomy, self.waiting.size - front)  # the deal's width
        fits = self.sorted_loads[:stop - front] + self.costs[front:stop] <= state.target - margin
        fits &= self.sorted_tokens[:stop - front] + self.lengths[front:stop] <= state.cap
        return roomy, np.flatnonzero(fits)

    def pairs(self) -> np.ndarray:
        """The positions k >= 1 whose rank fits the k-th item from the front."""
        front, target = self.front, self.state.target
        paired = min(self.waiting.size - front, self.order.size)
        paired = min(paired, _below(self.sorted_loads, target - self.costs[front + paired - 1], self.slack))
        return np.flatnonzero((self.sorted_loads[1:paired] + self.costs[front + 1:front + paired] <= target)
                              & (self.sorted_tokens[1:paired] + self.lengths[front + 1:front + paired]
                                 <= self.state.cap)) + 1

    def keeping(self, margin: float) -> tuple[int, np.ndarray]:
        """How many ranks have room for the first item (at most as many as items wait), and the positions k >= 1
        among them whose rank keeps the k-th item from the front in the deal of a round of `take_anywhere` (its
        first pass pairs the ranks as the LPT round; cost a hair short of the target, tokens within the cap): the
        positions of `pairs` that keep, checked over those ranks alone."""
        front, state = self.front, self.state
        roomy = _fitting(self.sorted_loads[:self.waiting.size - front], float(self.costs[front]), state.target)
        fits = self.sorted_loads[1:roomy] + self.costs[front + 1:front + roomy] <= state.target - margin
        fits &= self.sorted_tokens[1:roomy] + self.lengths[front + 1:front + roomy] <= state.cap
        return roomy, np.flatnonzero(fits) + 1

    def next_bound(self, position: int) -> None:
        """After the pairs were checked and none found but at `position` (the rank that takes the first
        item): with lengths descending, a flagged rank that does not fit its item fits none before it."""
        end = min(self.order.size, self.waiting.size - self.front)
        rounds = self.first_fit[1:end] - self.steps[1:end]
        if position <= rounds.size:
            rounds[position - 1] = NEVER  # found anew once it takes the item
        late = np.flatnonzero(rounds <= self.front)
        if late.size and self.monotone:
            self.first_fit[late + 1] = self.front + late + 2
            rounds[late] = self.front + 1
        self.bound = int(rounds.min()) if rounds.size else NEVER

    def place_first(self, position: int) -> None:
        """An LPT round that places the first item alone, on the rank at `position`."""
        rank = int(self.order[position])
        self.state.put_one(int(self.waiting[self.front]), rank)
        moved_to = self.move_up(position)
        self.first_fit[moved_to] = first_fit = self.first_fit_of(rank)
        self.bound = min(self.bound, first_fit - moved_to)
        self.front += 1

    def place_run(self, position: int, most: int) -> int:
        """Rounds that each place their first item alone, none of which can pair (at most `most`): the
        ranks from `position` on take the items one each, in order, while the heap loop would
        (`round_length`: no rank that took one comes back first), each has token room for its item,
        the ranks before still have none, and no rank that took one can pair; returns how many."""
        state, order, front = self.state, self.order, self.front
        size = min(most, self.waiting.size - front, order.size - position)
        lengths = self.lengths[front:front + size]
        tokens = self.sorted_tokens[position:position + size] + lengths
        fine = (tokens <= state.cap) & (self.prefix_tokens + lengths > state.cap)
        size = int(np.argmin(fine)) if not fine.all() else size
        held = self.sorted_loads[position:position + size]
        loads = held + self.costs[front:front + size]
        if size > 1 and not held[-1] < loads[:-1].min():  # else no rank that took one comes back first, at once
            size = round_length(held, order[position:position + size], self.costs[front:front + size])
            loads = loads[:size]
        first_fit = self.first_fits(loads, tokens[:size])
        # the rank that took the j-th item can pair from round first fit - position (at most where the
        # ranks loaded up to its new load are): the run stops before the first such round after it
        pairs_from = np.minimum.accumulate(first_fit - self.sorted_loads.searchsorted(loads, side="right"))
        fine = np.arange(front + 2, front + size + 1) <= pairs_from[:-1]
        size = int(np.argmin(fine)) + 1 if not fine.all() else size
        ranks = order[position:position + size]  # `put`, its sums made above (the sorted arrays mirror the state's)
        state.destinations[self.waiting[front:front + size]], state.loads[ranks], state.tokens[ranks] = \
            ranks, loads[:size], tokens[:size]
        end = int(self.sorted_loads.searchsorted(loads[:size].max(), side="right"))  # the ranks past it stay
        for values, taken in zip(self.sorted[1:], (loads, tokens, first_fit)):
            values[position:position + size] = taken[:size]  # the loads and tokens the state now holds
        self.resort(position, end, size)  # the ranks before `position` are loaded less
        self.front += size
        self.bound = min(self.bound, int(pairs_from[size - 1]))  # the ranks before `position` stay in place
        return size

    def place(self, items: np.ndarray, positions: np.ndarray) -> None:
        """An LPT round that places the `items` from the front on the ranks at `positions`."""
        if items.size == 1:
            self.state.put_one(int(self.waiting[self.front + items[0]]), int(self.order[positions[0]]))
        else:
            self.state.put(self.waiting[self.front + items], self.order[positions])
        self.taken(self.front + items, positions)

    def deal(self, roomy: int, dealt: int, keeping: np.ndarray, margin: float) -> None:
        """The deal of the round, in which the ranks at `keeping` keep their first item (`_deal`)."""
        waiting = self.waiting[self.front:]
        count = min(waiting.size, dealt)
        if keeping.size == 1 and not self._keeps_second(int(keeping[0]), min(roomy, count), count, margin):
            self.place(keeping, keeping)  # the one rank keeps its first item alone (most such rounds)
            return
        items, ranks = _deal(self.state, waiting, count, min(roomy, count), keeping, self.order[keeping], margin)
        if items.size == keeping.size:  # one item a rank: the same sums as put_runs'
            self.state.put(waiting[items], ranks)
        else:
            self.state.put_runs(waiting[items], ranks)
        self.taken(self.front + items, keeping)

    def _keeps_second(self, position: int, width: int, count: int, margin: float) -> bool:
        """Whether the rank at `position` keeps the second item `_deal` deals it (the (position + width)-th from the
        front; none from `count` on) after its first (the position-th): that test of `_deal`, in its sums."""
        second = position + width
        if second >= count:
            return False
        state, rank, first, second = self.state, self.order[position], self.front + position, self.front + second
        if not state.loads[rank] + (self.costs[first] + self.costs[second]) <= state.target - margin:
            return False
        return state.cap == np.inf or state.tokens[rank] + (self.lengths[first] + self.lengths[second]) <= state.cap

    def resort(self, start: int, end: int, size: int) -> None:
        """`_resort` of the ranks at positions `start` to `end` (their loads now in `sorted_loads` there; those
        from `start` + `size` on still sorted), with their arrays by position, the loads read from those arrays.
        Where the first `size` all load more than the rest (most runs: ranks that took an item above the target),
        they are sorted alone and go past the rest, which moves down (slices, no sort of the rest)."""
        loads, middle = self.sorted_loads, start + size
        if middle < end and not loads[start:middle].min() > loads[end - 1]:
            moved = _by_load(loads[start:end], self.order[start:end], self.order.size)
            for values in self.sorted:
                values[start:end] = values[start:end][moved]
            return
        moved = np.lexsort((self.order[start:middle], loads[start:middle]))
        for values in self.sorted:
            taken = values[start:middle][moved]
            values[start:end - size] = values[middle:end]
            values[end - size:end] = taken

    def move_up(self, position: int) -> int:
        """Keep the ranks by (load, rank) (`order`) and their arrays by position sorted after the rank at
        `position` took an item (its load grew): move it up to its place, no sort; returns that place."""
        order, sorted_loads = self.order, self.sorted_loads
        rank = order[position]
        load, later = self.state.loads[rank], sorted_loads[position + 1:]
        end = position + int(later.searchsorted(load))
        if end + 1 < sorted_loads.size and sorted_loads[end + 1] == load:  # ties go by rank
            tied = position + int(later.searchsorted(load, side="right"))
            end += int(order[end + 1: tied + 1].searchsorted(rank))
        for values, value in zip(self.sorted, (rank, load, self.state.tokens[rank], self.first_fit[position])):
            values[position:end] = values[position + 1: end + 1]
            values[end] = value
        return end

    def taken(self, items: np.ndarray, positions: np.ndarray) -> None:
        """After the ranks at `positions` took the waiting `items` (indices from the front on): the items
        leave, those before the last of them moving up into their places (the front moves past them:
        O(distance), not O(n)), so each rank's first fit counts the items gone from it on; the ranks
        move up (from the last)."""
        window = self.first_fit[1:min(self.order.size, self.waiting.size - self.front)]  # the others never pair
        front = self.front
        if items.size == 1:  # most rounds: the items before it move up one place
            last = int(items[0]) + 1
            self.waiting[front + 1:last], self.values[:, front + 1:last] = self.waiting[front:last - 1], \
                self.values[:, front:last - 1]
            self.front = front + 1
            window += window < last
        else:
            items = np.sort(items)
            last = int(items[-1]) + 1
            staying = np.ones(last - front, dtype=bool)
            staying[items - front] = False
            staying = front + np.flatnonzero(staying)
            self.front = last - staying.size
            self.waiting[self.front:last], self.values[:, self.front:last] = self.waiting[staying], \
                self.values[:, staying]
            window += items.size - items.searchsorted(window)
        least_grew = False  # whether a rank before `prefix` holding its least tokens took an item
        for position in (positions.tolist() if positions.size == 1 else np.sort(positions)[::-1].tolist()):
            rank = int(self.order[position])
            least_grew |= position < self.prefix and not self.sorted_tokens[position] > self.prefix_tokens
            moved_to = self.move_up(position)
            self.first_fit[moved_to] = self.first_fit_of(rank)
            self.prefix -= position < self.prefix <= moved_to  # the rank at `prefix` moved down one place
        # the ranks before `prefix` still have no token room for the items they had none for, their least
        # tokens as a scan from the first rank would find them (the same runs): only a rank that held them
        # and took an item (or left) may change them
        if least_grew:
            self.prefix_tokens = self.sorted_tokens[:self.prefix].min() if self.prefix else np.inf
        self.reset()


def _below(sorted_loads: np.ndarray, bound: float, slack: float) -> int:
    """How many of `sorted_loads` (ascending) are at most `bound` + `slack`: the k-th waiting item fits
    (load + cost <= target, rounded) only on ranks below target - cost + slack, and the costs descend,
    so the pairs of a round lie in that prefix of the ranks."""
    return int(np.searchsorted(sorted_loads, bound + slack, side="right"))


def _fitting(sorted_values: np.ndarray, add: float, limit: float) -> int:
    """`np.count_nonzero(sorted_values + add <= limit)` for ascending `sorted_values`: a rounded sum grows with
    its terms, so those that pass are a prefix, found by a binary search and a few steps over equal values."""
    count, size = int(sorted_values.searchsorted(limit - add, side="right")), sorted_values.size
    while count < size and sorted_values[count] + add <= limit:
        count = int(sorted_values.searchsorted(sorted_values[count], side="right"))
    while count and not sorted_values[count - 1] + add <= limit:
        count = int(sorted_values.searchsorted(sorted_values[count - 1], side="left"))
    return count
