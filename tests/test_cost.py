"""CostModel: validation, the transformer FLOPs formula against a hand count, and fit()."""

import math
import re

import numpy as np
import pytest

from orchmllm.balancers import CostModel


def hand_counted_flops(length, *, num_layers, hidden_size, ffn_hidden_size, causal, backward):
    """FLOPs of one sequence, summed matmul by matmul (2·m·k·n each)."""
    def matmul(m, k, n):
        return 2 * m * k * n

    l, h, ffn = length, hidden_size, ffn_hidden_size
    per_layer = (
        4 * matmul(l, h, h)  # Q, K, V and output projections
        + matmul(l, h, l) * (0.5 if causal else 1.0)  # scores Q·Kᵀ, half of them when causal
        + matmul(l, l, h) * (0.5 if causal else 1.0)  # probabilities · V
        + matmul(l, h, ffn) + matmul(l, ffn, h)  # MLP up and down
    )
    forward = num_layers * per_layer
    return forward * (3 if backward else 1)  # backward = 2 × forward


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("backward", [True, False], ids=["fwd+bwd", "fwd"])
def test_from_transformer_matches_a_hand_count(causal, backward):
    shape = dict(num_layers=3, hidden_size=64, ffn_hidden_size=176)
    model = CostModel.from_transformer(**shape, num_heads=8, causal=causal, backward=backward)
    for length in (1, 7, 128, 4096):
        expected = hand_counted_flops(length, **shape, causal=causal, backward=backward)
        assert model(length) == expected


def test_from_transformer_default_ffn_is_four_times_hidden():
    default = CostModel.from_transformer(num_layers=2, hidden_size=32)
    explicit = CostModel.from_transformer(num_layers=2, hidden_size=32, ffn_hidden_size=128)
    assert default == explicit
    assert default.per_item == 0


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(num_layers=0, hidden_size=8), ValueError, "`num_layers` must be a positive int"),
    (dict(num_layers=2, hidden_size=-8), ValueError, "`hidden_size` must be a positive int"),
    (dict(num_layers=True, hidden_size=8), ValueError, "`num_layers` must be a positive int"),
    (dict(num_layers=2, hidden_size=10, num_heads=3), ValueError, "`num_heads` must be a positive int dividing"),
    (dict(num_layers=2, hidden_size=8, ffn_hidden_size=0), ValueError, "`ffn_hidden_size` must be a positive int"),
], ids=["zero-layers", "negative-hidden", "bool-layers", "heads-not-dividing", "zero-ffn"])
def test_from_transformer_rejects_bad_shapes(kwargs, error, message):
    with pytest.raises(error, match=message):
        CostModel.from_transformer(**kwargs)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(linear=-1.0), ValueError, "`linear` must be finite and >= 0"),
    (dict(quadratic=math.nan), ValueError, "`quadratic` must be finite and >= 0"),
    (dict(per_item=math.inf), ValueError, "`per_item` must be finite and >= 0"),
    (dict(linear="1"), TypeError, "`linear` must be a real number"),
    (dict(per_item=True), TypeError, "`per_item` must be a real number"),
    (dict(linear=0), ValueError, "at least one positive coefficient"),
], ids=["negative", "nan", "inf", "string", "bool", "all-zero"])
def test_rejects_bad_coefficients(kwargs, error, message):
    with pytest.raises(error, match=message):
        CostModel(**kwargs)


def test_item_costs_follow_the_formula_and_padded_cost():
    model = CostModel(per_item=5, linear=2, quadratic=0.5)
    lengths = np.array([0, 1, 10, 1000])
    assert model.item_costs(lengths).tolist() == [5.0, 7.5, 75.0, 502005.0]
    assert model.padded_cost(3, 10) == 225.0
    assert model.padded_cost(0, 10) == 0.0


def test_is_frozen_and_coefficients_are_floats():
    model = CostModel(per_item=1, linear=np.int64(2), quadratic=np.float32(0.25))
    assert (type(model.per_item), type(model.linear), type(model.quadratic)) == (float, float, float)
    with pytest.raises(AttributeError):
        model.linear = 3.0


def synthetic_timings(truth, seed, noise):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 8192, size=400)
    seconds = truth.item_costs(lengths) * (1 + noise * rng.standard_normal(lengths.size))
    return lengths, seconds


def test_fit_recovers_exact_coefficients_without_noise():
    truth = CostModel(per_item=2e-4, linear=3e-7, quadratic=5e-11)
    lengths, seconds = synthetic_timings(truth, seed=0, noise=0.0)
    fitted = CostModel.fit(lengths, seconds)
    for name in ("per_item", "linear", "quadratic"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6)


@pytest.mark.parametrize("seed", [1, 2, 3], ids=["seed1", "seed2", "seed3"])
def test_fit_recovers_coefficients_from_noisy_timings(seed):
    truth = CostModel(per_item=2e-4, linear=3e-7, quadratic=5e-11)
    lengths, seconds = synthetic_timings(truth, seed=seed, noise=0.01)
    fitted = CostModel.fit(lengths, seconds)
    assert fitted.linear == pytest.approx(truth.linear, rel=0.1)
    assert fitted.quadratic == pytest.approx(truth.quadratic, rel=0.1)
    assert fitted.per_item == pytest.approx(truth.per_item, rel=0.5)
    predicted, measured = fitted.item_costs(lengths), truth.item_costs(lengths)
    # The fit minimises relative error, so short sequences are fitted as well as long ones.
    assert np.max(np.abs(predicted / measured - 1)) < 0.01


def test_fit_can_leave_out_terms():
    truth = CostModel(per_item=0, linear=4e-7, quadratic=0)
    lengths, seconds = synthetic_timings(truth, seed=4, noise=0.0)
    fitted = CostModel.fit(lengths, seconds, per_item=False, quadratic=False)
    assert fitted.per_item == 0 and fitted.quadratic == 0
    assert fitted.linear == pytest.approx(4e-7, rel=1e-9)


def test_fit_keeps_coefficients_non_negative():
    lengths = np.arange(1, 50)
    seconds = 1.0 - 0.001 * lengths  # decreasing: unconstrained least squares goes negative
    fitted = CostModel.fit(lengths, seconds)
    assert min(fitted.per_item, fitted.linear, fitted.quadratic) >= 0


@pytest.mark.parametrize(("lengths", "seconds", "message"), [
    ([1, 2, 3], [1.0, 2.0], "must be 1-D of equal size"),
    ([[1, 2], [3, 4]], [[1.0, 2.0], [3.0, 4.0]], "must be 1-D of equal size"),
    ([1, 2, math.nan], [1.0, 2.0, 3.0], "must be finite"),
    ([1, 2, 3], [1.0, -2.0, 3.0], "must be non-negative"),
    ([1, 2], [1.0, 2.0], "need at least 3 measurements"),
], ids=["unequal", "2-D", "nan", "negative", "too-few"])
def test_fit_rejects_bad_measurements(lengths, seconds, message):
    with pytest.raises(ValueError, match=message):
        CostModel.fit(lengths, seconds)


@pytest.mark.parametrize("length, error, message", [
    ([1, 2], TypeError, "a CostModel called on one `length`; got a list: use item_costs(lengths) for several"),
    (np.array([1, 2]), TypeError, "got a ndarray: use item_costs(lengths) for several"),
    (None, TypeError, "`length` must be a real number; got NoneType"),
    ("5", TypeError, "`length` must be a real number; got str"),
    (True, TypeError, "`length` must be a real number; got bool"),
    (-1, ValueError, "`length` must be finite and >= 0; got -1.0"),
    (math.nan, ValueError, "`length` must be finite and >= 0; got nan"),
])
def test_regression_a_call_took_any_length(length, error, message):
    """Cause (probe16 P16-07): `CostModel(...)(l)` parsed "5", costed None as nan, -1 and True as numbers, and
    died in numpy on a list; it checks its length as every entry point does."""
    with pytest.raises(error, match=re.escape(message)):
        CostModel(linear=1.0, quadratic=1e-3)(length)
    assert CostModel(linear=1.0, quadratic=1e-3)(np.int64(10)) == 10.1


@pytest.mark.parametrize("length", [10, 10.0, np.int32(10), np.float64(10.0), np.array(10), np.array([10])[0]])
def test_a_call_takes_any_one_real_length(length):
    """probe16 P16-17: the check of P16-07 refused a 0-d array (and a 0-d torch tensor, below)."""
    assert CostModel(linear=1.0, quadratic=1e-3)(length) == 10.1
    with pytest.raises(TypeError, match="use item_costs"):
        CostModel()(np.array([length, length]))


def test_a_call_takes_a_zero_dimensional_tensor():
    """probe16 P16-17: `cost(lengths[i])` of a torch tensor of lengths."""
    torch = pytest.importorskip("torch")  # the optional runtime extra
    for length in (torch.tensor(10), torch.tensor([10, 11])[0]):
        assert CostModel(linear=1.0, quadratic=1e-3)(length) == 10.1
    with pytest.raises(TypeError, match="use item_costs"):
        CostModel()(torch.tensor([10, 11]))
