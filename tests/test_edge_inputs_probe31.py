"""Inputs at the edges of the allowed range that got a false certificate, a truncated cap, a near-unbounded
memory, a missing refusal or a lenient reading (probe31 P31-01, P31-03 to P31-06).

Each case failed on the tree before its fix."""

import tracemalloc

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, balance, balance_microbatches, register_algorithm
from orchmllm.balancers import InfeasibleError
from orchmllm.cli import main
from orchmllm.study.simulator import run_simulation

from .test_cli_lengths_files import check_one_line_error

BELOW_2_53 = "`lengths` must be below 2**53, where float64 costs are exact; got 1152921504606846976 at index 0"


@pytest.mark.parametrize("plan", [lambda lengths: balance(lengths, 2, algorithm="exact"),
                                  lambda lengths: balance(lengths, 2),
                                  lambda lengths: balance_microbatches(lengths, 2, max_tokens_per_microbatch=2**62)],
                         ids=["exact", "auto", "microbatches"])
def test_regression_lengths_whose_costs_round_were_certified_optimal(plan):
    """Cause (P31-01): a cost f(l) = l at or above 2**53 rounds in float64, so [2**60, 2**60, 3, 1, 1, 1] on 2
    ranks was planned at a true 2**60 + 6 (the optimum 2**60 + 3) and labelled optimal at a makespan of 2**60.
    The API refuses such lengths as the CLI's files and the orchestrator's batches did; 2**53 - 1 is planned."""
    with pytest.raises(ValueError, match=f"^{BELOW_2_53.replace('*', '[*]')}$"):
        plan([2**60, 2**60, 3, 1, 1, 1])
    assert balance([2**53 - 1, 1], 2).makespan == 2**53 - 1


def _gave_up(problem):
    raise InfeasibleError("gave up", min_cap=float("nan"))


def test_regression_a_kernels_cap_to_try_was_truncated_or_a_raw_int_error():
    """Cause (P31-04): `InfeasibleError(min_cap=6.9)` kept int(6.9) = 6, a sufficient cap rounded down to one that
    may fail; nan, inf or None raised int()'s own errors, and through `balance` a kernel's NaN cap read "raised
    ValueError: cannot convert float NaN to integer"."""
    assert InfeasibleError("gave up", min_cap=6.9).min_cap == 7
    assert InfeasibleError("gave up", min_cap=np.int64(7)).min_cap == 7
    for bad in (float("nan"), float("inf"), None, "7"):
        with pytest.raises(ValueError, match=r"^`InfeasibleError's min_cap \(the cap to try next\)` must be a finite "
                                             r"number; got "):
            InfeasibleError("gave up", min_cap=bad)
    register_algorithm("probe31_nan_cap", _gave_up)
    with pytest.raises(RuntimeError, match=r"^algorithm 'probe31_nan_cap' raised ValueError: `InfeasibleError's "
                                           r"min_cap \(the cap to try next\)` must be a finite number; got nan$"):
        balance([3, 1, 2, 3], 2, algorithm="probe31_nan_cap", max_tokens_per_rank=5)


def test_regression_a_degree_not_a_power_of_two_was_priced():
    """Cause (P31-05): `ContextParallel.time` priced degree 3 (issue 26: a degree not a power of two is refused);
    a power of two outside the spec's degrees is priced (what a peer's or a what-if degree costs)."""
    spec = ContextParallel(degrees=(1, 2))
    for degree in (3, [1, 2, 6]):
        with pytest.raises(ValueError, match=r"^`degree` must be powers of two \(1, 2, 4, ...\); got [36]$"):
            spec.time(CostModel(), [10, 20], degree)
    assert spec.time(CostModel(), [1000], 4)[0] > 0


@pytest.mark.parametrize("text", ["1_000", "+5", "\uff15", "\u0665"],
                         ids=["underscore", "plus", "fullwidth", "arabic-indic"])
def test_regression_python_spellings_of_numbers_were_read_as_lengths(text, tmp_path, capsys):
    """Cause (P31-06): the reader strictly refuses `8l2` but took what int() also reads: `1_000` as 1000, `+5` and
    other scripts' digits (fullwidth, Arabic-Indic) as 5, with exit 0.  Only ASCII digits make a length."""
    path = tmp_path / "spelled.csv"
    path.write_text(f"{text}\n3\n", encoding="utf-8")
    check_one_line_error(main(["plan", str(path), "-D", "2"]), capsys.readouterr().err,
                         f"spelled.csv:1: expected an integer length, got {text!r}")


def _peak_bytes(strategies) -> int:
    tracemalloc.start()
    try:
        run_simulation(gpus=128, samples_per_rank=64, strategies=strategies)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_regression_the_simulator_held_every_strategys_plan_at_once():
    """Cause (P31-03): `simulate` kept each strategy's step plan (arrays per sample) until the end, ~3.7 kB per
    sample over its 9 strategies: `--samples-per-rank 1000` on 2560 GPUs grew past 8.5 GB; one plan lives at a time
    now (peak with every strategy 3.4x that with `ours` alone before, 1.1x now)."""
    assert _peak_bytes(None) <= 1.5 * _peak_bytes(["ours"])
