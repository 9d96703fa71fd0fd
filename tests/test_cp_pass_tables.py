"""Speed-only shortcuts of one split-planner pass give the same arrays as the work they replace (issues 24 / 26: a
pass's time not proportional to its items): the layout's time table read from the bound's allotment, the laid-out
items' accounts with their times read from that table, the canonical degrees made once per target, and the groups'
disjointness without `np.unique` / `np.add.at`."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel
from orchmllm.balancers.context_parallel import planner
from orchmllm.balancers.context_parallel.blocks import groups_disjoint
from orchmllm.balancers.context_parallel.split import allot, allowed_degrees
from orchmllm.balancers.context_parallel.timetable import TimeTable
from orchmllm.balancers.problem import make_problem

COST = CostModel(linear=6e9, quadratic=4e5)
GPUS = 8


def _problem(lengths, num_ranks: int = 64):
    return replace(make_problem(np.asarray(lengths), num_ranks, cost=COST), max_tokens_per_rank=32_768)


@pytest.mark.parametrize("spec", [ContextParallel(gpus_per_node=GPUS),
                                  ContextParallel(degrees=(1, 2, 4, 8, 16), gpus_per_node=GPUS, allow_inter_node=True)])
@pytest.mark.parametrize("kind", ["every item a candidate", "some not", "reversed"])
def test_table_from_the_allotment_is_the_table_computed(spec, kind):
    rng = np.random.default_rng(7)
    lengths = rng.integers(20_000, 130_000, 120) if kind != "some not" else rng.integers(0, 70_000, 300)
    problem = _problem(lengths)
    allotment = allot(problem, spec, allowed_degrees(spec, 64, GPUS), GPUS, 32_768, one_pass=False)
    items = np.flatnonzero(lengths > 20_000)
    items = items[::-1] if kind == "reversed" else items
    read, made = TimeTable(problem, spec, GPUS, items, allotment), TimeTable(problem, spec, GPUS, items)
    assert read.table.tobytes() == made.table.tobytes()


@pytest.mark.parametrize("gpus, inter", [(8, False), (6, True)])
def test_laid_accounts_from_the_table_are_the_accounts(gpus, inter):
    """On nodes of 6 with groups across nodes allowed, a block of 4 may straddle two: its time is not the table's."""
    rng = np.random.default_rng(5)
    lengths = np.concatenate((rng.integers(1, 4000, 500), rng.integers(40_000, 200_000, 12)))
    problem = make_problem(lengths, 48, cost=COST)
    spec = ContextParallel(gpus_per_node=gpus, allow_inter_node=inter)
    start, degree = np.full(lengths.size, -1), np.ones(lengths.size, dtype=np.int64)
    laid = rng.choice(lengths.size, 80, replace=False)
    degree[laid] = rng.choice([1, 2, 4, 8], laid.size)
    start[laid] = rng.integers(0, 6, laid.size) * 8 // degree[laid] * degree[laid]
    table = TimeTable(problem, spec, gpus, np.arange(lengths.size))
    found = planner.laid_accounts(problem, spec, gpus, start, degree, table)
    expected = planner.laid_accounts(problem, spec, gpus, start, degree)
    assert found[0].tobytes() == expected[0].tobytes() and np.array_equal(found[1], expected[1])


def test_canonical_degrees_made_once_per_target_read_only():
    spec = ContextParallel(gpus_per_node=GPUS)
    problem = _problem(np.random.default_rng(2).integers(1000, 130_000, 200))
    allotment = allot(problem, spec, allowed_degrees(spec, 64, GPUS), GPUS, 32_768, one_pass=False)
    bound = allotment.bound()
    first = allotment.degrees_at(bound)
    assert allotment.degrees_at(bound) is first and not first.flags.writeable
    copy = replace(allotment)
    assert not copy.canonical and np.array_equal(first, copy.degrees_at(bound))
    assert not replace(allotment, times=allotment.times * 2).canonical  # other times: none kept from these


def _disjoint_by_ranks(starts: np.ndarray, degrees: np.ndarray, num_ranks: int) -> bool:
    owner = [None] * num_ranks
    for start, degree in zip(starts.tolist(), degrees.tolist()):
        for rank in range(start, start + degree):
            if owner[rank] not in (None, (start, degree)):
                return False
            owner[rank] = (start, degree)
    return True


@pytest.mark.parametrize("seed", range(4))
def test_groups_disjoint_is_rank_by_rank(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        num_ranks = int(rng.choice([8, 16, 64]))
        degrees = rng.choice([1, 2, 4, 8], int(rng.integers(0, 12)))
        starts = np.minimum(rng.integers(0, num_ranks, degrees.size) // degrees * degrees, num_ranks - degrees)
        assert groups_disjoint(starts, degrees, num_ranks) == _disjoint_by_ranks(starts, degrees, num_ranks)
