"""The verl-compatible drop-in: verl's contract, backed by orchmllm's balancers."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm.integrations.verl import get_seqlen_balanced_partitions
from orchmllm.study.peers import verl_seqlen_partitions


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


@pytest.mark.parametrize("equal_size", [False, True], ids=["free_sizes", "equal_size"])
def test_no_worse_than_verls_karmarkar_karp_on_realistic_lengths(equal_size):
    """Against verl's `get_seqlen_balanced_partitions` (reimplemented) on the same values and sizes."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        k = int(rng.choice([4, 8, 16]))
        seqlens = (rng.lognormal(7, 0.8, 16 * k)).astype(int) + 1
        ours, verl = (max(int(seqlens[part].sum()) for part in split(seqlens.tolist(), k, equal_size))
                      for split in (get_seqlen_balanced_partitions, verl_seqlen_partitions))
        assert ours <= verl


def test_verls_partitions_keep_its_contract_and_assertions():
    parts = verl_seqlen_partitions([812, 95, 4000, 310, 77, 1500, 640, 2300], 4, equal_size=True)
    assert [len(part) for part in parts] == [2, 2, 2, 2] and all(part == sorted(part) for part in parts)
    assert sorted(i for part in parts for i in part) == list(range(8))
    with pytest.raises(ValueError, match="`equal_size` needs k_partitions=3 to divide the 8 items, as verl asserts"):
        verl_seqlen_partitions([1] * 8, 3, equal_size=True)
    with pytest.raises(ValueError, match="verl asserts one per partition"):
        verl_seqlen_partitions([1, 2], 3, equal_size=False)


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="k_partitions"):
        get_seqlen_balanced_partitions([1, 2], 1.5, False)
    with pytest.raises(TypeError, match="equal_size"):
        get_seqlen_balanced_partitions([1, 2], 1, "yes")
