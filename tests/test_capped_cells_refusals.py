"""What a micro-batched step's refusal under an encoder cap may claim (probe22 P22-04, P22-16): the capped re-plan's
cell counts are conservative, so "the fewest possible" is theirs, and samples holding more than a cap are named
with what the rule cannot do for them."""

import pytest

from orchmllm import Batch, CostModel, Orchestrator, Stage
from orchmllm.balancers.problem import InfeasibleError

LLM = Stage("llm", "llm", CostModel())


def test_regression_the_fewest_micro_batches_named_are_the_conservative_counts():
    """An M = 2 step exists (m0 {F1, A} {F2, B}, m1 {C} {D}); the refusal read "3 fit, the fewest possible"."""
    vision = Stage("vision", "image", CostModel(), max_tokens_per_rank=1000)
    batch = Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[90, 90, 90, 90, 800, 800],
                              sample_source=[0, 0, 0, 1, 1, 1], segment_sample=[0, 1, 2, 3], segment_modality=[0] * 4,
                              segment_length=[600] * 4, segment_tokens=[10] * 4)
    with pytest.raises(InfeasibleError, match=r"3 fit, the fewest possible .*`capped_cell_lengths`: conservative "
                                              r"counts, so the fewest micro-batches named are theirs; fewer may fit"):
        Orchestrator([vision, LLM], 2, max_tokens_per_microbatch=1000, microbatch_overhead=5000.0,
                     num_microbatches=2).plan(batch)


def test_regression_samples_over_a_cap_are_named_with_what_more_micro_batches_cannot_do():
    """Two samples of two 600-unit images each under a cap of 1000 on 2 ranks: every segment fits a rank, but the
    capped cells give each sample a rank of one micro-batch, whatever M."""
    vision = Stage("vision", "image", CostModel(), max_tokens_per_rank=1000)
    batch = Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[10, 10, 10, 10],
                              sample_source=[0, 1, 0, 1], segment_sample=[0, 0, 1, 1, 2, 3], segment_modality=[0] * 6,
                              segment_length=[600] * 6, segment_tokens=[10] * 6)
    with pytest.raises(InfeasibleError, match=r"2 samples each hold more of stage 'vision' than its "
                                              r"max_tokens_per_rank=1000 \(up to 1200\): .* so more micro-batches do "
                                              r"not help"):
        Orchestrator([vision, LLM], 2, max_tokens_per_microbatch=100, num_microbatches=4).plan(batch)
