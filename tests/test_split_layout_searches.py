"""`split_layout` finds the embedding rows of a split sample's chunks with one binary search per chunk and one more
per sample (its chunks tile it: a chunk ends where the next one starts), not two per chunk; the rows are the
segments' overlap with each chunk (`text_before`)."""

import numpy as np

from orchmllm import ContextParallel, Orchestrator, Topology
from orchmllm.orchestrator import shards
from orchmllm.orchestrator.samples import Batch, Sample, Segment
from orchmllm.study.models import MODELS


def split_pass():
    rng = np.random.default_rng(9)
    samples = [Sample(int(rng.integers(16, 900)), tuple(Segment("image", 576, 144) for _ in range(
        200 if index % 8 == 0 else int(rng.integers(0, 12)))), source=index % 16, id=index) for index in range(64)]
    step = Orchestrator(MODELS["84b"].stages(), Topology.for_world_size(16), context_parallel=ContextParallel(),
                        max_tokens_per_microbatch=16384).plan(Batch.from_samples(samples, 16))
    return next(plan for plan in step.microbatches if plan.splits)


def test_split_chunks_search_their_starts_and_one_end(monkeypatch):
    pass_plan = split_pass()
    batch, llm = pass_plan.batch, pass_plan.llm
    needles, search = [], np.searchsorted
    monkeypatch.setattr(shards.np, "searchsorted", lambda haystack, keys, *a, **k: (
        needles.append(np.size(keys)) if np.size(haystack) == batch.num_segments else None) or search(
        haystack, keys, *a, **k))
    chunks = llm.split[1]
    split = llm.degree > 1
    in_split = split[chunks.sample]
    embedded = shards._embedded(batch, chunks.sample, chunks.position, chunks.tokens, in_split)
    assert sum(needles) == int(in_split.sum()) + int(split.sum())  # the parent searched 2 · the split chunks
    assert np.array_equal(chunks.text_tokens[in_split], (chunks.tokens - embedded)[in_split])
    for row in np.flatnonzero(llm.degree[chunks.sample] > 1)[:40]:
        sample, first = int(chunks.sample[row]), int(chunks.position[row])
        bounds = np.array([first, first + int(chunks.tokens[row])])
        assert chunks.text_tokens[row] == int(np.diff(shards.text_before(batch, sample, bounds))[0])
