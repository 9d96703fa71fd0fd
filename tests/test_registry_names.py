"""Registry names a plugin may not take (probe56 N1, N2): one starting with '-' or '_' (the CLI reads
`--algorithm --json` as a flag) or longer than 64 characters (it filled every 'choose one of' message), and one that
names orchmllm's own algorithm of the other registry (`check_conformance('lpt')` ran the balancer where a micro-batch
kernel 'lpt' was meant)."""

import numpy as np
import pytest

from orchmllm import register_algorithm, register_microbatch_algorithm
from orchmllm.balancers import registry
from orchmllm.balancers.problem import KernelResult


def _all_on_rank_zero(problem):
    return KernelResult(np.zeros(problem.num_items, dtype=np.int64))


@pytest.mark.parametrize("name", ["-x", "--json", "_private", "x" * 65, "", "\uff2c\uff30\uff34", "\u0662",
                                  "stra\u00dfe"])
def test_a_name_a_flag_too_long_or_not_ascii_is_refused(name):
    """'ＬＰＴ' (fullwidth), '٢' (an Arabic-Indic digit), 'straße': isalnum took them (probe57 N1), look-alikes of
    ASCII names in every listing."""
    with pytest.raises(ValueError, match=r"`name` must be a non-empty str of ASCII letters, digits, '_' and '-', a "
                                         r"letter or digit first \(the CLI reads '-x' as a flag\), at most 64 "
                                         r"characters"):
        register_algorithm(name, _all_on_rank_zero)


def test_a_name_of_64_characters_with_dashes_inside_is_taken():
    name = "n1-" + "x" * 61
    try:
        assert register_algorithm(name, _all_on_rank_zero).name == name
    finally:  # not left for the conformance run of every registered algorithm (test_testing)
        with registry._lock:
            registry._records.pop(name, None)


@pytest.mark.parametrize("register, name, theirs", [
    (register_microbatch_algorithm, "lpt", "Algorithm"), (register_microbatch_algorithm, "Karmarkar_Karp", "Algorithm"),
    (register_algorithm, "greedy", "MicroBatchAlgorithm"), (register_algorithm, "CELLS", "MicroBatchAlgorithm"),
])
def test_a_name_of_the_other_registrys_built_in_is_refused(register, name, theirs):
    with pytest.raises(ValueError, match=rf"algorithm name '{name}' is orchmllm's {theirs}'s; choose another"):
        register(name, (lambda problem, m: None) if register is register_microbatch_algorithm else _all_on_rank_zero)
