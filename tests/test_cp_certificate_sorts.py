"""The certificate that no split layout exists (`dual_feasible.cannot_lay_out`) sorts the pieces once: the thresholds
and the small pieces' floor sums read one ascending order, the large pieces' the same order reversed (before, each
sum sorted its pieces again and the thresholds were sorted a third time; 1020 certificates, 0.38 s of the allbig
planning at D = 2560 x 32, T = 32k).  The answers equal the unsorted formula's below."""

import numpy as np
import pytest

from orchmllm.balancers.context_parallel import dual_feasible
from orchmllm.balancers.context_parallel.dual_feasible import THRESHOLDS_BELOW, cannot_lay_out


def _reference(lengths: np.ndarray, num_ranks: int, degrees: np.ndarray, budget: int) -> bool:
    """The module's formula, each sum over pieces in any order (`dual_feasible` as it was)."""
    if int(lengths.sum()) > num_ranks * budget:
        return True
    widest, least = int(degrees[-1]), budget // THRESHOLDS_BELOW + 1
    lengths = lengths[lengths > widest * (least - 1)]
    if int(lengths.max(initial=0)) > widest * budget:
        return True
    fits = -(-lengths[:, None] // degrees[None, :]) <= budget
    alone = (-(-lengths // widest) * 2 > budget) & (fits.sum(axis=1) > 1)
    small, larger = np.divmod(lengths[~alone], widest)
    sizes, counts = np.concatenate((small + 1, small)), np.concatenate((larger, widest - larger))
    keep = (counts > 0) & (sizes >= least)
    sizes, counts = sizes[keep], counts[keep]
    big = 2 * sizes > budget
    x = np.unique(np.concatenate((sizes[~big], budget // np.arange(2, THRESHOLDS_BELOW + 1) + 1)))
    x = x[x >= least]
    floors = lambda pieces, count: (count[None, :] * (pieces[None, :] // x[:, None])).sum(axis=1)
    units = (floors(sizes[~big], counts[~big]) + int(counts[big].sum()) * (budget // x)
             - floors(budget - sizes[big], counts[big]))
    if alone.any():
        units = units + dual_feasible._least_units(lengths[alone], degrees, fits[alone], budget, x)
    return bool((units > num_ranks * (budget // x)).any())


@pytest.mark.parametrize("seed", range(6))
def test_the_answers_are_the_formulas(seed):
    """Items of T / 3 to 2 T tokens (and of any length) filling 60-100 % of the ranks' tokens, 1-64 ranks, degree
    sets up to (1, 2, 4, 8), budgets 16-5000 tokens: both answers, true and false, as the formula's."""
    rng = np.random.default_rng(seed)
    answers = set()
    for _ in range(300):
        num_ranks, budget = int(rng.choice([2, 4, 8, 16, 64])), int(rng.integers(16, 5000))
        degrees = np.array(sorted(rng.choice([1, 2, 4, 8], size=rng.integers(1, 5), replace=False)), dtype=np.int64)
        degrees = degrees[degrees <= num_ranks] if degrees[0] <= num_ranks else np.array([1], dtype=np.int64)
        low, high = (budget // 3 + 1, min(2 * budget, budget * int(degrees[-1])) + 1) if rng.random() < 0.6 else (
            1, budget * int(degrees[-1]) + 1)
        count = int(rng.uniform(0.6, 1.0) * num_ranks * budget / ((low + high) / 2)) + 1
        lengths = rng.integers(low, high, count).astype(np.int64)
        answer = cannot_lay_out(lengths, num_ranks, degrees, budget)
        assert answer == _reference(lengths, num_ranks, degrees, budget)
        answers.add(answer)
    assert answers == {True, False}


def test_regression_each_floor_sum_sorted_its_pieces_again(monkeypatch):
    """An allbig micro-batch (1300 items of 32-64k tokens, 2560 ranks, T = 32k): one argsort a certificate, where
    each of its two floor sums made its own (2)."""
    lengths = np.random.default_rng(9).integers(32768, 65536, 1300).astype(np.int64)
    sorts, argsort = [], np.argsort

    def counted(*args, **kwargs):
        sorts.append(1)
        return argsort(*args, **kwargs)

    monkeypatch.setattr(np, "argsort", counted)
    answer, made = cannot_lay_out(lengths, 2560, np.array([1, 2, 4, 8], dtype=np.int64), 32768), len(sorts)
    assert answer == _reference(lengths, 2560, np.array([1, 2, 4, 8], dtype=np.int64), 32768) and made == 1


def test_regression_the_large_pieces_floor_sum_ran_where_there_are_none(monkeypatch):
    """allgiant (20-130k tokens, T = 32k) at the widest degree 8: every shard is at most T / 2, so there are no large
    pieces and one floor sum a certificate (the second ran on no pieces: a fifth of the certificate's time over
    allgiant's 429 certificates at D = 512 x 16)."""
    lengths = np.random.default_rng(11).integers(20000, 130000, 200).astype(np.int64)
    sums, floor_sums = [], dual_feasible._floor_sums

    def counted(*args):
        sums.append(1)
        return floor_sums(*args)

    monkeypatch.setattr(dual_feasible, "_floor_sums", counted)
    degrees = np.array([1, 2, 4, 8], dtype=np.int64)
    for extra in (0, 16, 200):  # ranks whose tokens just hold the items' and more
        num_ranks, sums[:] = -(-int(lengths.sum()) // 32768) + extra, []
        answer = cannot_lay_out(lengths, num_ranks, degrees, 32768)
        assert answer == _reference(lengths, num_ranks, degrees, 32768) and len(sums) == 1
