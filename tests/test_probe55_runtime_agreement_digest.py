"""probe55: check_agreement given a digest that is not 32 bytes on one rank raised there alone, before the all-gather,
and its peers waited in the gather until that rank exited (PeerFailureError, "Connection closed by peer") or the
group's timeout (a rank that went on).  The rank joins the gather and raises its ValueError after it; its peers raise
PeerInputError naming it at once."""

import pytest

from orchmllm.runtime import PeerInputError, check_agreement, fingerprint
from orchmllm.runtime.launch import run_processes


def _job(rank, size, odd):
    try:
        check_agreement(odd if rank == 1 else fingerprint("plan"))
    except (ValueError, PeerInputError) as error:
        return type(error).__name__, str(error)
    return "agreed", ""


@pytest.mark.parametrize("odd, message", [(b"x" * 16, "got 16"), ("plan", "got a str")])
def test_regression_a_digest_of_another_size_on_one_rank_left_its_peers_in_the_gather(odd, message):
    outcomes = run_processes(_job, 2, args=(odd,), timeout_s=40, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert outcomes[1].value == ("ValueError", f"`digest` must be 32 bytes (SHA-256); {message}")
    assert outcomes[0].value == ("PeerInputError", "ranks [1] passed check_agreement a digest that is not 32 bytes "
                                                   "(each raised why); rank 0 stops with them")
    assert max(o.seconds for o in outcomes) < 15  # not the group's timeout


def test_one_process_refuses_it_without_a_group():
    with pytest.raises(ValueError, match="`digest` must be 32 bytes"):
        check_agreement(b"short")


def _agreeing_job(rank, size):
    check_agreement(bytes(32))  # a valid digest, all zeros on every rank (was taken for a failed input)
    plan = fingerprint("plan")
    check_agreement(bytearray(plan) if rank == 1 else memoryview(plan))  # any bytes-like 32 bytes
    return "agreed"


def test_regression_an_all_zero_or_bytes_like_digest_is_a_digest():
    """rev55 F4 on 20928af: a failed input was flagged in band as bytes(32), so ranks passing a valid all-zero digest
    were each told a peer's was not 32 bytes; a 32-byte bytearray or memoryview was refused."""
    outcomes = run_processes(_agreeing_job, 2, timeout_s=40, collective_timeout_s=20)
    assert [o.value for o in outcomes] == ["agreed", "agreed"], [o.error for o in outcomes]
