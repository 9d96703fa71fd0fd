"""The zigzag layout of a split item: which tokens of an item each rank of its context-parallel group holds.

An item of length l split at degree c is cut into 2c contiguous chunks; group rank k (0 ≤ k < c)
holds chunks k and 2c − 1 − k, in that order. Under a causal mask a token's attention work grows
with its position, so pairing an early chunk with the mirrored late one gives every rank of the
group the same work (exactly when 2c divides l), where a plain split into c chunks would leave the
last rank c times the first one's work (torch's context parallelism calls this head–tail load
balancing; Megatron-LM and Llama 3 use the same layout).

Rule when 2c does not divide l: with q, r = divmod(l, 2c), chunk j holds q + 1 tokens for j < r
and q tokens after (earlier chunks larger). Then the group ranks' token counts differ by at most
one, so the largest shard holds exactly ⌈l / c⌉ tokens, and their causal work differs by less
than 2l, against about l² / (2c) of work each. The layout is a pure function of (l, c): every rank derives the
same shards from the plan's lengths and degrees.

    sizes = [q + (j < r) for j in range(2 * c)]          # chunk j's token count
    rank k holds chunk k, then chunk 2c - 1 - k           # positions are the unsplit ones
"""

from __future__ import annotations

import numpy as np

from ..problem import as_lengths
from ..validation import as_index, as_int


def _as_lengths(lengths) -> np.ndarray:
    """`lengths` as int64 (an empty sequence is allowed: no item split)."""
    return np.zeros(0, dtype=np.int64) if np.size(lengths) == 0 and not isinstance(lengths, (str, bytes)) \
        else as_lengths(lengths)


def chunk_sizes(lengths, degree) -> np.ndarray:
    """Token counts of the 2c zigzag chunks of each item: int64, shape (items, 2 · degree).

    >>> chunk_sizes([8, 10, 3], 2).tolist()
    [[2, 2, 2, 2], [3, 3, 2, 2], [1, 1, 1, 0]]
    """
    return _chunks(_as_lengths(lengths), as_int(degree, "degree", minimum=1))


def _chunks(lengths: np.ndarray, degree: int) -> np.ndarray:
    """`chunk_sizes` of validated int64 `lengths` (1-D) at an int degree."""
    quotient, remainder = np.divmod(lengths, 2 * degree)
    return quotient[:, None] + (np.arange(2 * degree)[None, :] < remainder[:, None])


def shard_tokens(lengths, degree) -> np.ndarray:
    """Tokens each group rank holds of each item: int64, shape (items, degree); rows sum to the lengths.

    Counts within a row differ by at most one, so the largest is ⌈l / degree⌉.

    >>> shard_tokens([8, 10, 3], 2).tolist()
    [[4, 4], [5, 5], [1, 2]]
    """
    return shards_of(_as_lengths(lengths), as_int(degree, "degree", minimum=1))


def shards_of(lengths: np.ndarray, degree: int) -> np.ndarray:
    """`shard_tokens` of int64 `lengths` (1-D, non-negative) at an int degree >= 1, unchecked: for solvers whose
    lengths a `Problem` has checked (the local search asks once per move)."""
    quotient, remainder = np.divmod(lengths, 2 * degree)  # rank k holds chunks k and 2c - 1 - k (`_chunks`)
    rank = np.arange(degree)[None, :]
    return 2 * quotient[:, None] + (rank < remainder[:, None]) + (rank >= 2 * degree - remainder[:, None])


def shard_positions(length, degree, group_rank) -> np.ndarray:
    """Global positions (indices in the unsplit item) of the tokens group rank `group_rank` holds, ascending.

    They are the RoPE / position ids of the shard, and index the unsplit item's rows.

    >>> shard_positions(10, 2, 0).tolist(), shard_positions(10, 2, 1).tolist()
    ([0, 1, 2, 8, 9], [3, 4, 5, 6, 7])
    """
    length = as_int(length, "length", minimum=0)
    degree = as_int(degree, "degree", minimum=1)
    group_rank = as_index(group_rank, "group_rank", degree, "degree")
    offsets = np.concatenate(([0], np.cumsum(chunk_sizes([length], degree)[0])))
    mirror = 2 * degree - 1 - group_rank
    return np.concatenate((np.arange(offsets[group_rank], offsets[group_rank + 1], dtype=np.int64),
                           np.arange(offsets[mirror], offsets[mirror + 1], dtype=np.int64)))


def shard(array, degree) -> list[np.ndarray]:
    """Split `array` (one item, tokens along axis 0) into the `degree` shards of its group ranks.

    >>> [part.tolist() for part in shard(np.arange(6), 2)]
    [[0, 1, 5], [2, 3, 4]]
    """
    array = np.asarray(array)
    if array.ndim == 0:
        raise ValueError("`array` must have a token axis (axis 0); got a scalar")
    degree = as_int(degree, "degree", minimum=1)
    return [array[shard_positions(len(array), degree, rank)] for rank in range(degree)]


def unshard(shards) -> np.ndarray:
    """Reassemble an item from its group ranks' shards, in group-rank order (the inverse of `shard`).

    >>> unshard([[0, 1, 5], [2, 3, 4]]).tolist()
    [0, 1, 2, 3, 4, 5]
    >>> unshard([[0], [1, 2, 3]])
    Traceback (most recent call last):
    ...
    ValueError: `shards` of an item of 4 tokens at degree 2 must hold [2, 2] tokens; got [1, 3]
    """
    shards = [np.asarray(part) for part in shards]
    if not shards or any(part.ndim == 0 for part in shards):
        raise ValueError("`shards` must be a non-empty sequence of arrays with a token axis (axis 0)")
    degree = len(shards)
    length = sum(len(part) for part in shards)
    expected = shard_tokens([length], degree)[0]
    got = [len(part) for part in shards]
    if got != expected.tolist():
        raise ValueError(f"`shards` of an item of {length} tokens at degree {degree} must hold "
                         f"{expected.tolist()} tokens; got {got}")
    result = np.empty((length,) + shards[0].shape[1:], dtype=np.result_type(*shards))
    for rank, part in enumerate(shards):
        result[shard_positions(length, degree, rank)] = part
    return result
