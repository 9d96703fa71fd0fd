"""Repair of a grouping whose micro-batch finds no layout: spill from that micro-batch only.

A fill (`grouping.group_microbatches`) may give a micro-batch whose items fit its D · T tokens in sum
but not by shards: items longer than T need blocks of c ranks with ⌈l / c⌉ tokens free on each, and
the giants' blocks beside them leave less.  Lowering every micro-batch's fill then empties the other
micro-batches too (more of them, each less full).  Instead, micro-batch by micro-batch, in order:

    if micro-batch m has no layout:
        move out of m its items longer than T (never its longest item), least time first, the fewest
            that let m lay out (doubling, then bisection), into micro-batch m + 1 (a new one after the last)
        refill m with m + 1's items within T, longest time first, at most the tokens moved out: the
            longest prefix (one item first, then bisection) whose plan lays out with m's cost no higher
            (a micro-batch costs its max, so work below it is free)

Each micro-batch is planned by the split planner (`plan_pass`), so every plan returned lays out; counts
(not a clock) bound the search, so every rank gets the same plan.
"""

from __future__ import annotations

import numpy as np


def repaired_grouping(microbatch: np.ndarray, lengths: np.ndarray, times: np.ndarray, budget: int,
                      plan_pass, certificates=None) -> tuple[np.ndarray, list] | None:
    """`microbatch` with every micro-batch that has no layout repaired (see the module) and the plans of
    its micro-batches; None when some micro-batch has no layout even with all but its longest item moved.
    `certificates` answer probes without the planner where they can (`microbatch._PassPlans`): `certified_none(
    items)` is True where those items have no layout (`dual_feasible`), which starts each spill's search (without
    it, at one item); `floor(items)` is below the peak of their plan, which settles a refill's probe above its
    cost."""
    microbatch = microbatch.copy()
    passes, m, kept = [], 0, []
    while m <= int(microbatch.max()):
        items = np.flatnonzero(microbatch == m)
        plan = plan_pass(items) if items.size else None
        if items.size and plan is None:
            plan = _spill(microbatch, m, lengths, times, budget, plan_pass, certificates, kept)
            if plan is None:
                return None
        passes.append(plan)
        m += 1
    return microbatch, passes


def _spill(microbatch: np.ndarray, m: int, lengths: np.ndarray, times: np.ndarray, budget: int, plan_pass,
           certificates=None, kept: list | None = None):
    """Micro-batch m's plan after its items longer than T move out, least time first, the fewest that lets it
    lay out (found by galloping or doubling, then bisection: moving more out frees blocks), and its refill from
    micro-batch m + 1 (`_refill`); `microbatch` updated in place; None when none lays out.  The fewest the
    certificate leaves (`_fewest_uncertified`) is tried first: where it lays out it is the fewest (with fewer moved
    out none does), found with one plan; else the search gallops from the count the spill before laid out, or
    doubles from one item as without the certificate (the probes below its count answered by it, unplanned).
    `kept`: the items the certificate's count left and those laid out (None: no count did) in the spills before
    (the last spill's are the guesses this one searches from, `_fewest_laid`; this spill's are appended)."""
    items = np.flatnonzero(microbatch == m)
    keep = items[np.argmax(times[items])]  # the longest item (first by index) defines the micro-batch
    over = items[(lengths[items] > budget) & (items != keep)]
    over = over[np.lexsort((over, times[over]))]
    at, plans = np.searchsorted(items, over), {}  # `items` ascend

    def rest(count: int) -> np.ndarray:  # `items` without the first `count` of `over`, ascending
        kept = np.ones(items.size, dtype=bool)
        kept[at[:count]] = False
        return items[kept]

    def laid(count: int):
        if count not in plans:
            plans[count] = plan_pass(rest(count))
        return plans[count]

    if not over.size:
        return None
    guess = items.size - kept[-1][0] if kept else None
    certified = count = _fewest_uncertified(rest, over.size, certificates, guess)
    failed = count - 1  # the most moved out known not to lay out
    if laid(count) is None:  # not the certificate's count: from the count the spill before kept laid out
        known = kept[-1][1] if kept and kept[-1][1] is not None else None
        found = _fewest_laid(lambda count: laid(count) is None, over.size,
                             None if known is None else items.size - known, certified)
        if found is None:
            if kept is not None:
                kept.append((items.size - certified, None))
            return None
        failed, count = found
    while count - failed > 1:
        middle = (failed + count) // 2
        failed, count = (middle, count) if laid(middle) is None else (failed, middle)
    if kept is not None:
        kept.append((items.size - certified, items.size - count))
    later = np.flatnonzero(microbatch == m + 1)
    microbatch[over[:count]] = m + 1
    return _refill(microbatch, m, rest(count), laid(count), later,
                   int(lengths[over[:count]].sum()), lengths, times, budget, plan_pass, certificates)


def _fewest_laid(fails, most: int, guess: int | None, above: int) -> tuple[int, int] | None:
    """(failed, count): a count of 1 .. `most` whose plan `fails` (0: none known) and a larger one that lays out, the
    fewest that lays out between them (bisected by the caller); None where `most` fails too.  From a `guess` above
    `above` (the certificate's count, which failed), galloping around it (`_around`), as a cascade of spills keeps
    about as many items laid out each (allgiant, D = 512 x 16, seed 11: 192 in 9 spills running, the last failing
    the certificate's count; 10 plans from one item, 2 from the guess); else doubling from one item."""
    if guess is not None and above < guess < most:
        fewest, count = _around(fails, guess, most)
        return None if count == most and fails(most) else (fewest - 1, count)
    failed, count = 0, 1
    while count < most and fails(count):
        failed, count = count, min(2 * count, most)
    return None if fails(count) else (failed, count)


def _fewest_uncertified(rest, most: int, certificates, guess: int | None = None) -> int:
    """The fewest count in 1 .. `most` whose `rest(count)` (a micro-batch's items, that many moved out) is not ruled
    out by `certificates.certified_none` (bisection: moving items out never adds to the certificate's pieces); `most`
    where all are; 1 without `certificates`.  The allbig family (every item 32-64k tokens, T = 32k, D = 512):
    cascading spills of up to 1482 items, 765 probes of which 220 were laid-out plans (1.4 s) before the certificate
    started the search.  With a `guess`, the bisection's range is first narrowed by galloping from it (`_around`):
    the certificate is monotone in the count (fewer items out: the same pieces and more, at the same thresholds and
    more), so the count is the same whatever the probes; a cascade of spills keeps about as many items each
    (allgiant, D = 512 x 16, seed 11: 128 in 20 spills running; its certificates 659 -> 516)."""
    fewest = 1
    if certificates is None or most <= 1:
        return 1
    if certificates.certified_none(rest(most)):
        return most
    if guess is not None and 1 <= guess < most:
        fewest, most = _around(lambda count: certificates.certified_none(rest(count)), guess, most)
    while fewest < most:
        middle = (fewest + most) // 2
        fewest, most = (middle + 1, most) if certificates.certified_none(rest(middle)) else (fewest, middle)
    return fewest


def _around(certified, guess: int, most: int) -> tuple[int, int]:
    """(fewest, most): the range of counts 1 .. `most` holding the least one not `certified` (a monotone test: true
    below some count, false from it on; false at `most`), narrowed by probing `guess`, then away from it by steps
    1, 2, 4, ... in the direction it points."""
    step = 1
    if certified(guess):
        fewest = guess + 1  # certified at guess: the count is above it
        while fewest < most:
            probe = min(guess + step, most)
            if not certified(probe):
                return fewest, probe
            fewest, step = probe + 1, 2 * step
        return fewest, most
    most, fewest = guess, 1
    while most > 1:
        probe = max(guess - step, 1)
        if certified(probe):
            return probe + 1, most
        most, step = probe, 2 * step
    return fewest, most


def _refill(microbatch: np.ndarray, m: int, rest: np.ndarray, plan, later: np.ndarray, room: int,
            lengths: np.ndarray, times: np.ndarray, budget: int, plan_pass, certificates=None):
    """Micro-batch m's plan with a prefix of `later`'s items within T, by time descending, within `room` tokens, that
    lays out at no higher cost than `plan` (m's items `rest`): the longest where that test is monotone in the prefix,
    which the heuristic layout does not promise (else a prefix next to a failing one; rev53 F3: where one item
    fails, none comes back though a longer prefix might lay out): one item first, then bisection (issue 24's
    giant families, D = 64 and 512, seeds 11 and 23: most refills moved back none, after up to 5 plans of a bisection
    from the middle, most of them laid out at a higher cost; 1 now); a prefix whose `certificates.floor` is above that
    cost is not planned (giants_ties, D = 512, T = 32k: 14 of 30 probes, their plans 20-100 ms each)."""
    short = later[lengths[later] <= budget]
    short = short[np.lexsort((short, -times[short]))]
    limit = int(np.searchsorted(np.cumsum(lengths[short]), room, side="right"))
    cost = float(plan.loads.max())

    def fits(count: int):
        items = np.sort(np.concatenate([rest, short[:count]]))
        if certificates is not None and certificates.floor(items) > cost:
            return None
        found = plan_pass(items)
        return found if found is not None and float(found.loads.max()) <= cost else None

    low, best, high = 0, plan, limit
    while low < high:
        middle = (low + high + 1) // 2 if low else 1  # one item first: most refills move back none
        found = fits(middle)
        if found is not None:
            low, best = middle, found
        else:
            high = middle - 1
    microbatch[short[:low]] = m
    return best
