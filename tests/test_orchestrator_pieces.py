"""A pass's embedding pieces (`orchestrator.shards`): the chunk starts that cut segments, found one binary
search per chunk, are every chunk start inside a segment, and each rank's routes come in packed order."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel, CostModel, Orchestrator, Topology
from orchmllm.orchestrator import shards
from orchmllm.orchestrator.samples import Batch, Sample, Segment
from orchmllm.orchestrator.stages import Stage


@st.composite
def passes(draw):
    """(lengths, degrees, segment owner, position, tokens): samples of short sequences (zero-size chunks where a
    sample is shorter than 2c), segments with gaps, empty ones and empty ones where the next one starts."""
    lengths = draw(st.lists(st.integers(0, 30), min_size=1, max_size=6))
    degrees = draw(st.lists(st.sampled_from([1, 1, 2, 4, 8]), min_size=len(lengths), max_size=len(lengths)))
    owner, position, tokens = [], [], []
    for sample, length in enumerate(lengths):
        at = 0
        for gap, size in draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12)), max_size=5)):
            at += gap
            if at > length:
                break
            size = min(size, length - at)
            owner.append(sample), position.append(at), tokens.append(size)
            at += size
    return tuple(np.array(column, dtype=np.int64) for column in (lengths, degrees, owner, position, tokens))


@settings(max_examples=300, deadline=None)
@given(case=passes())
def test_the_cuts_are_every_chunk_start_inside_a_segment(case):
    lengths, degrees, owner, position, tokens = case
    chunks = np.where(degrees > 1, 2 * degrees, 1)
    sample = np.repeat(np.arange(lengths.size), chunks)
    index = np.arange(sample.size) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    ways = chunks[sample]
    sizes = lengths[sample] // ways + (index < lengths[sample] % ways)
    before = np.cumsum(sizes) - sizes
    chunk_position = before - np.repeat(before[np.cumsum(chunks) - chunks], chunks)
    scale = int(lengths.max()) + 1
    starts, keys = sample * scale + chunk_position, owner * scale + position
    segment, row, chunk, at = shards._chunk_cuts(keys, tokens, starts)
    expected = [(s, int(starts[c] - keys[s]), c) for s in range(keys.size) for c in range(starts.size)
                if keys[s] < starts[c] < keys[s] + tokens[s]]
    assert list(zip(segment.tolist(), row.tolist(), chunk.tolist())) == expected
    assert at.tolist() == [int(np.flatnonzero(starts <= key)[-1]) for key in keys]


def giant_image_step(seed: int, split: bool = True):
    """The orchestrator's plan of 42 samples on 8 ranks, two of them giants of 30 images, vision and LLM stages, with
    context parallelism (degrees 1-8, latency the Topology's) or without."""
    rng = np.random.default_rng(seed)
    samples = [Sample(int(rng.integers(0, 3000 if giant else 300)), tuple(
        Segment("image", 8 * tokens, int(tokens)) for tokens in rng.integers(0, 40, 30 if giant else 3)),
        source=int(rng.integers(0, 8))) for giant in [True, True] + [False] * 40]
    stages = (Stage("vision", "image", CostModel(linear=1.0)),
              Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.5)))
    spec = ContextParallel(degrees=(1, 2, 4, 8), seconds_per_cost=1.0, kv_bytes_per_token=0.0,
                           half_efficiency_tokens=0.0) if split else None
    return Orchestrator(stages, Topology(1, 8), context_parallel=spec).plan(Batch.from_samples(samples, 8))


def test_every_ranks_routes_are_its_pieces_in_packed_order():
    """Route order by chunks (each chunk's run of pieces, the chunks by LLM rank) against its definition: the
    pieces of each LLM rank, each once, in ascending packed offset (a shard's chunk j before 2c - 1 - j)."""
    step = giant_image_step(29)
    routes = step.microbatches[0]
    assert routes.llm.split is not None  # some sample runs split
    for rank in range(8):
        mine = routes.route_rank_order[routes.route_rank_offsets[rank]:routes.route_rank_offsets[rank + 1]]
        assert sorted(mine.tolist()) == np.flatnonzero(routes.route_llm_rank == rank).tolist()
        assert np.all(np.diff(routes.route_llm_offset[mine]) >= 0)
