"""Runtime tier 3: real gloo groups (spawned, free port, hard timeout) moving real tensors.

Each spawned job shares its process group across many checks; a check failing on any
rank raises there, and `spawn` re-raises it here with every rank's traceback.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from orchmllm.runtime import (ExchangeMeta, FlatAllToAll, HierarchicalAllToAll, Piece, PostBalancingDispatcher,
                              Prefetcher, exchange, exchange_with_grad, gather_metadata)
from orchmllm.runtime.launch import spawn

COUNTS = [3, 0, 5, 2]  # rank 1 samples nothing
DTYPES = [(torch.float32, (2, 3)), (torch.float64, ()), (torch.bfloat16, (4,)), (torch.int64, ()),
          (torch.int8, (3,)), (torch.bool, (2,)), (torch.complex64, ()), (torch.float32, (0,))]


def item_rows(item_ids, rows, dtype, trailing, salt=0):
    """Rows of the given global items: row j of item i holds values derived from (i, j)."""
    parts = []
    for item in item_ids:
        count = int(rows[item])
        base = torch.arange(count * int(np.prod(trailing, dtype=np.int64)), dtype=torch.float64)
        values = (base + 1000 * item + salt).reshape(count, *trailing)
        parts.append((values % 2 == 1) if dtype == torch.bool else
                     (values % 100) if dtype == torch.int8 else values)
    if not parts:
        return torch.zeros((0, *trailing), dtype=dtype)
    return torch.cat(parts).to(dtype)


def routes_for(rank, size, seed, counts):
    """A random route from the home layout, with one rank left empty afterwards."""
    rng = np.random.default_rng(seed)
    n = sum(counts)
    assignment = rng.integers(0, size, n)
    assignment[assignment == seed % size] = (seed + 1) % size
    return ExchangeMeta.from_assignment(assignment, counts, rank)


def _transports(size):
    transports = {"flat": FlatAllToAll()}
    for gpus_per_node in (1, 2, size):
        transports[f"hierarchical-{size // gpus_per_node}x{gpus_per_node}"] = HierarchicalAllToAll(gpus_per_node)
    return transports


def exchange_job(rank, size):
    lengths = np.random.default_rng(rank).integers(0, 4, COUNTS[rank])
    gathered = gather_metadata(np.stack([lengths, lengths * 2], axis=1) if lengths.size else np.zeros((0, 2), np.int64))
    assert gathered.counts.tolist() == COUNTS
    for source in range(size):
        expected = np.random.default_rng(source).integers(0, 4, COUNTS[source])
        mine = gathered.values[gathered.source_ranks == source]
        assert mine[:, 0].tolist() == expected.tolist() and mine[:, 1].tolist() == (2 * expected).tolist()
    rows = gathered.column(0)
    transports = _transports(size)
    received = {}
    for seed in range(3):
        meta = routes_for(rank, size, seed, COUNTS)
        assert meta.dest_items.size == 0 or rank != seed % size
        pieces = [Piece(meta, item_rows(meta.source_items, rows, dtype, trailing, salt), rows)
                  for salt, (dtype, trailing) in enumerate(DTYPES)]
        pieces.append(Piece(meta, torch.from_numpy(meta.source_items.copy()), 1))
        pieces.append(Piece(meta, item_rows(meta.source_items, np.full(meta.num_items, 3), torch.float32, (2,)), 3))
        for name, transport in transports.items():
            outputs = exchange(pieces, transport)
            for salt, ((dtype, trailing), output) in enumerate(zip(DTYPES, outputs)):
                expected = item_rows(meta.dest_items, rows, dtype, trailing, salt)
                assert output.dtype == dtype and output.shape == expected.shape, (name, dtype)
                assert torch.equal(output, expected), (name, dtype, seed)
            assert outputs[-2].tolist() == meta.dest_items.tolist()
            back = exchange([Piece(meta.inverse(), o, p.item_rows) for o, p in zip(outputs, pieces)], transport)
            for original, returned in zip(pieces, back):
                assert torch.equal(original.tensor, returned), (name, "round trip")
            received[(seed, name)] = outputs
        for name in transports:
            for flat, other in zip(received[(seed, "flat")], received[(seed, name)]):
                assert torch.equal(flat, other)
    return {"checked_routes": 3, "transports": sorted(transports)}


def six_rank_job(rank, size):
    """3 nodes × 2 and 2 nodes × 3: ranks relay for more than one node pair."""
    counts = [2, 3, 0, 4, 1, 2]
    rows = np.array([1, 0, 2, 3, 1, 2, 2, 1, 0, 3, 2, 1])
    meta = routes_for(rank, size, 4, counts)
    tensor = item_rows(meta.source_items, rows, torch.float64, (2,))
    outputs = [exchange([Piece(meta, tensor, rows)], transport)[0]
               for transport in (FlatAllToAll(), HierarchicalAllToAll(2), HierarchicalAllToAll(3))]
    expected = item_rows(meta.dest_items, rows, torch.float64, (2,))
    assert all(torch.equal(output, expected) for output in outputs)
    return len(outputs)


def data_parallel_subgroup_job(rank, size):
    """Two data-parallel groups (even and odd world ranks), each with its own node-wise
    transport: subgroups must not mix across the two groups."""
    for parity in (0, 1):
        group = dist.new_group([r for r in range(size) if r % 2 == parity])
        if rank % 2 == parity:
            mine = group
    counts, rows = [2, 1, 3, 2], np.array([1, 2, 0, 3, 1, 2, 2, 1])
    meta = ExchangeMeta.from_assignment(np.array([3, 2, 1, 0, 0, 1, 2, 3]), counts, dist.get_rank(mine))
    tensor = item_rows(meta.source_items, rows, torch.float32, (2,), salt=rank % 2)
    flat = exchange([Piece(meta, tensor, rows)], FlatAllToAll(mine))[0]
    nodewise = exchange([Piece(meta, tensor, rows)], HierarchicalAllToAll(2, group=mine))[0]
    assert torch.equal(flat, nodewise)
    assert torch.equal(flat, item_rows(meta.dest_items, rows, torch.float32, (2,), salt=rank % 2))
    # The prefetch thread's metadata group mirrors the data-parallel group, not the world.
    dispatcher = PostBalancingDispatcher(group=mine)
    local_lengths = rows[meta.source_items]
    with Prefetcher(lambda lengths, group: dispatcher.plan(lengths, metadata_group=group),
                    training_group=mine) as prefetcher:
        prefetcher.submit(local_lengths)
        prefetched = prefetcher.result(timeout=30)
    assert prefetched.metadata.counts.tolist() == counts
    assert prefetched.balance.digest() == dispatcher.plan(local_lengths).balance.digest()
    return True


def autograd_job(rank, size):
    lengths = np.random.default_rng(10 + rank).integers(0, 5, COUNTS[rank])
    rows = gather_metadata(lengths, num_columns=1).column(0)
    results = []
    for name, transport in _transports(size).items():
        meta = routes_for(rank, size, 7, COUNTS)
        x = item_rows(meta.source_items, rows, torch.float64, (3,)).requires_grad_()
        ids = torch.from_numpy(meta.source_items.copy())
        y, moved_ids = exchange_with_grad([Piece(meta, x, rows), Piece(meta, ids, 1)], transport)
        assert not moved_ids.requires_grad
        # loss = sum over received rows of weight(i, j) * y: its gradient with respect to
        # row j of item i is weight(i, j), wherever the item was sampled.
        weights = item_rows(meta.dest_items, rows, torch.float64, (3,), salt=0.5) ** 0.5
        (y * weights).sum().backward()
        expected = item_rows(meta.source_items, rows, torch.float64, (3,), salt=0.5) ** 0.5
        assert torch.equal(x.grad, expected), name
        results.append(name)
    return results


def world_one_job(rank, size):
    meta = ExchangeMeta.from_assignment([0, 0, 0], [3], rank)
    data = torch.randn(6, 2)
    (out,) = exchange([Piece(meta, data, np.array([1, 2, 3]))])
    assert torch.equal(out, data)
    x = data.clone().requires_grad_()
    (y,) = exchange_with_grad([Piece(meta, x, 2)], HierarchicalAllToAll(1))
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    return size


def test_round_trip_is_bit_identical_for_every_dtype_route_and_transport():
    results = spawn(exchange_job, 4, timeout_s=90)
    assert all(r["checked_routes"] == 3 for r in results)
    assert results[0]["transports"] == ["flat", "hierarchical-1x4", "hierarchical-2x2", "hierarchical-4x1"]


def test_nodewise_exchange_with_several_relayed_node_pairs():
    assert spawn(six_rank_job, 6, timeout_s=90) == [3] * 6


def test_nodewise_exchange_inside_data_parallel_subgroups():
    assert all(spawn(data_parallel_subgroup_job, 8, timeout_s=90))


def test_autograd_exchange_returns_gradients_along_the_inverse_route():
    results = spawn(autograd_job, 4, timeout_s=90)
    assert all(len(r) == 4 for r in results)


def test_world_size_one_gloo_group_takes_the_same_path():
    assert spawn(world_one_job, 1, timeout_s=60) == [1]


def mismatched_columns_job(rank, size):
    gather_metadata(np.zeros((1, 1 + rank), dtype=np.int64))


def test_metadata_with_different_column_counts_is_a_clear_error():
    with pytest.raises(Exception, match="different numbers of columns"):
        spawn(mismatched_columns_job, 2, timeout_s=60)
