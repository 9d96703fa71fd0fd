"""probe32's P32-02: `simulate --pipeline-stages` planned every strategy before refusing the pipeline's slot limit."""

import pytest

from orchmllm.balancers import Pipeline
from orchmllm.balancers.validation import SizeLimitError
from orchmllm.study import pipeline_sim


def test_the_slot_limit_is_refused_before_any_strategy_plans(monkeypatch):
    def planned(*args, **kwargs):
        raise AssertionError("a strategy planned before the slot limit was checked")

    monkeypatch.setattr(pipeline_sim, "MICROBATCH_PEERS", {"verl_dynamic_bsz": planned, "sorted_grid": planned})
    monkeypatch.setattr(pipeline_sim, "balance_microbatches", planned)
    with pytest.raises(SizeLimitError, match=r"MAX_PIPELINE_SLOTS = 1024 .*max_tokens_per_microbatch"):
        pipeline_sim.run_pipeline_simulation(gpus=64, pipeline=Pipeline(stages=4), samples_per_rank=4000)
