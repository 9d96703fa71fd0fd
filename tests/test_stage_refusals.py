"""A one-pass step's refusal names its stage and algorithm (probe22 P22-10), and `uniform_algorithm` replaces the LLM
stage's own algorithm under micro-batching instead of being refused by its name (probe21)."""

import pytest

from orchmllm import Batch, CostModel, Orchestrator, Sample, Segment, Stage, Topology
from orchmllm.balancers.problem import InfeasibleError

IMAGES = [28, 2, 20, 18, 16, 18]  # cap 52 on 2 ranks: {28, 2, 20} {18, 16, 18}; lpt finds no room


def image_batch() -> Batch:
    return Batch.from_samples([Sample(10, (Segment("image", length, 4),), source=i % 2)
                               for i, length in enumerate(IMAGES)], 2)


@pytest.mark.parametrize("placement", ["locality", "lap", None])
def test_regression_a_stage_refusal_names_the_stage_and_what_searches_further(placement):
    stages = (Stage("vision", "image", CostModel(), max_tokens_per_rank=52, algorithm="lpt"),
              Stage("llm", "llm", CostModel()))
    with pytest.raises(InfeasibleError, match=r"^stage 'vision' \(algorithm 'lpt'; its items are its segments in "
                                              r"batch order\): `lpt` found no rank with room for item 4 .*; "
                                              r"Stage\('vision', \.\.\., algorithm='auto'\) searches further$"):
        Orchestrator(stages, Topology(1, 2), placement=placement).plan(image_batch())
    auto = (Stage("vision", "image", CostModel(), max_tokens_per_rank=52, algorithm="auto"), stages[1])
    step = Orchestrator(auto, Topology(1, 2), placement=placement).plan(image_batch())
    assert step.microbatches[0].stage_plans[0].tokens.max() <= 52


def test_regression_uniform_algorithm_replaces_the_llm_stages_own_under_microbatching():
    stages = (Stage("vision", "image", CostModel(linear=2.0)),
              Stage("llm", "llm", CostModel(), algorithm="karmarkar_karp"))
    batch = Batch.from_samples([Sample(100, (Segment("image", 8, 4),), source=0), Sample(50, (), source=1)], 2)
    step = Orchestrator(stages, Topology(1, 2), uniform_algorithm="lpt", max_tokens_per_microbatch=500).plan(batch)
    assert step.microbatches[0].stage_plans[0].algorithm == "lpt"
    with pytest.raises(ValueError, match=r"^stage 'llm': `algorithm` 'karmarkar_karp' plans a step of one pass"):
        Orchestrator(stages, Topology(1, 2), max_tokens_per_microbatch=500)  # without it, still refused
