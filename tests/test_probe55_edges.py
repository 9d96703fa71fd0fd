"""fix55's own probe of the cost model's and the CP spec's public edges (issue 24): dtypes, bools, huge ints and
overflowing fits get a clear error naming the argument, never a silent wrong value, a raw numpy or Python error or a
numpy warning."""

import warnings

import numpy as np
import pytest

from orchmllm.balancers import ContextParallel, CostModel


@pytest.fixture
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize("lengths, seconds, options, error, match", [
    ([True, False, True], [1.0, 2.0, 3.0], {}, TypeError, r"`lengths` must hold numbers; got dtype bool"),
    ([1, 2, 3], ["1", "2", "3"], {}, TypeError, r"`seconds` must hold numbers; got dtype <U1"),
    ([1, 2, 3j], [1.0, 2.0, 3.0], {}, TypeError, r"`lengths` must hold numbers; got dtype complex128"),
    ([1, 2, 3], [1.0, 2.0, 3.0], dict(per_item="no"), TypeError, r"`per_item` must be a bool; got str"),
    ([1, 2, 3], [1.0, 2.0, 3.0], dict(quadratic=0), TypeError, r"`quadratic` must be a bool; got int"),
    ([1e200, 2e200, 3e200], [1.0, 2.0, 3.0], {}, ValueError, r"`lengths` up to 3e\+200 and `seconds` down to 1: the "
                                                             r"fit's weighted terms .* overflow float64"),
    ([1, 2, 3], [5e-324, 5e-324, 1e-323], {}, ValueError, r"`seconds` down to 4.94066e-324: .* overflow float64"),
], ids=["bool-lengths", "str-seconds", "complex", "per_item-str", "quadratic-int", "huge-lengths", "subnormal-seconds"])
def test_regression_fit_took_bools_and_leaked_numpy_errors(lengths, seconds, options, error, match, no_warnings):
    """Cause: `CostModel.fit` read its measurements with `np.asarray(..., float64)`: booleans were fitted as lengths
    0 and 1, strings and complex numbers raised numpy's conversion errors, any truthy `per_item`/`quadratic` ("no",
    0) chose the terms, and squares or inverse timings beyond float64 warned then raised scipy's "array must not
    contain infs or NaNs"."""
    with pytest.raises(error, match=match):
        CostModel.fit(lengths, seconds, **options)


def test_fit_finds_the_same_coefficients_on_clean_measurements():
    lengths = np.array([128, 512, 2048, 8192])
    truth = CostModel(per_item=3e-4, linear=2e-6, quadratic=1e-10)
    fitted = CostModel.fit(lengths, truth.item_costs(lengths))
    np.testing.assert_allclose([fitted.per_item, fitted.linear, fitted.quadratic], [3e-4, 2e-6, 1e-10], rtol=1e-6)


@pytest.mark.parametrize("options, error, match", [
    (dict(num_heads=True), ValueError, r"`num_heads` must be a positive int dividing hidden_size=8; got True"),
    (dict(causal="no"), TypeError, r"`causal` must be a bool; got str"),
    (dict(backward=None), TypeError, r"`backward` must be a bool; got NoneType"),
    (dict(num_layers=10**200, hidden_size=10**200), ValueError, r"give more FLOPs per token than float64 holds"),
], ids=["num_heads-bool", "causal-str", "backward-none", "overflow"])
def test_regression_from_transformer_took_truthy_flags(options, error, match):
    """Cause: `from_transformer` checked `num_heads` with isinstance(int) (True passed, np.int64(2) was refused),
    priced `causal="no"` as causal and `backward=None` as forward only, and a model beyond float64 raised Python's
    OverflowError ("int too large to convert to float")."""
    with pytest.raises(error, match=match):
        CostModel.from_transformer(**{"num_layers": 2, "hidden_size": 8, **options})


def test_from_transformer_takes_numpy_ints_for_num_heads():
    assert CostModel.from_transformer(num_layers=2, hidden_size=8, num_heads=np.int64(2)) == \
        CostModel.from_transformer(num_layers=2, hidden_size=8, num_heads=2)


@pytest.mark.parametrize("call", [lambda: CostModel(linear=10**400), lambda: CostModel()(10**400),
                                  lambda: ContextParallel(latency_s=10**400)], ids=["coefficient", "length", "cp"])
def test_regression_a_real_beyond_float64_raised_overflow_error(call):
    """Cause: `validation.as_real` converted with float(): an int beyond float64 raised Python's OverflowError."""
    with pytest.raises(ValueError, match=r"must be finite and >= 0; got a number beyond float64 \(int\)"):
        call()


def test_regression_cp_time_wrapped_a_uint64_degree_negative(no_warnings):
    """Cause: `ContextParallel.time` took a uint64 degree of 2**63 (a power of two) and cast it to int64, where it
    wrapped to -2**63 and priced a negative time (-1.2e31)."""
    with pytest.raises(ValueError, match=r"`degree` must fit int64 \(below 2\*\*63\); got 9223372036854775808"):
        ContextParallel(degrees=(1, 2)).time(CostModel(linear=6e9), [10], np.uint64(2**63))


@pytest.mark.parametrize("topology", [None, 4, "h100"], ids=["none", "int", "str"])
def test_regression_cp_on_a_non_topology_gave_the_spec_back(topology):
    """Cause: `ContextParallel.on(topology)` took whichever of the topology's attributes it found, so None, 4 or
    "h100" gave the spec back unchanged, silently (the planners check their `topology` before)."""
    with pytest.raises(TypeError, match=r"`topology` must have `gpus_per_node` \(e.g. orchmllm.topology.Topology\)"):
        ContextParallel().on(topology)
