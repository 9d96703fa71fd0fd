"""Runtime tier 1 and 2: pure routing logic, and the no-process-group path (world size 1)."""

import importlib.util
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from orchmllm.balancers import CostModel
from orchmllm.orchestrator.samples import Sample, Segment
from orchmllm.orchestrator.stages import Stage
from orchmllm.runtime import (ExchangeMeta, FlatAllToAll, HierarchicalAllToAll, MultiStageRuntime, Piece,
                              PostBalancingDispatcher, Prefetcher, exchange, exchange_with_grad, gather_metadata,
                              make_transport, normalize_loss)
from orchmllm.runtime.alltoall import Flows
from orchmllm.runtime.demo.calibration import fit_packed_cost
from orchmllm.runtime.demo.data import SyntheticMultimodal
from orchmllm.runtime.exchange import home_ranks, ranges
from orchmllm.runtime.launch import run_processes
from orchmllm.runtime.metadata import PeerInputError, PlanMismatchError, as_table, check_agreement, fingerprint
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel


@st.composite
def routes(draw, max_ranks=4, max_items=12):
    size = draw(st.integers(1, max_ranks))
    n = draw(st.integers(0, max_items))
    rank_lists = st.lists(st.integers(0, size - 1), min_size=n, max_size=n)
    source = np.sort(np.array(draw(rank_lists), dtype=np.int64)) if draw(st.booleans()) else \
        np.array(draw(rank_lists), dtype=np.int64)
    dest = np.array(draw(rank_lists), dtype=np.int64)
    rows = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
    return size, source, dest, rows


def simulate(size, source, dest, rows):
    """Run every rank's half of an exchange in numpy: packed rows carry (item, row) labels."""
    metas = [ExchangeMeta(source, dest, rank, size) for rank in range(size)]
    held = []
    for meta in metas:
        items = meta.source_items
        held.append(np.array([(i, j) for i in items for j in range(rows[i])], dtype=np.int64).reshape(-1, 2))
    sent = [held[r][metas[r].send_row_index(rows)] for r in range(size)]
    segments = [np.split(sent[s], np.cumsum(metas[s].send_counts(rows))[:-1]) for s in range(size)]
    arrived = [np.concatenate([segments[s][d] for s in range(size)]) for d in range(size)]
    for d in range(size):
        assert [segments[s][d].shape[0] for s in range(size)] == metas[d].receive_counts(rows).tolist()
    return [arrived[d][metas[d].arrival_row_index(rows)] for d in range(size)]


@given(routes())
def test_route_delivers_every_row_once_in_ascending_item_order(case):
    size, source, dest, rows = case
    for rank, output in enumerate(simulate(size, source, dest, rows)):
        items = np.flatnonzero(dest == rank)
        expected = np.array([(i, j) for i in items for j in range(rows[i])], dtype=np.int64).reshape(-1, 2)
        np.testing.assert_array_equal(output, expected)


@given(routes())
def test_inverse_route_is_an_involution_and_swaps_the_ends(case):
    size, source, dest, rows = case
    meta = ExchangeMeta(source, dest, 0, size)
    inverse = meta.inverse()
    np.testing.assert_array_equal(inverse.source_ranks, dest)
    np.testing.assert_array_equal(inverse.inverse().dest_ranks, dest)
    for rank in range(size):
        forward, backward = ExchangeMeta(source, dest, rank, size), ExchangeMeta(dest, source, rank, size)
        np.testing.assert_array_equal(forward.send_counts(rows), backward.receive_counts(rows))
        np.testing.assert_array_equal(forward.inverse().send_items, backward.send_items)
    flows = Flows(source, dest, rows, size)
    assert sum(flows.row(r).sum() for r in range(size)) == rows.sum()
    assert sum(flows.pairs(range(size), range(size)).values()) == rows.sum()
    np.testing.assert_array_equal(flows.column(0), meta.receive_counts(rows))


def test_from_assignment_starts_from_the_home_layout():
    meta = ExchangeMeta.from_assignment([2, 0, 1, 1, 0], counts=[2, 0, 3], rank=2)
    np.testing.assert_array_equal(meta.source_ranks, [0, 0, 2, 2, 2])
    np.testing.assert_array_equal(meta.source_items, [2, 3, 4])
    np.testing.assert_array_equal(meta.dest_items, [0])
    np.testing.assert_array_equal(home_ranks([0, 2, 1]), [1, 1, 2])
    np.testing.assert_array_equal(ranges([5, 0], [2, 3]), [5, 6, 0, 1, 2])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(source_ranks=[0, 3], dest_ranks=[0, 0], rank=0, world_size=2), ValueError,
     r"`source_ranks` must be ranks in \[0, 2\)"),
    (dict(source_ranks=[0], dest_ranks=[0, 1], rank=0, world_size=2), ValueError, "one entry per item"),
    (dict(source_ranks=[0.5], dest_ranks=[0], rank=0, world_size=2), TypeError, "integer ranks"),
    (dict(source_ranks=[0], dest_ranks=[0], rank=2, world_size=2), ValueError,
     r"`rank` must be in \[0, world_size=2\)"),
    (dict(source_ranks=[[0]], dest_ranks=[0], rank=0, world_size=1), ValueError, "must be 1-D"),
], ids=["rank-out-of-range", "length-mismatch", "float-ranks", "bad-rank", "2-d"])
def test_exchange_meta_rejects_bad_routes(kwargs, error, match):
    with pytest.raises(error, match=match):
        ExchangeMeta(**kwargs)


def test_exchange_rejects_tensors_that_do_not_match_the_route():
    meta = ExchangeMeta([0, 0], [0, 0], 0, 1)
    with pytest.raises(ValueError, match="tensor has 3 rows but this rank's 2 items own 4 rows"):
        exchange([Piece(meta, torch.zeros(3), np.array([1, 3]))])
    with pytest.raises(ValueError, match="one integer row count per item"):
        exchange([Piece(meta, torch.zeros(3), np.array([1, 1, 1]))])
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        exchange([Piece(meta, [1.0, 2.0], 1)])
    with pytest.raises(ValueError,
                       match="route is for rank 0 of 2 but the transport's group has this process as rank 0 of 1"):
        exchange([Piece(ExchangeMeta([0, 1], [1, 0], 0, 2), torch.zeros(1), 1)])
    with pytest.raises(ValueError,
                       match=r"piece 1 \(\?\): route follows plan 8, piece 0's plan 7: the pieces of one exchange"):
        exchange([Piece(ExchangeMeta([0], [0], 0, 1, plan_id=7), torch.zeros(1)),
                  Piece(ExchangeMeta([0], [0], 0, 1, plan_id=8), torch.zeros(1))])
    with pytest.raises(TypeError, match="`plan_id` must be an int"):
        ExchangeMeta([0], [0], 0, 1, plan_id="step 3")
    assert ExchangeMeta.from_assignment([0], [1], 0, plan_id=7).inverse().plan_id == 7  # the way back, same plan


DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
def test_world_size_one_exchange_is_bit_identical_without_a_process_group(dtype):
    rows = np.array([2, 0, 3])
    meta = ExchangeMeta([0, 0, 0], [0, 0, 0], 0, 1)
    data = (torch.randn(5, 2, 3) * 100).to(dtype)
    per_item = torch.arange(3)
    out, ids = exchange([Piece(meta, data, rows), Piece(meta, per_item, 1)])
    assert out.dtype == dtype and out.shape == data.shape
    assert torch.equal(out, data)
    assert torch.equal(ids, per_item)


def test_world_size_one_autograd_exchange_matches_local_gradient():
    meta = ExchangeMeta([0, 0], [0, 0], 0, 1)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 3, dtype=torch.float64)
    (out,) = exchange_with_grad([Piece(meta, x, np.array([1, 3]))])
    (out * weights).sum().backward()
    assert torch.equal(x.grad, weights)


def test_dispatcher_world_size_one_keeps_everything_and_plans():
    dispatcher = PostBalancingDispatcher(algorithm="lpt", per_item_keys={"sample_id"}, check_plan=True)
    plan = dispatcher.plan([3, 1, 2])
    batch = {"tokens": torch.arange(6), "sample_id": torch.tensor([7, 8, 9])}
    moved = dispatcher.dispatch(batch, plan)
    assert torch.equal(moved["tokens"], batch["tokens"]) and torch.equal(moved["sample_id"], batch["sample_id"])
    np.testing.assert_array_equal(plan.local_lengths, [3, 1, 2])
    back = dispatcher.combine({"sample_id": moved["sample_id"]}, plan, differentiable=False)
    assert torch.equal(back["sample_id"], batch["sample_id"])
    empty = dispatcher.plan([])
    assert empty.balance is None and empty.route.num_items == 0


def test_metadata_validation_messages():
    with pytest.raises(ValueError, match=r"must be non-negative integers; got -1 at index 1$"):  # the one message (by
        as_table([1, -1])  # the item of a 1-D table since probe13 P13-18, not its (n, 1) form's "(1, 0)")
    with pytest.raises(TypeError, match="must hold integers"):
        as_table([1.5])
    with pytest.raises(ValueError, match="1-D or 2-D"):
        as_table(np.zeros((1, 1, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="32 bytes"):
        check_agreement(b"short")
    gathered = gather_metadata(np.zeros(0, dtype=np.int64), num_columns=2)
    assert gathered.values.shape == (0, 2) and gathered.counts.tolist() == [0]
    assert fingerprint("a", 1) != fingerprint("a", 2)


def test_a_uint64_length_beyond_int64_is_named_not_wrapped_to_a_negative():
    """The dispatcher's `plan` cast uint64 2**63 + 1 to int64 and reported "`lengths` must be non-negative;
    got -9223372036854775807", a value never passed (probe3 UE9)."""
    with pytest.raises(ValueError, match=r"`lengths` must fit int64 \(below 2\*\*63\); got 9223372036854775809 at "
                                         r"index 0"):
        PostBalancingDispatcher(algorithm="lpt").plan(np.array([2**63 + 1], dtype=np.uint64))


def test_transport_validation_messages():
    with pytest.raises(ValueError, match="`gpus_per_node` must be a positive int"):
        HierarchicalAllToAll(0)
    with pytest.raises(ValueError, match="unknown transport 'ring'"):
        make_transport("ring")
    with pytest.raises(ValueError, match="`gpus_per_node` is required"):
        make_transport("hierarchical")
    with pytest.raises(ValueError, match="rank 0's flows send 2"):
        FlatAllToAll()(torch.zeros(3), Flows.from_matrix([[2]]))
    with pytest.raises(ValueError, match="flows are for 2 ranks but the group has 1"):
        FlatAllToAll()(torch.zeros(3), Flows.from_matrix([[1, 2], [0, 0]]))
    single = HierarchicalAllToAll(1)
    assert torch.equal(single(torch.arange(4), Flows.from_matrix([[4]])), torch.arange(4))


def test_normalize_loss_divides_by_the_global_token_count():
    loss = normalize_loss(torch.tensor(6.0), 3)
    assert loss.item() == 2.0
    with pytest.raises(ValueError, match="`gradient_reduction` must be one of"):
        normalize_loss(torch.tensor(1.0), 1, gradient_reduction="max")
    with pytest.raises(TypeError, match="`loss_sum` must be a torch.Tensor"):
        normalize_loss(1.0, 1)


@pytest.mark.parametrize("loss_sum", [torch.tensor(5), torch.tensor(True), torch.tensor([3, 1], dtype=torch.uint8)],
                         ids=["int64", "bool", "uint8"])
def test_regression_normalize_loss_truncated_an_integer_loss_sum(loss_sum):
    """Cause (probe8 P8-02): the quotient was cast back to the loss's dtype: an int64 5 over 2 tokens came back 2,
    30 over 100 came back 0, a bool True stayed True.  An integer sum (a count of correct predictions) is refused."""
    with pytest.raises(TypeError, match=rf"`loss_sum` must be a floating-point \(or complex\) tensor; got a "
                                        rf"{loss_sum.dtype} tensor \(a sum of integers, e.g. a count of correct "
                                        rf"predictions: \.double\(\) it first\)"):
        normalize_loss(loss_sum, 2)
    assert normalize_loss(loss_sum.double(), 2).dtype == torch.float64


@pytest.mark.parametrize("count, error, message", [
    (-5, ValueError, r"`num_loss_tokens` must be >= 0; got -5"),  # was returned undivided
    (2.5, TypeError, r"`num_loss_tokens` must be an int"),  # was truncated to 2
    (True, TypeError, r"`num_loss_tokens` must be an int"),
    (torch.tensor([3, 4]), ValueError, r"`num_loss_tokens` must be one count; got a tensor of shape \(2,\)"),
    (torch.tensor(2.5), TypeError, r"`num_loss_tokens` must be an integer count; got a torch.float32 tensor"),
    (torch.tensor(-1), ValueError, r"`num_loss_tokens` must be >= 0; got -1"),
    ("3", TypeError, r"`num_loss_tokens` must be an int"),
])
def test_regression_normalize_loss_took_negative_fractional_and_misshapen_counts(count, error, message):
    """Cause: the count went through `torch.as_tensor(count, dtype=int64).reshape(())` unchecked: -5
    was clamped to 1 (the loss came back undivided), 2.5 truncated to 2, a (2,) tensor raised torch's
    "shape '[]' is invalid"."""
    with pytest.raises(error, match=message):
        normalize_loss(torch.tensor(6.0), count)


@pytest.mark.parametrize("count", [10**30, 2**63])
def test_regression_a_count_beyond_int64_gave_torch_overflow_text(count):
    """Cause: the count went to torch.tensor unchecked: 10**30 raised torch's "Overflow when unpacking long long"."""
    with pytest.raises(ValueError, match=rf"`num_loss_tokens` must be at most \(2\*\*63 - 1\) // 1 rank\(s\) = "
                                         rf"{2**63 - 1}, so that the sum over the ranks fits int64; got {count}"):
        normalize_loss(torch.tensor(6.0), count)


def normalize_huge_count(rank, world_size):
    try:
        return str(normalize_loss(torch.tensor(6.0), 2**62).item())
    except ValueError as error:
        return str(error)


def test_regression_counts_summing_beyond_int64_wrapped_the_global_count():
    """Cause: 2**62 loss tokens on each of 2 ranks all-reduced to -2**63 (int64 wraps), which the
    clamp took for 1: the loss came back undivided (times 2), no error."""
    outcomes = run_processes(normalize_huge_count, 2, timeout_s=60, collective_timeout_s=20)
    assert [o.value for o in outcomes] == [f"`num_loss_tokens` must be at most (2**63 - 1) // 2 rank(s) = "
                                           f"{(2**63 - 1) // 2}, so that the sum over the ranks fits int64; "
                                           f"got {2**62}"] * 2


def normalize_one_rank_invalid(rank, world_size):
    try:
        return str(normalize_loss(torch.tensor(6.0), -3 if rank == 1 else 4).item())
    except (ValueError, PeerInputError) as error:
        return type(error).__name__


def test_regression_an_invalid_count_on_one_rank_left_its_peers_in_the_all_reduce():
    """Cause: the rank whose count failed its check raised before the all-reduce, and its peers waited in it
    until the process group's timeout (a raw gloo error); now every rank raises at once."""
    outcomes = run_processes(normalize_one_rank_invalid, 3, timeout_s=60, collective_timeout_s=20)
    assert [o.value for o in outcomes] == ["PeerInputError", "ValueError", "PeerInputError"]


def test_regression_a_float16_loss_over_a_count_past_65504_came_back_zero():
    """Cause: the count was cast to float16 (inf past 65504), so the loss and every gradient were 0."""
    loss = normalize_loss(torch.tensor(30000.0, dtype=torch.float16), 70000)
    assert loss.dtype == torch.float16 and loss.item() == pytest.approx(30000 / 70000, rel=1e-3)


def test_normalize_loss_takes_one_element_integer_counts():
    for count in (3, np.int64(3), torch.tensor(3), torch.tensor([3], dtype=torch.int32)):
        assert normalize_loss(torch.tensor(6.0), count).item() == 2.0
    assert normalize_loss(torch.tensor(6.0), 0).item() == 6.0  # no loss token anywhere: nothing to divide
    assert normalize_loss(torch.tensor(6.0), 2**63 - 1).item() == 6.0 / (2**63 - 1)


def test_prefetcher_runs_in_the_background_and_reports_hidden_time():
    with Prefetcher(lambda value, group: value * 2) as prefetcher:
        with pytest.raises(RuntimeError, match="no prefetch pending"):
            prefetcher.result()
        prefetcher.submit(21)
        with pytest.raises(RuntimeError, match="already pending"):
            prefetcher.submit(1)
        assert prefetcher.result() == 42
        assert 0.0 <= prefetcher.hidden_fraction <= 1.0
        prefetcher.submit(None)
        with pytest.raises(TypeError):
            prefetcher.result()


def test_fit_packed_cost_recovers_exact_coefficients():
    rng = np.random.default_rng(0)
    truth = CostModel(per_item=3.0, linear=2.0, quadratic=0.5)
    batches = [rng.integers(1, 50, rng.integers(1, 9)).tolist() for _ in range(12)]
    seconds = [7.0 + sum(truth(l) for l in batch) for batch in batches]
    fitted, error = fit_packed_cost(batches, seconds)
    assert error < 1e-9
    assert fitted.per_item == pytest.approx(3.0) and fitted.linear == pytest.approx(2.0)
    assert fitted.quadratic == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least 4 timed batches"):
        fit_packed_cost(batches[:2], seconds[:2])


def test_synthetic_data_is_deterministic_and_consistent_with_its_metadata():
    config = ModelConfig()
    data = SyntheticMultimodal(config, samples_per_rank=6, seed=3)
    first, again = data.local_batch(1, 2), data.local_batch(1, 2)
    assert torch.equal(first.text["input_ids"], again.text["input_ids"])
    assert first.text["input_ids"].shape[0] == sum(s.text for s in first.samples)
    images = [g.length for s in first.samples for g in s.segments if g.modality == "image"]
    assert first.inputs["image"].shape == (sum(images), config.patch_dim)
    assert all(g.length == g.tokens * (config.pool if g.modality == "image" else config.stride)
               for s in first.samples for g in s.segments)
    assert len({s.id for s in first.samples} | {s.id for s in data.samples(1, 3)}) == 12
    with pytest.raises(ValueError, match="`samples_per_rank` must be a non-negative int"):
        SyntheticMultimodal(config, samples_per_rank=-1)


def test_tiny_model_items_do_not_interact():
    """An item's output is the same alone or packed with others (what equivalence rests on)."""
    torch.manual_seed(0)
    model = TinyMultimodalModel(ModelConfig(llm_hidden=16, encoder_hidden=16, vocab=32)).double()
    patches = torch.randn(24, model.config.patch_dim, dtype=torch.float64)
    together = model.vision(patches, [8, 16])
    alone = torch.cat([model.vision(patches[:8], [8]), model.vision(patches[8:], [16])])
    assert (together - alone).abs().max() <= 1e-12 * alone.abs().max()
    embeddings = torch.randn(9, 16, dtype=torch.float64)
    packed, single = model.llm(embeddings, [4, 5])[:4], model.llm(embeddings[:4], [4])
    assert (packed - single).abs().max() <= 1e-12 * single.abs().max()


def test_calibrate_gpu_exits_cleanly_without_cuda_and_fits_on_cpu(capsys):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "calibrate_gpu.py"
    spec = importlib.util.spec_from_file_location("calibrate_gpu", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    if not torch.cuda.is_available():
        assert script.main([]) == 0
        assert "no CUDA device" in capsys.readouterr().out
    assert script.main(["--device", "cpu", "--hidden", "16", "--heads", "2", "--lengths", "4,8,16,32",
                        "--repeats", "1", "--dtype", "float32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lengths"] == [4, 8, 16, 32] and len(report["seconds"]) == 4
    assert CostModel(**report["cost_model"]).linear >= 0
    with pytest.raises(SystemExit):
        script.main(["--device", "cpu", "--lengths", "4,8"])


def _tiny_runtime(**options):
    from orchmllm.runtime.demo import demo_stages

    config = ModelConfig(vocab=32, llm_hidden=8, encoder_hidden=8, heads=2, patch_dim=6, frame_dim=5)
    stages = demo_stages({m: CostModel() for m in ("image", "audio", "llm")}, config)
    return config, MultiStageRuntime(stages, **options)


def _one_dispatched_step(config, runtime):
    """A seeded tiny model and rank 0's batch of 3 samples, planned and dispatched by `runtime` (one micro-batch)."""
    torch.manual_seed(0)
    model = TinyMultimodalModel(config)
    local = SyntheticMultimodal(config, samples_per_rank=3, seed=2).local_batch(0, 0)
    routes = runtime.plan(local.samples)
    [micro] = runtime.microbatches(routes, runtime.dispatch(routes, text=local.text, per_sample=local.per_sample,
                                                            inputs=local.inputs))
    return model, local, micro


def test_multistage_world_size_one_runs_the_whole_path_and_validates_input():
    config, runtime = _tiny_runtime(check_plan=True)
    model, local, micro = _one_dispatched_step(config, runtime)
    routes, moved = micro.routes, micro.data
    assert torch.equal(moved.text["input_ids"], local.text["input_ids"])
    packed = runtime.forward(routes, moved, encoders=model.encoders(), text_embedding=model.llm.embed)
    assert packed.embeddings.shape == (sum(s.llm_length for s in local.samples), config.llm_hidden)
    assert packed.samples.tolist() == [0, 1, 2]

    with pytest.raises(ValueError, match="`inputs` lacks modality"):
        runtime.dispatch(runtime.plan(local.samples), text=local.text, inputs={})
    with pytest.raises(ValueError, match="`encoders` lacks modality 'audio'"):
        runtime.forward(routes, moved, encoders={"image": model.vision}, text_embedding=model.llm.embed)
    with pytest.raises(ValueError, match="encoder 'image' returned shape"):
        runtime.forward(routes, moved, encoders={**model.encoders(), "image": lambda x, lengths: x},
                        text_embedding=model.llm.embed)
    with pytest.raises(ValueError, match="has modality 'video'; the stages encode"):
        runtime.plan([Sample(4, (Segment("video", 4, 2),))])
    with pytest.raises(TypeError, match="orchestrator Sample objects"):
        runtime.plan([{"text": 3}])


def test_multistage_with_an_empty_global_batch_is_a_no_op():
    config, runtime = _tiny_runtime()
    model = TinyMultimodalModel(config)
    empty = SyntheticMultimodal(config, samples_per_rank=0).local_batch(0, 0)
    routes = runtime.plan(empty.samples)
    moved = runtime.dispatch(routes, text=empty.text, per_sample=empty.per_sample, inputs=empty.inputs)
    [micro] = runtime.microbatches(routes, moved)
    packed = runtime.forward(micro.routes, micro.data, encoders=model.encoders(), text_embedding=model.llm.embed)
    assert packed.embeddings.shape == (0, config.llm_hidden) and packed.samples.size == 0


HIDE_TORCH = """
import sys
class HideTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, HideTorch())
"""


def test_regression_runtime_without_torch_failed_deep_inside_a_submodule():
    """Cause: `orchmllm.runtime` imported torch from its first submodule, so a user without
    torch saw a bare ModuleNotFoundError; now it says what to install."""
    import subprocess
    import sys

    core = subprocess.run([sys.executable, "-c", HIDE_TORCH + "import orchmllm; print(orchmllm.balance([3, 2, 1], 2)"
                                                          ".makespan)"], capture_output=True, text=True, timeout=120)
    assert core.returncode == 0 and core.stdout.strip() == "3.0", core.stderr  # the core needs no torch
    runtime = subprocess.run([sys.executable, "-c", HIDE_TORCH + "import orchmllm.runtime"],
                             capture_output=True, text=True, timeout=120)
    assert runtime.returncode == 1
    assert "ImportError: orchmllm.runtime needs torch, which is not installed: python3.11 -m pip install " \
        "'torch>=2.4,<3'" in runtime.stderr


def test_regression_a_strided_size_one_column_crashed_the_byte_view():
    # meta[:, 0] on a rank holding one item: shape (1,), stride (2,); torch calls it contiguous
    dispatcher = PostBalancingDispatcher(per_item_keys={"sample_id", "one"})
    plan = dispatcher.plan([4])
    meta = torch.tensor([[100, 7]])
    tokens = torch.arange(8).reshape(4, 2)[:1, :1].expand(4, 1)  # per-token, stride 0 rows
    moved = dispatcher.dispatch({"sample_id": meta[:, 0], "tokens": tokens, "one": meta[:1, :1]}, plan)
    assert moved["sample_id"].tolist() == [100] and moved["tokens"].tolist() == [[0]] * 4
    assert moved["one"].tolist() == [[100]]


@pytest.mark.parametrize("build, message", [
    (lambda: PostBalancingDispatcher(check_plan="False"), "`check_plan` must be a bool; got str"),
    (lambda: _tiny_runtime(fused_input_exchange="False"), "`fused_input_exchange` must be a bool; got str"),
    (lambda: _tiny_runtime(check_plan="no"), "`check_plan` must be a bool; got str"),
])
def test_regression_runtime_flags_read_with_bool_took_false_strings_for_true(build, message):
    with pytest.raises(TypeError, match=message):
        build()


def test_regression_a_timed_out_prefetch_result_forgot_the_running_plan():
    release = threading.Event()
    with Prefetcher(lambda value, group: release.wait(30) and value * 2) as prefetcher:
        prefetcher.submit(21)
        with pytest.raises(TimeoutError, match=r"planning did not finish within 0.05 s; call result\(\) again"):
            prefetcher.result(timeout=0.05)
        release.set()
        assert prefetcher.result() == 42
    with Prefetcher(lambda value, group: (_ for _ in ()).throw(TimeoutError("solver"))) as prefetcher:  # its own
        prefetcher.submit(1)
        with pytest.raises(TimeoutError, match="^solver$"):
            prefetcher.result()
        with pytest.raises(RuntimeError, match="no prefetch pending"):
            prefetcher.result()


def test_regression_dispatcher_inputs_of_the_wrong_kind_gave_raw_python_and_torch_errors():
    dispatcher = PostBalancingDispatcher()
    plan = dispatcher.plan([3, 5])
    with pytest.raises(TypeError, match=r"`plan` must be the DispatchPlan that `plan\(\)` returned; got str"):
        dispatcher.dispatch({"tok": torch.zeros(8)}, "plan")
    with pytest.raises(TypeError, match=r"`plan` must be the DispatchPlan .*; got dict"):
        list(dispatcher.microbatches({}, {"tok": torch.zeros(8)}))
    with pytest.raises(TypeError, match=r"`plan` must be the DispatchPlan .*; got NoneType"):
        dispatcher.combine({"tok": torch.zeros(8)}, None)
    with pytest.raises(TypeError, match=r"piece 0 \(tok\): a torch.sparse_coo tensor cannot be exchanged; pass a "
                                        r"dense \(strided\) tensor"):
        dispatcher.dispatch({"tok": torch.zeros(8).to_sparse()}, plan)
    with pytest.raises(TypeError, match="`per_item_keys` must hold str names; got int 1"):
        PostBalancingDispatcher(per_item_keys=(1,))
    with pytest.raises(TypeError, match="`batch` keys must be str names; got int 1"):
        dispatcher.dispatch({1: torch.zeros(2), "tok": torch.zeros(8)}, plan)


def test_regression_an_encoder_returning_a_tuple_or_another_width_gave_raw_python_and_torch_errors():
    config, runtime = _tiny_runtime()
    model, _, micro = _one_dispatched_step(config, runtime)
    encoders = model.encoders()
    tupled = {**encoders, "image": lambda x, n: (encoders["image"](x, n),)}
    narrow = {**encoders, "audio": lambda x, n: encoders["audio"](x, n)[:, :7]}
    with pytest.raises(TypeError,
                       match=r"encoder 'image' returned a tuple; expected a tensor of shape \(\d+, hidden\)"):
        runtime.forward(micro.routes, micro.data, encoders=tupled, text_embedding=model.llm.embed)
    with pytest.raises(ValueError, match=rf"encoder 'audio' returned rows of width 7; the text embedding's rows are "
                                         rf"{config.llm_hidden} wide"):
        runtime.forward(micro.routes, micro.data, encoders=narrow, text_embedding=model.llm.embed)
    with pytest.raises(TypeError, match=r"`text_embedding` returned a tuple; expected a tensor of shape \(\d+, "
                                        r"hidden\)"):
        runtime.forward(micro.routes, micro.data, encoders=encoders, text_embedding=lambda ids: (model.llm.embed(ids),))


@pytest.mark.parametrize("fused", [True, False])
def test_regression_multi_stage_routes_kept_from_another_step_ran_its_texts_under_old_lengths(fused):
    """Cause: MultiStageRuntime.dispatch had no check of what a rank holds now: routes kept from step 0
    cut step 1's texts (two samples' lengths swapped, same total) by step 0's lengths, no error.
    `dispatch(..., samples=)` checks them against the routes' (every rank raises, through the header)."""
    config, runtime = _tiny_runtime(fused_input_exchange=fused, max_tokens_per_microbatch=10**6)
    step0 = [Sample(text=3, segments=(), id=0), Sample(text=6, segments=(), id=1)]
    step1 = [Sample(text=6, segments=(), id=0), Sample(text=3, segments=(), id=1)]
    kept = runtime.plan(step0)
    text = {"input_ids": torch.arange(9)}
    with pytest.raises(PlanMismatchError, match=r"rank 0's sample 0 has \(text, segments, id\) \(6, 0, 0\) but the "
                                                r"plan was made with \(3, 0, 0\): the plan is another step's"):
        list(runtime.microbatches(kept, runtime.dispatch(kept, text=text, samples=step1)))
    [micro] = runtime.microbatches(kept, runtime.dispatch(kept, text=text, samples=step0))
    assert micro.lengths.tolist() == [3, 6]


def test_regression_routes_kept_from_a_step_whose_image_sat_elsewhere_in_its_sample_were_not_refused():
    """Cause (probe12 P12-05): `dispatch(..., samples=)` compared each segment's modality, length, tokens and frames
    but not its position, so routes kept from a step whose image came before the text spliced this step's image
    (after the text) at the old positions, no error."""
    stages = (Stage("vision", "image", CostModel(linear=1)), Stage("llm", "llm", CostModel(linear=1)))
    runtime = MultiStageRuntime(stages)
    kept = runtime.plan([Sample(6, (Segment("image", 4, 2, 0),))])
    text, inputs = {"input_ids": torch.arange(6)}, {"image": torch.zeros(4, 3)}
    with pytest.raises(PlanMismatchError, match=r"rank 0's segment 0 has \(modality, length, tokens, position, "
                                                r"frames\) \(0, 4, 2, 6, 1\) but the plan was made with "
                                                r"\(0, 4, 2, 0, 1\): the plan is another step's"):
        list(runtime.microbatches(kept, runtime.dispatch(kept, text=text, inputs=inputs,
                                                         samples=[Sample(6, (Segment("image", 4, 2, 6),))])))
    runtime.dispatch(kept, text=text, inputs=inputs, samples=[Sample(6, (Segment("image", 4, 2, 0),))])


SLIPS = {  # what a user passes by mistake -> (the error, the message it must match)
    "an encoder of one argument": (lambda model, micro, routes, local: dict(
        encoders={**model.encoders(), "image": torch.nn.Linear(6, 8)}, text_embedding=model.llm.embed),
        TypeError, r"encoder 'image' must accept 2 positional arguments \(packed inputs, their lengths\); got "
                   r"Linear.forward\(input"),
    "a text_key of no text tensor": (lambda model, micro, routes, local: dict(
        encoders=model.encoders(), text_embedding=model.llm.embed, text_key="tokens"),
        ValueError, r"`text_key` 'tokens' is not a key of `micro.data.text` \(keys: \['input_ids'"),
    "no text embedding": (lambda model, micro, routes, local: dict(encoders=model.encoders(), text_embedding=None),
                          TypeError, r"`text_embedding` must be callable with \(token ids\); got NoneType"),
}


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_regression_forward_slips_raised_raw_python_errors_naming_no_argument(slip):
    """An encoder of one argument raised torch's "forward() takes 2 positional arguments but 3 were given",
    a wrong text_key a bare KeyError, text_embedding=None "'NoneType' object is not callable"."""
    config, runtime = _tiny_runtime()
    model, local, micro = _one_dispatched_step(config, runtime)
    arguments, error, message = SLIPS[slip]
    with pytest.raises(error, match=message):
        runtime.forward(micro.routes, micro.data, **arguments(model, micro, None, local))


def test_regression_dispatch_and_scatter_text_slips_raised_raw_python_errors_naming_no_argument():
    config, runtime = _tiny_runtime()
    model, local, micro = _one_dispatched_step(config, runtime)
    routes = runtime.plan(local.samples)
    with pytest.raises(TypeError, match=r"`routes` must be what `plan` returned for this step, a StepRoutes; got "
                                        r"StepPlan"):
        runtime.dispatch(routes.step, text=local.text, inputs=local.inputs)
    with pytest.raises(TypeError, match=r"`text` must be a mapping of names to tensors; got NoneType"):
        runtime.dispatch(routes, text=None, inputs=local.inputs)
    packed = runtime.forward(micro.routes, micro.data, encoders=model.encoders(), text_embedding=model.llm.embed)
    rows = len(micro.data.text["input_ids"])
    with pytest.raises(ValueError, match=rf"`values` must hold one row per text token of this micro-batch \({rows}, "
                                         rf".*got \({rows - 1},\)"):
        packed.scatter_text(micro.data.text["input_ids"][1:], -100)
    with pytest.raises(ValueError, match=r"`values` 'label' is not a key of this micro-batch's `micro.data.text` "):
        packed.scatter_text("label", -100)


def test_regression_prefetcher_submit_after_close_and_a_negative_timeout_gave_raw_or_absurd_answers():
    """P4-16: `submit` after `close` raised concurrent.futures' "cannot schedule new futures after shutdown", and
    `result(timeout=-1)` was accepted ("did not finish within -1 s")."""
    prefetcher = Prefetcher(lambda value, group: value)
    prefetcher.submit(1)
    with pytest.raises(ValueError, match=r"`timeout` must be finite and >= 0; got -1.0"):
        prefetcher.result(timeout=-1)
    assert prefetcher.result(timeout=30) == 1
    prefetcher.close()
    with pytest.raises(RuntimeError, match=r"this Prefetcher is closed; make a new one to plan again"):
        prefetcher.submit(2)


@pytest.mark.parametrize("call", ["dispatch", "combine"])
def test_regression_a_per_item_tensor_left_out_of_per_item_keys_got_a_row_count_error_without_the_cause(call):
    """Cause (probe8 P8-05): a per-item tensor whose key was not in `per_item_keys` was taken for a per-token one,
    and the error said only "tensor has 2 rows but this rank's 2 items own 5 rows"."""
    dispatcher = PostBalancingDispatcher()
    plan = dispatcher.plan([2, 3])
    batch = {"x": torch.zeros(5), "sid": torch.tensor([1, 2])}
    if call == "combine":
        batch = {**dispatcher.dispatch({"x": torch.zeros(5)}, plan), "score": torch.tensor([1.0, 2.0])}
    key = "sid" if call == "dispatch" else "score"
    with pytest.raises(ValueError, match=rf"piece 0 \({key}\): tensor has 2 rows but this rank's 2 items own 5 rows "
                                         rf"\(one per token: every key not in `per_item_keys` is per-token; a tensor "
                                         rf"of one row per item must be listed there\)"):
        getattr(dispatcher, call)(batch, plan)


SAMPLER_LENGTHS = [9, 1, 1, 1, 5, 3, 3, 1, 2, 7, 4, 4]


def sampler_step_job(rank, size):
    """Each rank accumulates its micro-batches of the sampler's first step (T = 9), each loss divided by the step's
    token count the sampler gives; then the gradients are averaged over the ranks, as DDP does."""
    from orchmllm.runtime import all_reduce_gradients
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    sampler = BalancedDistributedSampler(SAMPLER_LENGTHS, num_replicas=size, rank=rank, global_batch_size=12,
                                         max_tokens_per_microbatch=9)
    weight = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
    refused = None
    for micro in sampler:
        tokens = torch.cat([torch.full((SAMPLER_LENGTHS[i],), float(i + 1), dtype=torch.float64) for i in micro]
                           + [torch.zeros(0, dtype=torch.float64)])
        try:
            normalize_loss((weight * tokens).sum(), tokens.numel())
        except ValueError as error:
            refused = str(error)
        normalize_loss((weight * tokens).sum(), total_loss_tokens=sampler.step_tokens()[0]).backward()
    all_reduce_gradients([weight], op="mean")
    return float(weight.grad), sampler.step_tokens(), refused


@pytest.mark.parametrize("size", [1, 2])
def test_regression_a_budgeted_samplers_micro_batches_had_no_step_count_and_a_per_micro_batch_one_gave_3x(size):
    """Cause (probe8 P8-06): the sampler yields a step as micro-batches (plain index lists) and gave no step count;
    `normalize_loss(loss, count)` per micro-batch, as its README said, weighted tokens by the micro-batch they sat in
    (gradient 3.1x off).  The sampler now gives `step_tokens()`, `normalize_loss(..., total_loss_tokens=)` divides
    by it with no collective, and a per-micro-batch count is refused while a budgeted sampler yields."""
    outcomes = run_processes(sampler_step_job, size, timeout_s=60) if size > 1 else [None]
    results = [o.value for o in outcomes] if size > 1 else [sampler_step_job(0, 1)]
    expected = sum(float(i + 1) * length for i, length in enumerate(SAMPLER_LENGTHS)) / sum(SAMPLER_LENGTHS)
    for grad, step_tokens, refused in results:
        assert step_tokens == [sum(SAMPLER_LENGTHS)] and grad == pytest.approx(expected, rel=1e-12)
        assert refused.startswith("normalize_loss with a count while a BalancedDistributedSampler with "
                                  "`max_tokens_per_microbatch` yields micro-batches in this process"), refused
        assert "normalize_loss(loss_sum, total_loss_tokens=sampler.step_tokens()[step])" in refused


def test_regression_a_budgeted_sampler_dropped_before_another_ended_left_the_count_refused():
    """Cause (review of 1ae267b): the sampler's mark on the thread was saved and restored by each generator, so
    with two budgeted iterators, one exhausted and the other dropped, the older one's mark stayed: a count for a
    loss with grad was refused, naming a sampler no longer iterated.  A mark lives as long as its sampler."""
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    first, second = (iter(BalancedDistributedSampler(SAMPLER_LENGTHS, num_replicas=1, rank=0, global_batch_size=12,
                                                     max_tokens_per_microbatch=9, seed=seed)) for seed in (0, 1))
    next(first), next(second)
    list(first)
    with pytest.raises(ValueError, match="while a BalancedDistributedSampler"):
        normalize_loss(torch.tensor(6.0, requires_grad=True), 3)  # the second still yields
    del second
    assert normalize_loss(torch.tensor(6.0, requires_grad=True), 3).item() == 2.0


def test_regression_another_loaders_loss_beside_a_budgeted_sampler_was_refused_with_no_way_out_for_it():
    """Cause (probe8 P8-11): while a budgeted sampler yields, a count for any loss with grad on the thread is
    refused, also one of another, unbudgeted loader (multi-task training); the message named only the sampler's
    own step count.  It names the way for another batch's loss too, which gives the count's global sum."""
    from orchmllm.runtime import global_count
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    budgeted = iter(BalancedDistributedSampler(SAMPLER_LENGTHS, num_replicas=1, rank=0, global_batch_size=12,
                                               max_tokens_per_microbatch=9))
    next(budgeted)  # mid-epoch
    loss_sum = torch.tensor(6.0, requires_grad=True)
    with pytest.raises(ValueError, match=r"a loss of another batch \(another loader's, not split into micro-batches\) "
                                         r"takes `total_loss_tokens=global_count\(count\)`"):
        normalize_loss(loss_sum, 3)
    assert normalize_loss(loss_sum, total_loss_tokens=global_count(3)).item() == 2.0


def test_regression_a_budgeted_sampler_iterated_on_another_thread_or_listed_left_counts_unguarded():
    """Cause (probe9 P9-04): the sampler's mark was per thread and per generator, so a sampler iterated on a
    producer thread, or materialised with `list(...)`, let a per-micro-batch count through (P8-06's 3.1x).  The
    mark lives with the sampler, for every thread of the process."""
    import threading

    from orchmllm.runtime.sampler import BalancedDistributedSampler

    sampler = BalancedDistributedSampler(SAMPLER_LENGTHS, num_replicas=1, rank=0, global_batch_size=12,
                                         max_tokens_per_microbatch=9)
    producer = threading.Thread(target=lambda: list(sampler))
    producer.start()
    producer.join()
    with pytest.raises(ValueError, match="while a BalancedDistributedSampler"):
        normalize_loss(torch.tensor(6.0, requires_grad=True), 3)
    del sampler
    assert normalize_loss(torch.tensor(6.0, requires_grad=True), 3).item() == 2.0


def test_regression_the_samplers_kept_plans_and_step_tokens_outlived_a_new_seed():
    """Cause (probe9 P9-05): the epoch's plans and step tokens were kept by epoch alone, so a seed set between two
    calls of one epoch gave the old seed's batches' tokens."""
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    options = dict(num_replicas=1, rank=0, global_batch_size=5, max_tokens_per_microbatch=9)
    sampler = BalancedDistributedSampler(SAMPLER_LENGTHS, **options)
    sampler.step_tokens(), sampler.microbatches_per_step()
    sampler.seed = 3
    fresh = BalancedDistributedSampler(SAMPLER_LENGTHS, seed=3, **options)
    assert sampler.step_tokens() == fresh.step_tokens()
    assert list(sampler) == list(fresh)


@pytest.mark.parametrize("setting, value", [
    ("max_tokens_per_microbatch", 9), ("global_batch_size", 5), ("drop_last", False), ("epoch", 1),
    ("lengths", np.array(SAMPLER_LENGTHS[::-1])), ("lengths", SAMPLER_LENGTHS[::-1]),
    ("cost", CostModel(linear=1, quadratic=1)),
    ("algorithm", "cells")], ids=lambda value: value if isinstance(value, str) else None)
def test_regression_the_samplers_kept_plans_and_step_tokens_outlived_a_change_of_any_setting(setting, value):
    """Cause (probe10 P10-03): after P9-05 the epoch's plans and step tokens were kept by (epoch, seed), so any
    other setting changed after first use (a curriculum lowering the budget, a larger batch) gave the old plans:
    micro-batches over the new budget, half the epoch's samples lost.  They are kept by every setting now."""
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    options = dict(num_replicas=2, global_batch_size=8, max_tokens_per_microbatch=12, drop_last=True,
                   lengths=np.array(SAMPLER_LENGTHS), cost=None, algorithm="auto")
    samplers = [BalancedDistributedSampler(rank=rank, check_agreement=False, **options) for rank in range(2)]
    for sampler in samplers:
        sampler.step_tokens(), sampler.microbatches_per_step()
        setattr(sampler, setting, value)
    options[setting] = value
    epoch = options.pop(setting) if setting == "epoch" else 0
    fresh = [BalancedDistributedSampler(rank=rank, check_agreement=False, **options) for rank in range(2)]
    for sampler in fresh:
        sampler.set_epoch(epoch)
    for changed, new in zip(samplers, fresh):
        assert (changed.step_tokens(), changed.microbatches_per_step(), list(changed)) == \
               (new.step_tokens(), new.microbatches_per_step(), list(new))


@pytest.mark.parametrize("setting, value, error, message", [
    ("global_batch_size", 1000, ValueError, "`global_batch_size` 1000 exceeds the 12 samples"),
    ("global_batch_size", 1, ValueError, "`global_batch_size` must be >= 2; got 1"),
    ("seed", -1, ValueError, "`seed` must be >= 0; got -1"),
    ("drop_last", "no", TypeError, "`drop_last` must be a bool; got str"),
    ("max_tokens_per_microbatch", 5, ValueError, "`max_tokens_per_microbatch`=5 is below the 9 tokens of sample 0"),
    ("lengths", [1, 2.5], ValueError, "`lengths` must be")])
def test_regression_a_sampler_setting_set_after_first_use_went_unchecked(setting, value, error, message):
    """Cause (probe10 P10-18): since the kept plans follow every setting (P10-03), a setting may be set after first
    use, but only the constructor checked them: a batch over the dataset gave an empty epoch, one sample for two
    replicas left rank 1 nothing, a negative seed failed inside numpy.  Every use checks them now."""
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    sampler = BalancedDistributedSampler(SAMPLER_LENGTHS, num_replicas=2, rank=0, global_batch_size=4,
                                         max_tokens_per_microbatch=12, check_agreement=False)
    sampler.microbatches_per_step()
    setattr(sampler, setting, value)
    for use in (lambda: list(sampler), sampler.step_tokens, sampler.microbatches_per_step, sampler.global_batches,
                lambda: len(sampler)):
        with pytest.raises(error, match=re.escape(message)):
            use()


def test_regression_a_read_only_int64_array_of_lengths_went_unvalidated():
    """Cause (review7 R7-03): the sampler skipped validating any read-only int64 array (taking it for its own
    checked copy), so frozen lengths with a negative entry failed later in planning as a batch index, and a
    frozen 2-D array with a raw IndexError."""
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    for bad, match in ((np.array([5, -3, 4, 2], dtype=np.int64), "lengths"),
                       (np.ones((2, 2), dtype=np.int64), "`lengths` must be 1-D")):
        bad.flags.writeable = False
        with pytest.raises(ValueError, match=match):
            BalancedDistributedSampler(bad, num_replicas=1, rank=0, global_batch_size=2)


def test_the_samplers_lengths_are_read_only():
    """Its plans are kept by the identity of its lengths, so they can be replaced, not written in place."""
    from orchmllm.runtime.sampler import BalancedDistributedSampler

    sampler = BalancedDistributedSampler(SAMPLER_LENGTHS, num_replicas=1, rank=0, global_batch_size=5)
    with pytest.raises(ValueError, match="read-only"):
        sampler.lengths[0] = 3


def test_regression_a_negative_length_was_named_by_its_index_in_an_internal_table():
    """Cause (probe13 P13-18): a flat list of lengths was checked as the (n, 1) table it becomes, so a negative
    entry was named "at index (1, 0)"; it is named by its item, as `balance` names it."""
    with pytest.raises(ValueError, match=r"^`lengths` must be non-negative integers; got -3 at index 1$"):
        PostBalancingDispatcher().plan([5, -3])
    with pytest.raises(ValueError, match=r"^`loss_tokens` must be non-negative integers; got -2 at index 1$"):
        PostBalancingDispatcher().plan([5, 3], loss_tokens=[1, -2])


@pytest.mark.parametrize("options, message", [
    ({"group": [0, 1]}, r"`group` must be a torch.distributed ProcessGroup, or None for the default group; got list "
                        r"\(ranks: make their group with dist.new_group\(ranks\)\)"),
    ({"group": 5}, r"`group` must be a torch.distributed ProcessGroup, or None for the default group; got int$"),
    ({"transport": "hierarchical"}, r"`transport` must be an exchange such as FlatAllToAll\(group\) or "
                                    r"HierarchicalAllToAll\(gpus_per_node, group\), or None for FlatAllToAll\(group\); "
                                    r"got str \(a name: build it with runtime.hierarchical.make_transport"),
], ids=["ranks_as_group", "int_group", "transport_name"])
def test_regression_a_group_or_transport_of_the_wrong_kind_failed_later_naming_neither(options, message):
    """Cause (probe15 P15-20): `MultiStageRuntime(group=[0, 1])` or `transport="flat"` was accepted and planned on one
    process, then failed inside the runtime with raw Python errors (a weak reference to a list, a str's `size`)
    naming neither argument.  Both are checked when the runtime is built."""
    stages = (Stage("vision", "image", CostModel(linear=1)), Stage("llm", "llm", CostModel(linear=1)))
    with pytest.raises(TypeError, match=message):
        MultiStageRuntime(stages, **options)
