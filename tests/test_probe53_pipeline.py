"""probe53 F4: an interleaved pipeline's micro-batch advice is consistent with its slot limit."""

import pytest

from orchmllm import Pipeline, balance_microbatches
from orchmllm.balancers.validation import SizeLimitError

LENGTHS = list(range(1, 25))


@pytest.mark.parametrize("num_microbatches", [8, 64, None])
def test_regression_interleaved_pipeline_that_no_micro_batch_count_fits_gave_contradicting_advice(num_microbatches):
    """Cause (probe53 F4): interleaved P = 64, v = 2 runs a multiple of 64 micro-batches, and 64 × 128 chunks exceed
    the 1024 slots: M = 8 said 'try 64', M = 64 'at most 8', a free M advised a larger budget.  Every M now names
    the cause: no number of micro-batches fits this pipeline."""
    pipeline = Pipeline(stages=64, schedule="interleaved", virtual_stages=2)
    with pytest.raises(SizeLimitError, match=r"no number of micro-batches fits this pipeline: .* multiple of "
                                             r"`stages`=64, .* fewer `stages` or `virtual_stages`"):
        balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=400, num_microbatches=num_microbatches,
                             pipeline=pipeline)


def test_regression_a_free_m_named_a_count_it_was_never_given():
    """A free M was refused as "`num_microbatches`=64 ...", a count the caller never passed: now refused before
    planning with the cause alone."""
    with pytest.raises(SizeLimitError, match=r"^no number of micro-batches fits this pipeline"):
        balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=400,
                             pipeline=Pipeline(stages=64, schedule="interleaved", virtual_stages=2))


@pytest.mark.parametrize("num_microbatches, advice", [(40, "try 36"), (42, "try 36"),
                                                      (44, r"at most 36 micro-batches \(a multiple of `stages`\)")])
def test_regression_interleaved_advice_named_counts_the_other_check_refused(num_microbatches, advice):
    """Interleaved P = 12, v = 2 plans at most 42 micro-batches and runs multiples of 12: M = 40 said 'try 48' (beyond
    the slots), M = 44 'at most 42' (not a multiple).  The advice is now the largest count both checks accept."""
    pipeline = Pipeline(stages=12, schedule="interleaved", virtual_stages=2)
    assert pipeline.max_microbatches == 36 and pipeline.check_microbatches(36) == 36
    with pytest.raises((ValueError, SizeLimitError), match=advice):
        pipeline.check_microbatches(num_microbatches)
