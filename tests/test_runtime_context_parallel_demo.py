"""The giants demo on real gloo ranks (a giant item split over a context-parallel group, trained against
the unsplit unbalanced single-process reference), its command line, and the split-efficiency fit."""

import pytest

from orchmllm.cli import main
from orchmllm.cli.errors import EXIT_USAGE
from orchmllm.runtime.demo.calibration import fit_split_efficiency
from orchmllm.runtime.demo.giants import GiantsConfig, run_giants


def test_the_giant_split_trains_as_the_unsplit_reference_and_balances_the_ranks():
    report = run_giants(2, 1, 3, "float64", degrees=(1, 2), replay_repeats=1,
                        config=GiantsConfig(samples_per_rank=6, giant=512, layers=1), timeout_s=240)
    assert report.items_split >= 1 and report.degrees_per_step == [[1, 2]]
    assert (report.tokens_lost, report.tokens_duplicated, report.samples_lost) == (0, 0, 0)
    assert report.grad_max_rel_diff <= 1e-12
    assert report.busy_max_over_mean_isolated_unsplit >= 1.5  # the giant alone is the unsplit plan's bound ...
    assert report.busy_max_over_mean_isolated_split < report.busy_max_over_mean_isolated_unsplit  # ... split, less
    assert report.busy_max_over_mean_planned_split < report.busy_max_over_mean_planned_unsplit
    assert set(report.to_json()) >= {"items_split", "tokens_lost", "samples_lost", "grad_max_abs_diff",
                                     "busy_max_over_mean_isolated_split", "busy_max_over_mean_isolated_unsplit"}


@pytest.mark.parametrize("argv, message", [
    (["demo", "--context-parallel", "1,2"], "--context-parallel needs --workload giants"),
    (["demo", "--workload", "giants", "--ranks", "4", "--context-parallel", "1,8"], "degree 8 > 4 ranks"),
    (["demo", "--workload", "giants", "--context-parallel", "1,3"], "powers of two"),
    (["demo", "--workload", "giants", "--max-tokens-per-microbatch", "64"], "not available with --workload giants"),
])
def test_bad_giants_options_are_usage_errors(argv, message, capsys):
    assert main(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_the_split_efficiency_fit_recovers_its_parameter_and_rejects_bad_input():
    half, error = fit_split_efficiency([1000, 500, 250], [2, 4, 8], [8.0] * 3,
                                       [8.0 / c * (1 + 64.0 / s) for c, s in ((2, 1000), (4, 500), (8, 250))])
    assert half == pytest.approx(64.0, rel=1e-12) and error < 1e-12
    with pytest.raises(ValueError, match="one shard size, degree, unsplit time and shard time per measurement"):
        fit_split_efficiency([1000], [2, 4], [1.0], [1.0])
    with pytest.raises(ValueError, match="times positive"):
        fit_split_efficiency([1000], [2], [0.0], [1.0])
