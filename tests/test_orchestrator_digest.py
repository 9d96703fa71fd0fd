"""`PassPlan.digest` hashes its columns in place: the same SHA-256 as of each column's `astype("<i8").tobytes()`
(the bytes every rank agreed on before), stride-0 `constant` columns included."""

import hashlib

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, Orchestrator, Topology
from orchmllm.orchestrator.samples import Batch, Sample, Segment
from orchmllm.orchestrator.stages import Stage


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
    rng = np.random.default_rng(31)
    samples = [Sample(int(rng.integers(0, 3000 if giant else 300)), tuple(
        Segment("image", 8 * tokens, int(tokens)) for tokens in rng.integers(0, 40, 30 if giant else 3)),
        source=int(rng.integers(0, 8))) for giant in [True, True] + [False] * 40]
    stages = (Stage("vision", "image", CostModel(linear=1.0)),
              Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.5)))
    spec = ContextParallel(degrees=(1, 2, 4, 8), seconds_per_cost=1.0, kv_bytes_per_token=0.0,
                           half_efficiency_tokens=0.0) if split else None
    plan = Orchestrator(stages, Topology(1, 8), context_parallel=spec).plan(Batch.from_samples(samples, 8))
    routes = plan.microbatches[0]
    assert routes.splits == split
    if split:  # an unsplit stage's parts: a stride-0 column, read in place as the others
        assert routes.stage_plans[0].item_first_unit.strides == (0,)
    assert routes.digest() == _copied_digest(routes)
