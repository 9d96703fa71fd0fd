"""The verl-compatible drop-in: verl's contract, backed by orchmllm's balancers."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import orchmllm.study.peers  # noqa: F401  (registers verl_kk, our reimplementation of verl's algorithm)
from orchmllm import balance
from orchmllm.integrations.verl import get_seqlen_balanced_partitions


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40), st.integers(1, 8), st.booleans())
def test_verl_contract_holds(seqlens, k, equal_size):
    if len(seqlens) < k:
        with pytest.raises(ValueError, match="every partition needs one"):
            get_seqlen_balanced_partitions(seqlens, k, equal_size)
        return
    parts = get_seqlen_balanced_partitions(seqlens, k, equal_size)
    assert len(parts) == k and all(part == sorted(part) and part for part in parts)
    assert sorted(i for part in parts for i in part) == list(range(len(seqlens)))  # every index once
    if equal_size:
        assert {len(part) for part in parts} <= {len(seqlens) // k, -(-len(seqlens) // k)}


def test_no_worse_than_verls_karmarkar_karp_on_realistic_lengths():
    rng = np.random.default_rng(0)
    for trial in range(40):
        k = int(rng.choice([4, 8, 16]))
        seqlens = (rng.lognormal(7, 0.8, 16 * k)).astype(int) + 1
        parts = get_seqlen_balanced_partitions(seqlens.tolist(), k, equal_size=False)
        ours = max(int(seqlens[part].sum()) for part in parts)
        assert ours <= balance(seqlens, k, algorithm="verl_kk").makespan


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="k_partitions"):
        get_seqlen_balanced_partitions([1, 2], 1.5, False)
    with pytest.raises(TypeError, match="equal_size"):
        get_seqlen_balanced_partitions([1, 2], 1, "yes")
