"""probe25 P25-09: a round of full fixes left a rank above the target by rounding alone (1.8e-12 over 14387), the
next round's fix passed it to its partner, and back: `balance_microbatches(sources=, topology=)` never returned on
64 items over 16 ranks.  Ranks left within rounding of the target are settled, so every round fixes or settles."""
import numpy as np

from orchmllm import CostModel, balance_microbatches
from orchmllm.balancers.locality import repair
from orchmllm.topology import Topology

LENGTHS = [6731, 3239, 6000, 1626, 2653, 61, 4794, 99, 1556, 7295, 1212, 3164, 4031, 4337, 4341, 6544, 7995, 3752, 7870,
     1952, 4163, 2731, 5326, 6634, 1660, 3314, 6082, 7948, 6386, 5830, 7674, 4019, 1074, 5073, 3573, 350, 5140, 7966,
     4369, 300, 875, 1690, 5244, 3081, 6109, 6129, 7089, 2397, 564, 6496, 2237, 3609, 7183, 2395, 5512, 7375, 6366,
     2833, 2571, 7051, 1500, 936, 4026, 139]
RELABELLED = np.repeat([3, 0, 1, 2, 15, 14, 13, 12, 11, 8, 9, 10, 4, 6, 5, 7], 4)


def test_regression_a_rank_above_the_target_by_rounding_alone_is_not_passed_round_and_round(monkeypatch):
    rounds, over_target = [], repair._over_target

    def counted(state, stuck):
        rounds.append(1)
        assert len(rounds) < 1000, "a repair pass without end"
        return over_target(state, stuck)

    monkeypatch.setattr(repair, "_over_target", counted)
    kwargs = dict(cost=CostModel(linear=1.0, quadratic=1e-4), max_tokens_per_microbatch=8195, topology=Topology(4, 4))
    relabelled = balance_microbatches(LENGTHS, 16, sources=RELABELLED, **kwargs)
    plain = balance_microbatches(LENGTHS, 16, sources=np.repeat(np.arange(16), 4), **kwargs)
    assert relabelled.step_cost == plain.step_cost and len(rounds) < 100
