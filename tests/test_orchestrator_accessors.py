"""A step plan's and a batch's accessors refuse an index they do not hold, naming it (probe20 P20-23, P20-24):
numpy's cast truncated fractional sample indices and Python's negative indexing read another rank or sample."""

import numpy as np
import pytest

from orchmllm import CostModel, Orchestrator
from orchmllm.orchestrator import Batch, Sample, Segment, Stage

STAGES = [Stage("vision", "image", CostModel(linear=2.0)), Stage("llm", "llm", CostModel())]


def batch():
    samples = [Sample(5, (Segment("image", 3, 2, position=0),) if k % 2 else (), k % 2, k) for k in range(4)]
    return Batch.from_samples(samples, 2)


def test_regression_fractional_sample_indices_were_truncated():
    """take([0.5, 1.7]) returned samples 0 and 1; integral floats still read as ints, a mask is told apart."""
    assert batch().take(np.array([2.0, 3.0])).sample_id.tolist() == [2, 3]
    for call in (lambda b: b.take([0.5, 1.7]), lambda b: b.segments_of_samples([0.5])):
        with pytest.raises(ValueError, match=r"`samples` must be non-negative integers; got 0.5 at index 0"):
            call(batch())
    with pytest.raises(TypeError, match=r"`samples` is a boolean mask; pass `np.flatnonzero\(mask\)`"):
        batch().take(np.array([True, False, True, False]))
    with pytest.raises(TypeError, match=r"`samples` must be a 1-D sequence of sample indices; got one index 1"):
        batch().take(1)  # probe21's note: told "must be ascending distinct sample indices"


def test_regression_a_negative_sample_index_read_the_last_sample_without_its_segments():
    assert batch().sample(3).segments and batch().sample(3).id == 3
    for index, error in ((-1, ValueError), (4, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match=r"`index` must be"):
            batch().sample(index)
    with pytest.raises(TypeError, match=r"`modality` must be a str"):
        batch().segments_of(1)


def test_regression_rank_and_stage_accessors_read_python_s_negative_indices():
    """items_on(-1) and rows_on(-1) returned [] though rank 1 (= -1 of 2) holds items; stage_destinations(-1)
    meant the last stage and (0.9) raised Python's own TypeError."""
    plan = Orchestrator(STAGES, 2).plan(batch())
    micro = plan.microbatches[0]
    assert micro.stage_plans[1].items_on(1).size and micro.shards.rows_on(1).size
    for call in (lambda r: micro.stage_plans[1].items_on(r), lambda r: micro.shards.rows_on(r)):
        for rank in (-1, 2):
            with pytest.raises(ValueError, match=rf"`rank` must be in \[0, num_ranks=2\); got {rank}"):
                call(rank)
    for index, error in ((-1, ValueError), (2, ValueError), (0.9, TypeError)):
        with pytest.raises(error, match=r"`index` must be"):
            plan.stage_destinations(index)
