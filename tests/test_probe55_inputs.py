"""probe53's notes on the public helpers of the cost model and the pipeline and CP specs (issue 24): bad input is a
clear error naming the argument, never a silent wrong value, a raw numpy error or a numpy warning."""

import warnings

import numpy as np
import pytest

from orchmllm.balancers import ContextParallel, CostModel, Pipeline


@pytest.fixture
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize("lengths, error, match", [
    ([-5, 2], ValueError, r"`lengths` must be finite and non-negative; got -5.0 at index 0"),
    ([3.0, np.nan], ValueError, r"`lengths` must be finite and non-negative; got nan at index 1"),
    ([np.inf], ValueError, r"`lengths` must be finite and non-negative; got inf at index 0"),
    ([True, False], TypeError, r"`lengths` must hold numbers; got dtype bool"),
    (np.array([1, None], dtype=object), TypeError, r"`lengths` must hold numbers; got dtype object"),
    ([1 + 2j], TypeError, r"`lengths` must hold numbers; got dtype complex128"),
    ([10**30], ValueError, r"`lengths` must be .* within 64 bits"),
    ("12", TypeError, r"`lengths` must be a 1-D sequence of finite non-negative reals; got str"),
], ids=["negative", "nan", "inf", "bools", "object", "complex", "huge-int", "str"])
def test_regression_item_costs_priced_negative_lengths(lengths, error, match):
    """Cause (probe53 N4): `CostModel.item_costs` read any array as float64 unchecked: -5 cost -5.0, NaN cost NaN,
    booleans and None were priced, where `CostModel.__call__` refused a negative length."""
    with pytest.raises(error, match=match):
        CostModel().item_costs(lengths)


def test_item_costs_keep_their_values_for_every_numeric_dtype():
    model = CostModel(per_item=3.0, linear=7.0, quadratic=0.25)
    lengths = np.array([0, 1, 17, 4096, 2**40])
    expected = [model.per_item + float(l) * (model.linear + model.quadratic * float(l)) for l in lengths.tolist()]
    for array in (lengths, lengths.astype(np.uint64), lengths.astype(np.float64), lengths.tolist()):
        assert model.item_costs(array).tolist() == expected
    assert model.item_costs([[1, 2], [3, 0.5]]).shape == (2, 2)  # elementwise, any shape
    assert model.item_costs(np.zeros(0, dtype=bool)).dtype == np.float64  # empty: no dtype to refuse


def test_regression_item_costs_overflow_warned_and_returned_inf(no_warnings):
    """Cause (probe53 F6's remark): an overflowing cost came back as inf with numpy's overflow RuntimeWarning; the
    planners refuse such a model by name, and now so does the model itself, in the planners' words."""
    model = CostModel(quadratic=1e300)
    with pytest.raises(ValueError, match=r"`cost` CostModel\(.*quadratic=1e\+300\) gives item 1 \(length 100000\) "
                                         r"the cost inf; costs must be finite float64"):
        model.item_costs([3, 10**5])
    with pytest.raises(ValueError, match=r"gives length 1e\+308 the cost inf"):
        CostModel(linear=10.0)(1e308)


def test_regression_padded_cost_took_any_count():
    """Cause: `padded_cost(-3, 5)` returned -15.0 and `padded_cost(2.5, 5)` 12.5 (a count of items)."""
    with pytest.raises(ValueError, match=r"`count` must be >= 0; got -3"):
        CostModel().padded_cost(-3, 5)
    with pytest.raises(TypeError, match=r"`count` must be an int; got float"):
        CostModel().padded_cost(2.5, 5)
    assert CostModel().padded_cost(np.int64(2), 5) == 10.0


@pytest.mark.parametrize("call, match", [
    (lambda p: p.plannable(-3), r"`num_microbatches` must be >= 1; got -3"),
    (lambda p: p.runnable(0), r"`num_microbatches` must be >= 1; got 0"),
    (lambda p: p.runnable(2.5), r"`num_microbatches` must be an int; got float"),
    (lambda p: p.stage_times([1.0, 2.0], [0.0, 0.0]), r"`cell_costs` must be \(rows, M\) and `first_stage` of its "
                                                      r"shape; got shapes \(2,\) and \(2,\)"),
    (lambda p: p.stage_times([[1.0, 2.0]], [[0.0]]), r"got shapes \(1, 2\) and \(1, 1\)"),
    (lambda p: p.stage_times([[1.0, -2.0]]), r"`cell_costs` must be finite and non-negative; got -2.0 at index "
                                             r"\(0, 1\)"),
    (lambda p: p.stage_times([[1.0, 2.0]], [[np.nan, 0.0]]), r"`first_stage` must be finite and non-negative"),
], ids=["plannable-negative", "runnable-zero", "runnable-float", "first-stage-1d", "first-stage-shape",
        "negative-cost", "nan-first-stage"])
def test_regression_pipeline_helpers_took_any_argument(call, match):
    """Cause (probe53 N9): `Pipeline.plannable(-3)` was True, `runnable(0)` 0, and `stage_times` of 1-D rows with
    first-stage parts raised numpy's IndexError; negative or NaN costs came back as negative or NaN seconds."""
    with pytest.raises((ValueError, TypeError), match=match):
        call(Pipeline(stages=2, schedule="interleaved", virtual_stages=2))


def test_pipeline_helpers_answer_as_before_on_clean_input():
    pipeline = Pipeline(stages=2, schedule="interleaved", virtual_stages=2)
    assert pipeline.runnable(3) == 4 and pipeline.plannable(np.int64(4))
    forward, backward = pipeline.stage_times(np.array([[3.0, 6.0]]), np.array([[3.0, 0.0]]))
    np.testing.assert_array_equal(forward, [[[1.0, 1.0], [0.0, 1.0]]])
    np.testing.assert_array_equal(backward, 2 * forward)


@pytest.mark.parametrize("spec", [dict(seconds_per_cost=1e-320), dict(kv_bytes_per_token=1e308),
                                  dict(half_efficiency_tokens=1e308)], ids=["seconds", "bytes", "efficiency"])
def test_regression_cp_time_returned_inf_for_an_overflowing_split(spec, no_warnings):
    """Cause (probe53 F6's remark): `ContextParallel.time` returned inf with numpy's overflow RuntimeWarning where the
    planner refuses the same split times ("split times overflow float64")."""
    cp = ContextParallel(degrees=(1, 2), **spec)
    with pytest.raises(ValueError, match=r"`context_parallel`'s split times overflow float64 .*: length 10 at "
                                         r"degree 2 takes inf"):
        cp.time(CostModel(linear=6e9), [10, 20], 2)
    assert cp.time(CostModel(linear=6e9), [10, 20], 1).tolist() == [6e10, 1.2e11]  # unsplit: f(l) as it is


def test_regression_cp_time_of_an_overflowing_cost_warned(no_warnings):
    with pytest.raises(ValueError, match=r"gives item 0 \(length 100000\) the cost inf"):
        ContextParallel(degrees=(1, 2)).time(CostModel(quadratic=1e300), [10**5], 2)
