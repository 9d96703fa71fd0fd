"""Best-fit decreasing on the tokens, into as many cells of room T as it opens (the tight packing).

    for item in items, longest first (ties by index):
        cell = the cell of least room >= length (ties: the lowest cell), else an untouched one
        room[cell] -= length

Best fit takes an untouched cell (room T, the lowest first) only where no other has room, so with
more cells it makes the same choices: one packing answers every number of cells, the cells it opens
deciding where it fits (`cells.tight_cells`).  `reference.best_fit_cells` is the item-by-item loop,
the oracle of the tests; this module makes its choices in far fewer Python steps:

- items by classes T/(k+1) < l <= T/k, k = 1 .. CLASSES, longest first: the rooms >= l form a stack (the
  least on top), which rooms join as l falls; each item takes the top.  Within a class a room r takes
  between max(1, r // (T/k)) and r // (T/(k+1)) items while it stays on the stack (an untouched cell
  exactly one number of them), so where both agree it is that many copies of one cell on the stack, and
  the items are matched to the copies as parentheses by their depth (`_class_window`); a room where they
  differ is checked after the matching, which holds up to the first item it changes;
- the rest by runs: k items of one length l at once, the cells with room >= l by (room, cell) each taking
  room // l of them before the next (its room left stays the least >= l), one step per room used up.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..orders import sealed

CLASSES = 6  # classes T/(k+1) < l <= T/k matched in numpy; shorter items go by runs
MAX_ROUNDS = 8  # windows of one class (each ends where a room of unsure count changes the matching)
MAX_UNSURE = 16  # rooms of unsure count a window checks one by one; more: the rest go by runs


def best_fit(lengths: np.ndarray, order: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """(cell per item, cells opened) of best-fit decreasing into as many cells of room `cap` as it
    opens (each item at most `cap`; `order`: longest first, ties by index)."""
    ordered = lengths[order]
    first, rooms = _by_classes(ordered, cap)
    cell_of = np.empty(lengths.size, dtype=np.int64)
    taken, times, opened = _by_runs(ordered[first.size:], rooms, cap)
    cell_of[order] = np.concatenate((first, np.repeat(np.array(taken, dtype=np.int64), times)))
    return sealed(cell_of), opened


def _by_classes(ordered: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(cells of the longest items of `ordered`, room left in every cell opened): the classes
    cap/(k+1) < l <= cap/k for k up to CLASSES, while each takes at most MAX_ROUNDS windows."""
    rooms, placed, start = np.zeros(0, dtype=np.int64), [np.zeros(0, dtype=np.int64)], 0
    for k in range(1, CLASSES + 1):
        shortest, longest = cap // (k + 1), cap // k  # shortest < l <= longest
        end = start + int(np.count_nonzero(ordered[start:] > shortest))
        for _ in range(MAX_ROUNDS):
            if start == end:
                break
            window = _class_window(ordered[start:end], rooms, cap, shortest, longest)
            if window is None:
                break
            cells, rooms = window
            placed.append(cells)
            start += cells.size
        if start < end:
            break
    return np.concatenate(placed), rooms


def _class_window(lengths: np.ndarray, rooms: np.ndarray, cap: int, shortest: int,
                  longest: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Best fit of the first items of `lengths` (longest first, all in (shortest, longest]) into cells
    0, 1, ... with `rooms` and untouched ones: (their cells, the rooms left, opened cells appended); None
    where more than MAX_UNSURE rooms have an unsure count.

    The rooms >= the shortest item join the stack in (room, cell) order, descending, each as its count
    of copies (a room of unsure count as its most); counting +copies per room in, -1 per item, an item
    that finds the stack empty opens a cell (its count of copies less the one it takes): the walk's new
    lows at -1, -(f+1), -(2f+1), ... for f copies of an untouched cell.  Every other item takes the copy
    on top, the last one put at the depth it leaves: parentheses matched by depth.
    """
    elements = np.flatnonzero(rooms >= lengths[-1])
    elements = elements[np.argsort(rooms[elements], kind="stable")[::-1]]  # by (room, cell) descending: as they join
    values = rooms[elements]
    copies, fewest = values // (shortest + 1), np.maximum(values // longest, 1)
    if np.count_nonzero(fewest != copies) > MAX_UNSURE:
        return None
    fresh = cap // longest  # an untouched cell's count, sure: cap // (shortest + 1) too
    events = elements.size + lengths.size
    item_at = np.arange(lengths.size) + np.searchsorted(-values, -lengths, side="right")
    joined = np.flatnonzero(np.bincount(item_at, minlength=events) == 0)
    step = np.full(events, -1, dtype=np.int64)
    step[joined] = copies
    walk = np.cumsum(step)
    low = np.minimum.accumulate(np.minimum(walk, 0))
    opening = (walk[item_at] < np.concatenate(([0], low[:-1]))[item_at]) & ((-walk[item_at] - 1) % fresh == 0)
    put = np.zeros(events, dtype=np.int64)  # copies each event puts on the stack
    put[joined] = copies
    put[item_at[opening]] = fresh - 1
    took = _matched(walk + fresh * ((fresh - 1 - low) // fresh), put, item_at[~opening])
    cell_at = np.full(events, -1, dtype=np.int64)
    cell_at[joined] = elements
    cell_at[item_at[opening]] = rooms.size + np.arange(int(np.count_nonzero(opening)))
    valid = _first_change(lengths, values, took[item_at], item_at, joined, fewest != copies)
    cells = cell_at[took[item_at[:valid]]]
    left = np.concatenate((rooms, np.full(int(np.count_nonzero(opening[:valid])), cap, dtype=np.int64)))
    np.subtract.at(left, cells, lengths[:valid])
    return cells, left


def _matched(depth: np.ndarray, put: np.ndarray, closing: np.ndarray) -> np.ndarray:
    """The event whose copy each event takes (itself where it takes none): `depth` the stack's copies
    after each event, `put` the copies it puts there, `closing` the events that take the top copy.
    A row per copy at its level, and one per closing event at the level it leaves, in time order;
    sorted by level (stably), each closing row follows the copy it takes."""
    rows = put.copy()
    rows[closing] += 1
    total = int(rows.sum())
    owner = np.repeat(np.arange(depth.size), rows)
    level = np.repeat(depth - put - np.cumsum(rows) + rows, rows) + np.arange(total) + 1
    if total and level.max() < 2**16:
        level = level.astype(np.uint16)  # a stable sort of 16-bit keys is a radix sort
    by_level = np.argsort(level, kind="stable")
    position = np.empty(total, dtype=np.int64)
    position[by_level] = np.arange(total)
    took = np.arange(depth.size)
    took[closing] = owner[by_level[position[np.cumsum(rows)[closing] - 1] - 1]]
    return took


def _first_change(lengths: np.ndarray, values: np.ndarray, took: np.ndarray, item_at: np.ndarray,
                  joined: np.ndarray, unsure: np.ndarray) -> int:
    """How many items the matching places as best fit does: all but from the first item that a room of
    unsure count changes.  Such a room, after an item took it, either left the stack (below the next
    item) while the matching has it taken again, or comes back at its smaller room; or it stayed below
    the item's length, where a room joining after it with as much room belongs under it, not on top."""
    valid = lengths.size
    for element in np.flatnonzero(unsure).tolist():
        items = np.flatnonzero(took == joined[element])
        if not items.size:
            continue
        left = values[element] - np.cumsum(lengths[items])
        following = np.append(lengths[1:], 0)[items]  # the next item's length (none after the last)
        gone = np.flatnonzero(left < following)
        if gone.size:
            first = int(gone[0])
            if first + 1 < items.size:
                valid = min(valid, int(items[first + 1]))  # taken again after it left
            if left[first] >= lengths[-1]:  # back at its room left: the first item it fits takes it
                valid = min(valid, int(items[first]) + 1
                            + int(np.count_nonzero(lengths[items[first] + 1:] > left[first])))
        below = np.flatnonzero((left >= following) & (left < lengths[items]))
        if below.size:  # the first room to join after it: under it where it has as much room
            after = np.searchsorted(joined, item_at[items[below]])
            crossed = np.flatnonzero((after < joined.size)
                                     & (values[np.minimum(after, joined.size - 1)] >= left[below]))
            if crossed.size:
                valid = min(valid, int(np.searchsorted(item_at, joined[after[crossed[0]]])))
    return valid


def _by_runs(tail: np.ndarray, rooms: np.ndarray, cap: int) -> tuple[list, list, int]:
    """(cells in turn, how many items of `tail` each takes, cells opened) of best fit of `tail`
    (longest first) after cells 0, 1, ... were left `rooms`: one run of a length at a time."""
    held, cells_of, unsorted = _opened(rooms)
    taken, times, opened = [], [], rooms.size
    bounds = np.flatnonzero(np.diff(tail, prepend=-1, append=-1))  # where runs start, and their end
    for length, count in zip(tail[bounds[:-1]].tolist(), np.diff(bounds).tolist()):
        if length == 0:  # to the least room (unchanged), the lowest cell of it; an untouched cell if none
            cells = cells_of[held[0]] if held else None
            if cells is not None and held[0] in unsorted:
                cells.sort(reverse=True)
                unsorted.discard(held[0])
            times.append(count)
            taken.append(cells[-1] if cells else 0)
            opened = max(opened, 1)
            continue
        while count:
            where = bisect.bisect_left(held, length)
            if where == len(held):  # untouched cells, the lowest first
                per = cap // length
                full = count // per
                if full:
                    taken += range(opened, opened + full)
                    times += [per] * full
                    _put(held, cells_of, unsorted, cap - per * length, list(range(opened + full - 1, opened - 1, -1)))
                    opened += full
                    count -= full * per
                if count:
                    taken.append(opened)
                    times.append(count)
                    _put(held, cells_of, unsorted, cap - count * length, [opened])
                    opened += 1
                    count = 0
                continue
            room = held[where]
            cells = cells_of[room]
            if room in unsorted:
                cells.sort(reverse=True)
                unsorted.discard(room)
            per = room // length
            full = min(len(cells), count // per)
            if full:
                filled = cells[-full:]
                del cells[-full:]
                taken += filled[::-1]
                times += [per] * full
                count -= full * per
                _put(held, cells_of, unsorted, room - per * length, filled)
            if count and cells:
                cell = cells.pop()
                taken.append(cell)
                times.append(count)
                _put(held, cells_of, unsorted, room - count * length, [cell])
                count = 0
            if not cells:
                del cells_of[room]
                del held[bisect.bisect_left(held, room)]
    return taken, times, opened


def _opened(rooms: np.ndarray) -> tuple[list, dict, set]:
    """The rooms held (ascending), their cells (descending, the least popped first) and the rooms
    whose cells need sorting, of cells 0, 1, ... left with `rooms`."""
    cells = np.lexsort((np.arange(rooms.size), rooms))[::-1]  # by (room, cell) descending
    by_room = rooms[cells]
    starts = np.flatnonzero(np.diff(by_room, prepend=by_room[:1] + 1)).tolist() if rooms.size else []
    flat, ends = cells.tolist(), starts[1:] + [rooms.size]
    cells_of = {room: flat[start:end] for room, start, end in zip(by_room[starts].tolist(), starts, ends)}
    return sorted(cells_of), cells_of, set()


def _put(held: list, cells_of: dict, unsorted: set, room: int, cells: list) -> None:
    """Cells `cells` (descending) now at `room`: a new room held, or more cells of one (to sort)."""
    known = cells_of.get(room)
    if known is None:
        cells_of[room] = cells
        bisect.insort(held, room)
    else:
        known.extend(cells)
        unsorted.add(room)
