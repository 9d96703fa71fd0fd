"""Per-item cost model f(l) = per_item + linear·l + quadratic·l².

Unpadded rank cost: sum(f(l) for l on rank).  Padded rank cost: count · f(max l on rank),
0 for an empty rank.  Item costs are float64, computed elementwise in a fixed order of
operations, so they are bit-identical on every rank; they are exact whenever the
coefficients are integers and the costs stay below 2**53.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .validation import as_bool, as_int, as_non_negative_reals, as_numbers, as_real, is_int


@dataclass(frozen=True)
class CostModel:
    """f(l) = per_item + linear·l + quadratic·l² with non-negative coefficients."""

    per_item: float = 0.0
    linear: float = 1.0
    quadratic: float = 0.0

    def __post_init__(self) -> None:
        for name in ("per_item", "linear", "quadratic"):
            object.__setattr__(self, name, as_real(getattr(self, name), name))
        if self.per_item == 0 and self.linear == 0 and self.quadratic == 0:
            raise ValueError("CostModel needs at least one positive coefficient; all three are 0")

    def item_costs(self, lengths) -> np.ndarray:
        """f(l) for every length, float64 of `lengths`' shape: finite reals >= 0, ints or floats (ValueError naming
        the first other one, `validation.as_non_negative_reals`, or the first whose cost overflows float64, as the
        planners refuse it).

        >>> CostModel(per_item=1.0, quadratic=0.5).item_costs([0, 2, 4]).tolist()
        [1.0, 5.0, 13.0]
        """
        lengths = as_non_negative_reals(lengths, "lengths")
        with np.errstate(over="ignore"):  # a cost beyond float64 is named below
            costs = self.quadratic * lengths  # then in place: per_item + l·(linear + quadratic·l)
            costs += self.linear
            costs *= lengths
            costs += self.per_item
        if costs.size and math.isinf(costs.max()):  # f rises with l: only the longest can overflow first
            self._refuse_overflow(lengths, costs)
        return costs

    def _refuse_overflow(self, lengths: np.ndarray, costs: np.ndarray) -> None:
        """ValueError naming the first length whose cost is inf (`check_cost_range`'s words, where the planners
        refuse such a model)."""
        flat = int(np.flatnonzero(np.isinf(costs))[0])
        length = float(lengths.flat[flat])
        shown = int(length) if length.is_integer() and length < 2**63 else length
        index = flat if lengths.ndim == 1 else tuple(int(i) for i in np.unravel_index(flat, lengths.shape))
        where = f"length {shown}" if lengths.ndim == 0 else f"item {index} (length {shown})"
        raise ValueError(f"`cost` {self} gives {where} the cost inf; costs must be finite float64 (scale the costs "
                         f"down)")

    def __call__(self, length: float) -> float:
        """f(length) of one length, a finite real >= 0 (`item_costs` takes an array of them)."""
        several = isinstance(length, (list, tuple)) or len(getattr(length, "shape", ())) > 0
        if several:
            raise TypeError(f"a CostModel called on one `length`; got a {type(length).__name__}: use "
                            f"item_costs(lengths) for several")
        if hasattr(length, "shape") and hasattr(length, "item"):  # a numpy or torch scalar, 0-d arrays included
            length = length.item()
        return float(self.item_costs(np.float64(as_real(length, "length"))))

    def padded_cost(self, count: int, max_length: int) -> float:
        """Cost of a padded rank holding `count` items (an int >= 0) whose longest is `max_length`."""
        count = as_int(count, "count", minimum=0)
        return 0.0 if count == 0 else count * self(max_length)

    @classmethod
    def from_transformer(
        cls,
        *,
        num_layers: int,
        hidden_size: int,
        num_heads: int | None = None,
        ffn_hidden_size: int | None = None,
        causal: bool = True,
        backward: bool = True,
    ) -> "CostModel":
        """FLOPs of a dense transformer over one sequence of length l.

        Per layer and token, the matmuls (QKV + output projection 4h², MLP 2·h·ffn) cost
        2·(4h² + 2h·ffn) FLOPs forward; attention scores and weighted values cost
        2·2·l·h per token, halved when causal.  Backward costs twice the forward, so the
        total is 3× forward when `backward` is set.  Returns FLOPs, so coefficients are
        comparable across stages of one model.
        """
        for name, value in (("num_layers", num_layers), ("hidden_size", hidden_size)):
            if not is_int(value) or value <= 0:
                raise ValueError(f"`{name}` must be a positive int; got {value!r}")
        if num_heads is not None and (not is_int(num_heads) or num_heads <= 0 or hidden_size % num_heads):
            raise ValueError(
                f"`num_heads` must be a positive int dividing hidden_size={hidden_size}; got {num_heads!r}")
        ffn = 4 * hidden_size if ffn_hidden_size is None else ffn_hidden_size
        if not is_int(ffn) or ffn <= 0:
            raise ValueError(f"`ffn_hidden_size` must be a positive int; got {ffn_hidden_size!r}")
        passes = 3 if as_bool(backward, "backward") else 1
        causal = as_bool(causal, "causal")
        try:
            linear = float(passes * num_layers * 2 * (4 * hidden_size * hidden_size + 2 * hidden_size * ffn))
        except OverflowError:  # an int beyond float64; the l² term is smaller
            raise ValueError("`num_layers`, `hidden_size` and `ffn_hidden_size` give more FLOPs per token than float64 "
                             "holds") from None
        quadratic = passes * num_layers * 4 * hidden_size * (0.5 if causal else 1.0)
        return cls(per_item=0.0, linear=linear, quadratic=float(quadratic))

    @classmethod
    def fit(cls, lengths, seconds, *, per_item: bool = True, quadratic: bool = True) -> "CostModel":
        """Fit non-negative coefficients to measured (length, seconds) pairs.

        Minimises the squared *relative* error sum(((f(l) - s) / s)**2): timing noise is
        multiplicative, and an unweighted fit would let the long sequences dictate the
        coefficients and leave short ones several per cent off.
        """
        lengths, seconds = (np.asarray(as_numbers(values, name), dtype=np.float64)
                            for values, name in ((lengths, "lengths"), (seconds, "seconds")))
        per_item, quadratic = as_bool(per_item, "per_item"), as_bool(quadratic, "quadratic")
        if lengths.ndim != 1 or seconds.shape != lengths.shape:
            raise ValueError(
                f"`lengths` and `seconds` must be 1-D of equal size; got shapes {lengths.shape} and {seconds.shape}")
        if not (np.all(np.isfinite(lengths)) and np.all(np.isfinite(seconds))):
            raise ValueError("`lengths` and `seconds` must be finite")
        if np.any(lengths < 0) or np.any(seconds < 0):
            raise ValueError("`lengths` and `seconds` must be non-negative")
        names = (["per_item"] if per_item else []) + ["linear"] + (["quadratic"] if quadratic else [])
        if lengths.size < len(names):
            raise ValueError(f"need at least {len(names)} measurements to fit; got {lengths.size}")
        from scipy.optimize import nnls

        positive = seconds[seconds > 0]
        if positive.size == 0:
            raise ValueError("`seconds` must contain at least one positive timing")
        powers = {"per_item": 0, "linear": 1, "quadratic": 2}
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # beyond float64: refused below
            design = np.stack([lengths ** powers[name] for name in names], axis=1)
            weights = 1.0 / np.maximum(seconds, positive.min())
            design = design * weights[:, None]
            scale = np.maximum(np.abs(design).max(axis=0), 1e-300)
            coef = nnls(design / scale, seconds * weights)[0] / scale if np.isfinite(scale).all() else scale
        if not np.isfinite(coef).all():
            raise ValueError(f"`lengths` up to {lengths.max():g} and `seconds` down to {positive.min():g}: the fit's "
                             f"weighted terms (l², 1 / seconds) overflow float64; measure in other units")
        return cls(**{"per_item": 0.0, "quadratic": 0.0, **dict(zip(names, coef.tolist()))})
