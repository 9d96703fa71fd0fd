"""probe53 F7, F8, N8: `load_lengths`, the dispatcher's items and the oracle name what the caller passed."""

import math

import pytest

from orchmllm.cli.files import load_lengths
from orchmllm.runtime.step_items import local_tables
from orchmllm.testing import exact


@pytest.mark.parametrize("path", [None, 3])
def test_regression_load_lengths_of_no_path_gave_pathlib_message(path):
    """Cause (probe53 F7): `load_lengths(None)` raised pathlib's "expected str, bytes or os.PathLike object"."""
    with pytest.raises(TypeError, match=r"`path` must be a str or os.PathLike naming a lengths file; got "):
        load_lengths(path)


def test_regression_dispatcher_reported_loss_tokens_shape_it_made():
    """Cause (probe53 F8): `PostBalancingDispatcher().plan([3, 4], loss_tokens=[1])` said "got shape (1, 1)", the
    column it made of the user's shape (1,)."""
    with pytest.raises(ValueError, match=r"`loss_tokens` must have one count per item \(2\); got shape \(1,\)$"):
        local_tables([3, 4], [1])


@pytest.mark.parametrize("time_limit", [math.nan, -1.0, 0])
def test_regression_the_oracles_time_limit_was_checked_only_beyond_brute_force(time_limit):
    """Cause (probe53 N8): `testing.exact([5, 4, 3], 2, time_limit=nan)` returned (tiny instances are brute-forced
    before the solver reads `time_limit`), where 40 items refused it."""
    with pytest.raises(ValueError, match=r"`time_limit`"):
        exact([5, 4, 3], 2, time_limit=time_limit)
