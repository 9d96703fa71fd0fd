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


def test_one_search_of_the_segments_per_pass(monkeypatch):
    """The chunk of every segment's first row is found once per pass (`split_layout`: `SampleChunks.segment_chunk`),
    and the anchors and the pieces read it (the parent searched the segments in each)."""
    from orchmllm.orchestrator import shards
    batch = frames_batch(16, 4)
    orchestrator = Orchestrator(STAGES, Topology.for_world_size(16), context_parallel=ContextParallel(),
                                max_tokens_per_microbatch=16384)
    cells = orchestrator.plan(batch).cells
    searched, search = [], shards._searched
    monkeypatch.setattr(shards, "_searched", lambda starts, keys, side: searched.append(keys.size) or
                        search(starts, keys, side))
    step = orchestrator._plan_cells(batch, cells, 0.0)
    split = [plan for plan in step.microbatches if plan.llm.split is not None]
    assert split and sorted(searched) == sorted(plan.batch.num_segments for plan in split)
    for plan in split:
        chunks = plan.llm.split[1]
        assert np.array_equal(chunks.sample[chunks.segment_chunk], plan.batch.segment_sample)  # its own sample's
        assert np.array_equal(chunks.rank[chunks.segment_chunk], first_rows(plan))
