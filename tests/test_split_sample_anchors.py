"""An encoder item of a sample split by context parallelism is kept near the LLM rank that receives its embeddings
(the rank of the sample's chunk holding its first row), not the first rank of the sample's group: the locality deal's
anchor is where the item's bytes go."""

import numpy as np

from orchmllm import ContextParallel, Orchestrator, Topology
from orchmllm.orchestrator.planner import item_tokens, stage_items
from orchmllm.orchestrator.samples import Batch, Sample, Segment
from orchmllm.study.models import MODELS

STAGES = MODELS["84b"].stages()


def frames_batch(num_ranks: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch.from_samples([Sample(int(rng.integers(16, 900)), tuple(Segment("image", 576, 144) for _ in range(
        240 if index % 8 == 0 else int(rng.integers(0, 12)))), source=index % num_ranks, id=index)
        for index in range(num_ranks * 4)], num_ranks)


def first_rows(pass_plan) -> np.ndarray:
    """The LLM rank of every segment's first embedding row, read from the pass's routes."""
    ranks = np.full(pass_plan.batch.num_segments, -1)
    first = pass_plan.route_row == 0
    ranks[pass_plan.route_segment[first]] = pass_plan.route_llm_rank[first]
    return ranks


def test_split_samples_anchor_at_their_chunks_ranks():
    orchestrator = Orchestrator(STAGES, Topology.for_world_size(16), context_parallel=ContextParallel(),
                                max_tokens_per_microbatch=16384)
    step = orchestrator.plan(frames_batch(16, 3))
    checked = 0
    for pass_plan in step.microbatches:
        batch, llm = pass_plan.batch, pass_plan.llm
        image = STAGES[0]
        items = stage_items(batch, image)
        anchors, _ = orchestrator._anchors(batch, image, items, item_tokens(batch, image, items), llm)
        assert np.array_equal(anchors, first_rows(pass_plan)[items.segment])
        split = llm.degree[items.sample] > 1
        assert np.array_equal(anchors[~split], llm.destination[items.sample][~split])  # an unsplit sample's rank
        if pass_plan.splits:
            assert np.any(anchors[split] != llm.destination[items.sample][split])  # not the group's first rank
            checked += 1
    assert checked
