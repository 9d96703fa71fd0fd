"""Options typed once (issue 25): every argument checked at one place with one message, whatever the layer."""

import re

import pytest

from orchmllm import ALGORITHMS, MICROBATCH_ALGORITHMS, CostModel, Orchestrator
from orchmllm.balancers.microbatch.api import microbatch_options
from orchmllm.orchestrator import Stage
from orchmllm.testing import check_conformance, check_microbatch_conformance
from orchmllm.topology import Topology


def _unknown(argument: str, names) -> str:
    return re.escape(f"unknown `{argument}` 'magic'; choose one of {sorted(names)}")


@pytest.mark.parametrize("call, argument, names", [
    (lambda: Orchestrator([Stage("llm", "llm", CostModel())], Topology(1, 2), uniform_algorithm="magic"),
     "uniform_algorithm", ALGORITHMS),
    (lambda: microbatch_options(16, algorithm="magic", algorithm_name="microbatch_algorithm"),
     "microbatch_algorithm", MICROBATCH_ALGORITHMS),
    (lambda: check_conformance("magic", examples=1, processes=False), "algorithm_or_kernel", ALGORITHMS),
    (lambda: check_microbatch_conformance("magic", examples=1, processes=False), "algorithm_or_kernel",
     MICROBATCH_ALGORITHMS),
], ids=["orchestrator", "microbatch_options", "conformance", "microbatch_conformance"])
def test_regression_algorithm_names_were_checked_in_five_places_with_five_messages(call, argument, names):
    with pytest.raises(ValueError, match=_unknown(argument, names)):  # the registry's lookup, one message
        call()


def test_a_stage_names_itself_before_the_registrys_message():
    with pytest.raises(ValueError, match="stage 'vision': " + _unknown("algorithm", ALGORITHMS)):
        Stage("vision", "image", CostModel(), algorithm="magic")
    with pytest.raises(TypeError, match="stage 'vision': `algorithm` must be a str; got int"):
        Stage("vision", "image", CostModel(), algorithm=3)
