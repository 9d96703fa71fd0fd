"""Topology: communication-aware balancing, group placement (LAP, ILP) and exchange times.

Run: python3.11 -m pytest benchmarks/bench_topology.py --benchmark-only -q
     (add --heavy for D = 16384 × 16)

Workload: 16 multimodal-like samples per rank (text lognormal up to 4096 tokens, half
with 1-4 image tiles of 576 tokens, 30 % with up to 30 s of audio at 25 tokens/s),
sampled at random by every rank; item bytes = tokens × 8 KiB (bf16 hidden states of
width 4096); 8 GPUs per node (H100 preset).  Costs: "linear" f(l) = l, and "llm" the
FLOPs of a 32-layer, 4096-wide transformer (linear + causal attention).
"""


import numpy as np
import pytest

from orchmllm.balancers import ALGORITHMS, CostModel, balance, make_problem
from orchmllm.balancers.locality.balance import balance_locally
from orchmllm.balancers.origins import Origins
from orchmllm.balancers.problem import rank_loads
from orchmllm.study.workloads import llm_stage_lengths
from orchmllm.topology import Topology, estimate_exchange, place, traffic
from orchmllm.topology.bounds import inter_node_lower_bound

PLAIN = "auto" if "auto" in ALGORITHMS else "lpt"
COSTS = {"linear": CostModel(), "llm": CostModel.from_transformer(num_layers=32, hidden_size=4096)}
BYTES_PER_TOKEN = 8192
PER_RANK = 16


def _sizes(request, num_ranks):
    if num_ranks > 2560 and not request.config.getoption("--heavy", default=False):
        pytest.skip("D=16384 runs with --heavy")


@pytest.mark.parametrize("plain_name", sorted({"lpt", PLAIN}))
@pytest.mark.parametrize("cost_name", sorted(COSTS))
@pytest.mark.parametrize("num_ranks", [256, 2560, 16384], ids=["D256", "D2560", "D16384"])
def test_comm_aware_balance(benchmark, best_of, request, num_ranks, cost_name, plain_name):
    """balance(..., sources=, item_bytes=, topology=) against the plain balancer, same run."""
    _sizes(request, num_ranks)
    cost = COSTS[cost_name]
    lengths, sources = llm_stage_lengths(num_ranks, PER_RANK, seed=num_ranks)
    item_bytes = lengths * float(BYTES_PER_TOKEN)
    topology = Topology.for_world_size(num_ranks)
    plan = benchmark(balance, lengths, num_ranks, cost=cost, algorithm=plain_name, sources=sources,
                     item_bytes=item_bytes, topology=topology)
    plain = balance(lengths, num_ranks, cost=cost, algorithm=plain_name)
    plain_seconds = best_of(lambda: balance(lengths, num_ranks, cost=cost, algorithm=plain_name), repeats=5)
    move = traffic(sources, plan.assignment, item_bytes, topology)
    plain_move = traffic(sources, plain.assignment, item_bytes, topology)
    placed_move = place(plain.assignment, sources, item_bytes, topology, "lap_node").traffic
    bound = inter_node_lower_bound(plan.cost.item_costs(lengths), sources, item_bytes, topology, plan.makespan)
    assert np.bincount(plan.assignment, minlength=num_ranks).sum() == lengths.size
    assert plan.makespan <= plain.makespan * 1.002
    assert move.inter_node_fraction <= 0.10
    assert move.bytes_inter_node <= 2 * bound.bytes_inter_node
    assert move.busiest_node_inter_bytes <= 1.25 * bound.busiest_node_inter_bytes
    benchmark.extra_info.update(
        items=int(lengths.size),
        makespan_over_plain=plan.makespan / plain.makespan,
        inter_node_fraction=move.inter_node_fraction,
        inter_node_over_bound=move.bytes_inter_node / bound.bytes_inter_node,
        busiest_node_over_bound=move.busiest_node_inter_bytes / bound.busiest_node_inter_bytes,
        kept_on_rank_fraction=move.bytes_kept / move.bytes_total,
        plain_inter_node_fraction=plain_move.inter_node_fraction,
        plain_lap_node_inter_node_fraction=placed_move.inter_node_fraction,
        plain_seconds=plain_seconds,
        time_over_plain=benchmark.stats.stats.min / plain_seconds)


@pytest.mark.parametrize("num_ranks", [256, 2560, 16384], ids=["D256", "D2560", "D16384"])
def test_comm_aware_padded(benchmark, best_of, request, num_ranks):
    """Padded image-encoder stage (1-4 tiles of 576 patches per image, 16 images per rank)."""
    _sizes(request, num_ranks)
    rng = np.random.default_rng(num_ranks)
    lengths = rng.integers(1, 5, 16 * num_ranks) * 576
    sources = np.repeat(np.arange(num_ranks), 16)
    item_bytes = lengths * 3.0 * 14 * 14 * 2  # bf16 RGB pixels of 14 × 14 patches
    topology = Topology.for_world_size(num_ranks)
    cost = CostModel(linear=1, quadratic=1 / 1024)
    plan = benchmark(balance, lengths, num_ranks, cost=cost, padded=True, algorithm="padded", sources=sources,
                     item_bytes=item_bytes, topology=topology)
    plain = balance(lengths, num_ranks, cost=cost, padded=True, algorithm="padded")
    assert plan.makespan <= plain.makespan
    move = traffic(sources, plan.assignment, item_bytes, topology)
    placed = place(plain.assignment, sources, item_bytes, topology, "lap_node").traffic
    assert move.bytes_inter_node <= placed.bytes_inter_node
    benchmark.extra_info.update(
        inter_node_fraction=move.inter_node_fraction,
        plain_inter_node_fraction=traffic(sources, plain.assignment, item_bytes, topology).inter_node_fraction,
        plain_lap_node_inter_node_fraction=placed.inter_node_fraction,
        plain_seconds=best_of(lambda: balance(lengths, num_ranks, cost=cost, padded=True, algorithm="padded"), 3))


@pytest.mark.parametrize("cost_name", sorted(COSTS))
@pytest.mark.parametrize("num_ranks", [256, 2560, 16384], ids=["D256", "D2560", "D16384"])
def test_locality_step(benchmark, best_of, request, num_ranks, cost_name):
    """The communication-aware step alone, given the plain plan, against LPT timed in the same run."""
    _sizes(request, num_ranks)
    lengths, sources = llm_stage_lengths(num_ranks, PER_RANK, seed=num_ranks)
    item_bytes = lengths * float(BYTES_PER_TOKEN)
    problem = make_problem(lengths, num_ranks, cost=COSTS[cost_name])
    plain = ALGORITHMS[PLAIN](problem).assignment
    assignment = benchmark(balance_locally, problem, plain, Origins(sources, item_bytes, 8), 0.002)
    assert rank_loads(problem, assignment).max() <= rank_loads(problem, plain).max() * 1.002
    lpt_seconds = best_of(lambda: ALGORITHMS["lpt"](problem), repeats=5)
    benchmark.extra_info.update(lpt_seconds=lpt_seconds, time_over_lpt=benchmark.stats.stats.min / lpt_seconds)


@pytest.mark.parametrize("order", ["sorted", "ramp"])
@pytest.mark.parametrize("num_ranks", [1024, 2560], ids=["D1024", "D2560"])
def test_comm_aware_length_grouped(num_ranks, order, alternated_cpu):
    """probe22 P22-02: length-grouped sampling (the default mix sorted, or a ramp 3..3n; rank r holds the r-th
    run of 32) makes every plain group draw from 32 nodes: the fallback's exact node-level LAP took 1-2 s at 2560
    (22-38x the default mix); the groups now go on nodes greedily by bytes.  CPU seconds alternated with the same
    lengths in the default order (the mix as sampled, the ramp shuffled; same cost, sources) in one process:
    within 10x on the best-of or the median (issue 24); bytes across nodes within 0.5 % of the exact LAP's
    placement of the plain plan."""
    per_rank, cost = 32, COSTS["llm"]
    default, sources = llm_stage_lengths(num_ranks, per_rank, seed=num_ranks)
    if order == "ramp":
        default = np.random.default_rng(num_ranks).permutation(np.arange(1, default.size + 1) * 3)
    lengths = np.sort(default)
    topology = Topology.for_world_size(num_ranks)

    def plan(x):
        return balance(x, num_ranks, cost=cost, sources=sources, item_bytes=x * float(BYTES_PER_TOKEN),
                       topology=topology)

    item_bytes = lengths * float(BYTES_PER_TOKEN)
    result, plain = plan(lengths), balance(lengths, num_ranks, cost=cost)
    assert result.makespan <= plain.makespan * 1.002
    placed = place(plain.assignment, sources, item_bytes, topology, "lap_node").traffic
    move = traffic(sources, result.assignment, item_bytes, topology)
    assert move.bytes_inter_node <= placed.bytes_inter_node * 1.005
    own, base = alternated_cpu(lambda: plan(lengths), lambda: plan(default))
    best, median = min(own) / min(base), float(np.median(own) / np.median(base))
    print(f"\nlocality, length-grouped {order} {num_ranks} x {per_rank}: {min(own) * 1e3:.1f} ms CPU, default order "
          f"{min(base) * 1e3:.1f} ms; ratio best-of {best:.2f}, median {median:.2f}; inter-node bytes / exact LAP "
          f"placement's {move.bytes_inter_node / placed.bytes_inter_node:.5f}")
    assert min(best, median) <= 10


@pytest.mark.parametrize("num_ranks", [256, 2560], ids=["D256", "D2560"])
@pytest.mark.parametrize("method", ["lap", "lap_node"])
def test_lap_placement(benchmark, num_ranks, method):
    """Exact group -> rank placement of the plain plan (rank level, node level)."""
    lengths, sources = llm_stage_lengths(num_ranks, PER_RANK, seed=num_ranks)
    item_bytes = lengths * float(BYTES_PER_TOKEN)
    topology = Topology.for_world_size(num_ranks)
    groups = balance(lengths, num_ranks, cost=COSTS["llm"], algorithm=PLAIN).assignment
    placement = benchmark(place, groups, sources, item_bytes, topology, method)
    identity = place(groups, sources, item_bytes, topology, "identity").traffic
    assert sorted(placement.rank_of_group.tolist()) == list(range(num_ranks))
    assert placement.traffic.bytes_kept >= identity.bytes_kept
    benchmark.extra_info.update(
        kept_on_rank_fraction=placement.traffic.bytes_kept / placement.traffic.bytes_total,
        inter_node_fraction=placement.traffic.inter_node_fraction,
        identity_inter_node_fraction=identity.inter_node_fraction)


def test_ilp_placement(benchmark):
    """The paper's node-wise min-max ILP at D = 256 within its time limit, vs its lap_node start."""
    num_ranks, time_limit = 256, 30.0
    lengths, sources = llm_stage_lengths(num_ranks, PER_RANK, seed=num_ranks)
    item_bytes = lengths * float(BYTES_PER_TOKEN)
    topology = Topology.for_world_size(num_ranks)
    groups = balance(lengths, num_ranks, cost=COSTS["llm"], algorithm=PLAIN).assignment
    placement = benchmark.pedantic(place, args=(groups, sources, item_bytes, topology, "ilp", time_limit),
                                   rounds=1, iterations=1)
    lap = place(groups, sources, item_bytes, topology, "lap_node").traffic
    ilp = placement.traffic
    assert (ilp.busiest_node_inter_bytes, ilp.bytes_inter_node) <= (lap.busiest_node_inter_bytes, lap.bytes_inter_node)
    assert placement.solve_seconds <= time_limit + 5
    benchmark.extra_info.update(
        status=str(placement.status), time_limit=time_limit,
        busiest_node_over_lap_node=ilp.busiest_node_inter_bytes / lap.busiest_node_inter_bytes,
        inter_node_over_lap_node=ilp.bytes_inter_node / lap.bytes_inter_node)


@pytest.mark.parametrize("strategy", ["flat", "nodewise", "allgather"])
def test_exchange_model(benchmark, strategy):
    """Modelled exchange time at D = 2560 of the plain plan and the comm-aware one."""
    num_ranks = 2560
    lengths, sources = llm_stage_lengths(num_ranks, PER_RANK, seed=num_ranks)
    item_bytes = lengths * float(BYTES_PER_TOKEN)
    topology = Topology.for_world_size(num_ranks)
    plain = balance(lengths, num_ranks, cost=COSTS["llm"], algorithm=PLAIN).assignment
    local = balance(lengths, num_ranks, cost=COSTS["llm"], algorithm=PLAIN, sources=sources,
                    item_bytes=item_bytes, topology=topology).assignment
    estimate = benchmark(estimate_exchange, sources, local, item_bytes, topology, strategy)
    plain_estimate = estimate_exchange(sources, plain, item_bytes, topology, strategy)
    assert estimate.seconds > 0 and plain_estimate.seconds > 0
    benchmark.extra_info.update(
        comm_aware_seconds=estimate.seconds, plain_seconds=plain_estimate.seconds,
        comm_aware_peak_bytes=float(estimate.rank_peak_bytes.max()),
        plain_peak_bytes=float(plain_estimate.rank_peak_bytes.max()),
        bottleneck=estimate.bottleneck)
