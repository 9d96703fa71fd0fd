"""With a pipeline and M free, M is chosen as without the pipeline (README, `balance_microbatches`' docstring): the
documented rule, held here so that the text and the planner cannot part (probe22 P22-09: the docs read as if M rose
to shrink the bubble; at D = 32, P = 8, 1F1B the free M = 4 is ~1.8x slower than M = 16)."""

import pytest

from orchmllm import Pipeline, balance_microbatches
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import llm_stage_lengths

COST = MODELS["84b"].stages()[-1].cost


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_free_count_is_the_plain_plans_and_a_given_one_can_beat_it(schedule):
    lengths = llm_stage_lengths(32, 32, 0)[0]
    plain = balance_microbatches(lengths, 32, cost=COST, max_tokens_per_microbatch=16384)
    free, given = (balance_microbatches(lengths, 32, cost=COST, max_tokens_per_microbatch=16384, num_microbatches=m,
                                        pipeline=Pipeline(stages=8, schedule=schedule)) for m in (None, 16))
    assert free.num_microbatches == plain.num_microbatches == 4
    assert given.pipeline.step_time < 0.7 * free.pipeline.step_time  # why the docs tell you to pass M
