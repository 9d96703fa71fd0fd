"""`PassPlan.digest` hashes its columns in place: the same SHA-256 as of each column's `astype("<i8").tobytes()`
(the bytes every rank agreed on before), stride-0 `constant` columns included."""

import hashlib

import pytest

from orchmllm.tests.test_orchestrator_pieces import giant_image_step


def _copied_digest(plan) -> str:
    """The digest by its definition: each column copied to little-endian int64 bytes, in order."""
    columns = [p.destination for p in plan.stage_plans]
    columns += [plan.route_encoder_rank, plan.route_encoder_offset, plan.route_llm_rank, plan.route_llm_offset]
    if plan.splits:
        columns += [plan.llm.degree, *[p.item_first_unit for p in plan.stage_plans[:-1]], plan.route_segment,
                    plan.route_row]
    digest = hashlib.sha256()
    for column in columns:
        digest.update(column.astype("<i8").tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("split", [False, True])
def test_the_digest_is_that_of_the_copied_columns(split):
    plan = giant_image_step(31, split)
    routes = plan.microbatches[0]
    assert routes.splits == split
    if split:  # an unsplit stage's parts: a stride-0 column, read in place as the others
        assert routes.stage_plans[0].item_first_unit.strides == (0,)
    assert routes.digest() == _copied_digest(routes)
