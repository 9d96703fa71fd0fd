"""The verl drop-in: verl's contract (arguments, sizes, errors, order), backed by orchmllm's balancers.

verl's own function is compared in `benchmarks/bench_verl.py` (it needs verl's source); here the
contract is checked as read from verl's `get_seqlen_balanced_partitions`, and the quality against
its Karmarkar–Karp as reimplemented in `study.peers.verl_seqlen_partitions`.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.integrations.verl import VerlContractError, get_seqlen_balanced_partitions
from orchmllm.study.peers import verl_seqlen_partitions

SEQLENS = st.one_of(st.lists(st.integers(0, 5000), max_size=40),
                    st.lists(st.floats(0, 5000, allow_nan=False), max_size=40))


def sums_of(values, parts):
    return [sum(values[i] for i in part) for part in parts]


@given(SEQLENS, st.integers(1, 8), st.booleans())
def test_verl_contract_holds(seqlens, k, equal_size):
    n = len(seqlens)
    if n < k or (equal_size and n % k):
        with pytest.raises(AssertionError, match=r"number of items:\[\d+\] < k_partitions|needs k_partitions"):
            get_seqlen_balanced_partitions(seqlens, k, equal_size)
        return
    parts = get_seqlen_balanced_partitions(seqlens, k, equal_size)
    assert len(parts) == k and all(part == sorted(part) and part for part in parts)
    assert all(type(i) is int for part in parts for i in part)
    assert sorted(i for part in parts for i in part) == list(range(n))  # every index once
    if equal_size:
        assert {len(part) for part in parts} == {n // k}
    keys = [(total, len(part)) for total, part in zip(sums_of(seqlens, parts), parts)]
    assert keys == sorted(keys, reverse=True)  # largest sum first, ties: more items first


def test_float_lengths_are_balanced_as_verl_balances_them():
    """Cause: the lengths were validated as integers, so verl's float workloads were refused."""
    parts = get_seqlen_balanced_partitions([0.5, 2.25, 1.75, 1.0], 2, equal_size=False)
    assert sums_of([0.5, 2.25, 1.75, 1.0], parts) == [2.75, 2.75]  # {0.5, 2.25} and {1.75, 1.0}


@pytest.mark.parametrize("n, k", [(8, 3), (10, 4), (7, 2)])
def test_equal_size_asserts_that_k_divides_n_as_verl_does(n, k):
    """Cause: floor / ceil sizes were returned where verl asserts, and verl's trainer then cut the
    reordered batch into equal chunks that no longer matched the partitions."""
    with pytest.raises(AssertionError, match=rf"equal_size=True needs k_partitions={k} to divide the {n} items "
                                             rf"\({n} % {k} = {n % k}\), as verl asserts"):
        get_seqlen_balanced_partitions(list(range(1, n + 1)), k, equal_size=True)


@pytest.mark.parametrize("seqlens, k", [([1, 2], 3), ([], 1)], ids=["fewer-items", "empty"])
def test_too_few_items_raise_an_assertion_error_as_verl_does(seqlens, k):
    """Cause: a ValueError was raised where verl raises AssertionError, so verl callers' handlers missed it."""
    with pytest.raises(AssertionError, match=rf"number of items:\[{len(seqlens)}\] < k_partitions:\[{k}\]"):
        get_seqlen_balanced_partitions(seqlens, k, equal_size=False)


def test_contract_errors_are_also_value_errors_naming_the_argument():
    assert issubclass(VerlContractError, AssertionError) and issubclass(VerlContractError, ValueError)
    with pytest.raises(ValueError, match="`k_partitions` must be at least 1; got 0"):
        get_seqlen_balanced_partitions([1, 2], 0, equal_size=False)


def test_partitions_come_largest_sum_first_as_verl_orders_them():
    """Cause: the partitions came in the balancer's rank order; verl's come sorted largest sum first."""
    rng = np.random.default_rng(0)
    for trial in range(50):
        seqlens = rng.integers(1, 100, 12).tolist()
        for equal_size in (False, True):
            parts = get_seqlen_balanced_partitions(seqlens, 3, equal_size)
            keys = [(total, len(part)) for total, part in zip(sums_of(seqlens, parts), parts)]
            assert keys == sorted(keys, reverse=True)


def test_torch_tensors_are_accepted_as_verl_accepts_them():
    """Cause: a float tensor that requires grad failed in numpy's conversion; verl's trainer passes tensors."""
    torch = pytest.importorskip("torch")
    lengths = torch.tensor([300, 20, 4000, 512, 77, 1500])
    workloads = 24576 * lengths + lengths ** 2  # verl's calculate_workload, as its trainer passes it
    expected = get_seqlen_balanced_partitions(workloads.tolist(), 2, True)
    assert get_seqlen_balanced_partitions(workloads, 2, True) == expected
    floats = workloads.double().requires_grad_()
    assert get_seqlen_balanced_partitions(floats, 2, equal_size=True) == expected


def test_tensors_without_dense_values_are_refused_naming_seqlen_list():
    """probe18 P18-15: a sparse tensor gave torch's RuntimeError "Cannot access data pointer of Tensor that doesn't
    have storage" (from `tolist`), a meta one NotImplementedError, naming no argument."""
    torch = pytest.importorskip("torch")
    dense = torch.tensor([1.0, 2, 3, 4])
    with pytest.raises(TypeError, match=r"`seqlen_list` is a tensor of layout torch.sparse_coo, not a dense one; pass "
                                        r"`seqlen_list.to_dense\(\)` or a list"):
        get_seqlen_balanced_partitions(dense.to_sparse(), 2, False)
    with pytest.raises(TypeError, match=r"`seqlen_list` is a meta tensor, which has a shape but no values"):
        get_seqlen_balanced_partitions(dense.to("meta"), 2, False)
    assert get_seqlen_balanced_partitions(dense.to_sparse().to_dense(), 2, False) == \
        get_seqlen_balanced_partitions([1.0, 2, 3, 4], 2, False)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=30), st.integers(1, 8))
@settings(max_examples=60)
def test_zero_lengths_never_leave_a_partition_empty(seqlens, k):
    """Where zero lengths leave a partition empty (verl then asserts), the cheapest item of the fullest
    partition fills it, and the largest sum is still at most Karmarkar–Karp's."""
    if len(seqlens) < k:
        return
    parts = get_seqlen_balanced_partitions(seqlens, k, equal_size=False)
    assert all(parts)
    assert max(sums_of(seqlens, parts)) <= max(sums_of(seqlens, verl_seqlen_partitions(seqlens, k, False)))


@pytest.mark.parametrize("equal_size", [False, True], ids=["free_sizes", "equal_size"])
def test_no_worse_than_verls_karmarkar_karp_on_realistic_workloads(equal_size):
    """Against verl's `get_seqlen_balanced_partitions` (reimplemented) on the same values and sizes."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        k = int(rng.choice([4, 8, 16]))
        lengths = rng.lognormal(7, 0.8, 16 * k).astype(np.int64) + 1
        workloads = (24576 * lengths + lengths ** 2).tolist()
        ours, verl = (max(sums_of(workloads, split(workloads, k, equal_size)))
                      for split in (get_seqlen_balanced_partitions, verl_seqlen_partitions))
        assert ours <= verl


@pytest.mark.parametrize("seqlens, k, equal_size", [
    ([28, 0, 85, 12, 64, 48, 46, 34, 64, 76, 71, 42], 3, True),
    ([77, 19, 41, 92, 96, 41, 0, 55, 52, 19, 35, 82, 12, 59, 64, 14], 4, False)], ids=["equal_size", "free_sizes"])
def test_regression_orchmllm_s_karmarkar_karp_breaks_ties_unlike_verl_s_so_its_plan_could_be_worse(seqlens, k,
                                                                                                   equal_size):
    """Cause: the drop-in took the better of orchmllm's Karmarkar–Karp and LPT, and orchmllm's KK breaks ties and
    merges otherwise than verl's: 194 where verl's function gives 193, 196 where it gives 191 (probe6 P6-04; ~1 %
    of uniform random instances).  verl's own plan is now a start."""
    ours, verl = (max(sums_of(seqlens, split(seqlens, k, equal_size)))
                  for split in (get_seqlen_balanced_partitions, verl_seqlen_partitions))
    assert ours <= verl


@pytest.mark.parametrize("equal_size", [False, True], ids=["free_sizes", "equal_size"])
def test_no_worse_than_verls_karmarkar_karp_on_uniform_random_values(equal_size):
    rng = np.random.default_rng(6)
    for trial in range(300):
        k = int(rng.choice([3, 4, 8]))
        seqlens = rng.integers(0, 100, k * int(rng.choice([4, 8]))).tolist()
        ours, verl = (max(sums_of(seqlens, split(seqlens, k, equal_size)))
                      for split in (get_seqlen_balanced_partitions, verl_seqlen_partitions))
        assert ours <= verl, (seqlens, k)


def test_verls_partitions_keep_its_contract_and_assertions():
    parts = verl_seqlen_partitions([812, 95, 4000, 310, 77, 1500, 640, 2300], 4, equal_size=True)
    assert [len(part) for part in parts] == [2, 2, 2, 2] and all(part == sorted(part) for part in parts)
    assert sorted(i for part in parts for i in part) == list(range(8))
    with pytest.raises(ValueError, match="`equal_size` needs k_partitions=3 to divide the 8 items, as verl asserts"):
        verl_seqlen_partitions([1] * 8, 3, equal_size=True)
    with pytest.raises(ValueError, match="verl asserts one per partition"):
        verl_seqlen_partitions([1, 2], 3, equal_size=False)


@pytest.mark.parametrize("flag", [1, 0, np.int64(1)], ids=["1", "0", "numpy 1"])
def test_regression_equal_size_given_as_0_or_1_was_refused_though_verl_takes_it(flag):
    """Cause: `equal_size` had to be a bool, so a verl caller passing 0 / 1 from a config got "`equal_size` must be
    a bool; got int" where verl's function (`if equal_size:`) runs (probe6 P6-11)."""
    seqlens = [8, 1, 1, 1, 1, 1, 1, 1]
    assert get_seqlen_balanced_partitions(seqlens, 2, flag) == get_seqlen_balanced_partitions(seqlens, 2, bool(flag))


@pytest.mark.parametrize("arguments, error, message", [
    (([1, 2], 1.5, False), TypeError, "`k_partitions` must be an int; got float"),
    (([1, 2], 1, "yes"), TypeError, "`equal_size` must be a bool; got str"),
    (([1, 2], 1, 2), ValueError, "`equal_size` must be a bool, or 0 / 1; got 2"),
    (([1, float("nan"), 2], 1, False), ValueError, "`seqlen_list` must be finite and non-negative; got nan at index 1"),
    (([1, -3, 2], 1, False), ValueError, r"`seqlen_list` must be non-negative integers; got -3 at index 1"),
    (([1.0, float("inf")], 1, False), ValueError, "`seqlen_list` must be finite and non-negative; got inf at index 1"),
    (([[1, 2], [3, 4]], 1, False), ValueError, r"`seqlen_list` must be 1-D; got shape \(2, 2\)"),
    (("1234", 1, False), TypeError, "`seqlen_list` must be a 1-D sequence of numbers; got str"),
    # the sums' checks named the balancers' `lengths` and `costs`, arguments a verl caller never passed
    (([2**53 - 1] * 1025, 2, False), ValueError,
     f"^`seqlen_list`: .* sum to {1025 * (2**53 - 1)} tokens, beyond int64"),
    (([2**62, 1], 2, False), ValueError, r"^`seqlen_list` must be below 2\*\*53, where float64 costs are exact"),
    (([1e308, 1e308, 1.0], 2, False), ValueError, r"^`seqlen_list`: .* the sum of the costs is inf"),
], ids=["k-float", "equal-size-str", "equal-size-2", "nan", "negative", "inf", "2-d", "str", "int-sum-overflow",
        "int-beyond-2-53", "float-sum-overflow"])
def test_bad_arguments_name_themselves(arguments, error, message):
    with pytest.raises(error, match=message):
        get_seqlen_balanced_partitions(*arguments)
