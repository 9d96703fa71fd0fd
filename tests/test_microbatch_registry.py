"""Micro-batch kernels as registry records: ours listed, plugins registered in process or found
through an `orchmllm.algorithms` entry point, and a kernel that breaks the budget caught."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from orchmllm import (MICROBATCH_ALGORITHMS, InfeasibleError, Orchestrator, Stage, Topology,
                      register_microbatch_algorithm)
from orchmllm.balancers import (CostModel, Kind, MicroBatchAlgorithm, balance, balance_microbatches,
                                get_microbatch_algorithm, microbatch_algorithms, registry)
from orchmllm.balancers.microbatch.plan import MicroBatchResult
from orchmllm.orchestrator import Batch


def one_per_cell(problem, num_microbatches):
    """Item i to cell i (rank i mod D, micro-batch i // D), when there are enough cells."""
    if problem.num_items > num_microbatches * problem.num_ranks:
        return None
    cell = np.arange(problem.num_items, dtype=np.int64)
    return MicroBatchResult(cell % problem.num_ranks, cell // problem.num_ranks)


def all_in_one(problem, num_microbatches):
    """Every item in cell (0, 0): breaks any budget the items exceed."""
    zeros = np.zeros(problem.num_items, dtype=np.int64)
    return MicroBatchResult(zeros, zeros)


def test_our_kernels_are_records_with_what_they_solve():
    ours = {record.name: record for record in microbatch_algorithms(kind=Kind.OURS)}
    assert list(ours) == ["auto", "greedy", "cells", "exact"]
    assert [name for name, record in ours.items() if record.exact] == ["exact"]
    assert all(record.solves(padded=True) and record.solves(padded=False) for record in ours.values())
    assert get_microbatch_algorithm("cells") is MICROBATCH_ALGORITHMS["cells"] is ours["cells"]
    with pytest.raises(TypeError, match="read-only; add a kernel with orchmllm.register_microbatch_algorithm"):
        MICROBATCH_ALGORITHMS["mine"] = one_per_cell
    with pytest.raises(ValueError, match=r"unknown `algorithm` 'nope'; choose one of \['auto', 'cells'"):
        balance_microbatches([3, 2], 2, max_tokens_per_microbatch=4, algorithm="nope")


def test_a_registered_kernel_runs_in_balance_microbatches_and_the_orchestrator():
    record = register_microbatch_algorithm("test_one_per_cell", one_per_cell, description="item i to cell i")
    assert record == MicroBatchAlgorithm("test_one_per_cell", one_per_cell, description="item i to cell i")
    assert register_microbatch_algorithm("test_one_per_cell", one_per_cell, description="item i to cell i") is record
    plan = balance_microbatches([5, 4, 3, 3, 1], 2, max_tokens_per_microbatch=8, algorithm="test_one_per_cell")
    assert plan.num_microbatches == 3 and plan.rank.tolist() == [0, 1, 0, 1, 0]
    assert plan.microbatch.tolist() == [0, 0, 1, 1, 2] and plan.algorithm == "test_one_per_cell"
    batch = Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[5, 4, 3, 3], sample_source=[0, 0, 1, 1],
                              segment_sample=[0, 1], segment_modality=[0, 0], segment_length=[2, 1],
                              segment_tokens=[2, 1])
    stages = (Stage("vit", "image", CostModel()), Stage("llm", "llm", CostModel()))
    step = Orchestrator(stages, Topology(1, 2), max_tokens_per_microbatch=8,
                        microbatch_algorithm="test_one_per_cell").plan(batch)
    assert step.cells.algorithm.startswith("test_one_per_cell") and step.num_microbatches == 2
    with pytest.raises(ValueError, match="algorithm 'test_one_per_cell' is already registered"):
        register_microbatch_algorithm("test_one_per_cell", all_in_one)
    with pytest.raises(ValueError, match="algorithm 'auto' is already registered"):
        register_microbatch_algorithm("auto", all_in_one)


def test_a_kernel_over_the_budget_or_the_wrong_padding_is_caught():
    register_microbatch_algorithm("test_all_in_one", all_in_one, padded=False, description="one cell for all")
    with pytest.raises(RuntimeError, match=r"'test_all_in_one' put 9 tokens in cell \(rank 0, micro-batch 0\), "
                                           r"over max_tokens_per_microbatch=8"):
        balance_microbatches([5, 4], 2, max_tokens_per_microbatch=8, algorithm="test_all_in_one")
    with pytest.raises(ValueError, match=r"'test_all_in_one' solves the unpadded cost sum f\(l\) only; pass "
                                         r"padded=False, or choose one of \['auto', 'greedy', 'cells', 'exact'"):
        balance_microbatches([5, 4], 2, max_tokens_per_microbatch=8, padded=True, algorithm="test_all_in_one")


@pytest.mark.parametrize("arguments, error, message", [
    (dict(name="has space"), ValueError, r"`name` must be a non-empty str of ASCII letters, digits"),
    (dict(kernel="cells"), TypeError, r"`kernel` of algorithm 'ok' must be callable \(\(MicroBatchProblem, M\)"),
    (dict(padded=False, unpadded=False), ValueError, r"must solve padded or unpadded problems"),
    (dict(kind="theirs"), ValueError, r"`kind` must be one of"),
])
def test_a_bad_record_is_refused(arguments, error, message):
    with pytest.raises(error, match=message):
        register_microbatch_algorithm(**{"name": "ok", "kernel": one_per_cell, **arguments})


def test_an_entry_point_adds_a_microbatch_record_from_another_package(tmp_path):
    """A distribution on the path (its dist-info declares the entry point) whose object is a
    MicroBatchAlgorithm record: found by name in a fresh process, without touching orchmllm."""
    (tmp_path / "cell_plugin.py").write_text(
        "import numpy as np\n"
        "from orchmllm.balancers import Kind, MicroBatchAlgorithm\n"
        "from orchmllm.balancers.microbatch.plan import MicroBatchResult\n\n"
        "def reverse_cells(problem, num_microbatches):\n"
        "    if problem.num_items > num_microbatches * problem.num_ranks:\n"
        "        return None\n"
        "    cell = np.arange(problem.num_items, dtype=np.int64)[::-1].copy()\n"
        "    return MicroBatchResult(cell % problem.num_ranks, cell // problem.num_ranks)\n\n"
        "RECORD = MicroBatchAlgorithm('reverse_cells', reverse_cells, kind=Kind.PLUGIN, "
        "description='last item first')\n")
    info = tmp_path / "cell_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cell-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[orchmllm.algorithms]\nreverse_cells = cell_plugin:RECORD\n")
    script = ("import json\nfrom orchmllm import balance_microbatches\n"
              "from orchmllm.balancers import microbatch_algorithms\n"
              "plan = balance_microbatches([5, 4, 3], 2, max_tokens_per_microbatch=8, algorithm='reverse_cells')\n"
              "print(json.dumps({'rank': plan.rank.tolist(), 'microbatch': plan.microbatch.tolist(),\n"
              "                  'kinds': {r.name: r.kind.value for r in microbatch_algorithms()}}))\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rank"] == [0, 1, 0] and result["microbatch"] == [1, 0, 0]
    assert result["kinds"]["reverse_cells"] == "plugin" and result["kinds"]["auto"] == "ours"


def never_packs(problem, num_microbatches):
    """No packing for any M."""
    return None


def test_regression_a_kernel_that_never_packs_raised_a_bare_stop_iteration():
    """Cause: with M free the choice of M read the first plan found, of none; with M given the
    error said "2 micro-batches always fit" right after failing at 2."""
    register_microbatch_algorithm("test_never_packs", never_packs, description="no packing for any M")
    with pytest.raises(InfeasibleError, match=r"algorithm 'test_never_packs' found no packing of the items for any "
                                              r"`num_microbatches` from 1 to 2, though one item per cell fits in 2"):
        balance_microbatches([1, 2, 3], 2, max_tokens_per_microbatch=8, algorithm="test_never_packs")
    with pytest.raises(InfeasibleError, match=r"`num_microbatches`=2: algorithm 'test_never_packs' found no packing "
                                              r".* though one exists \(exhaustive search\): try algorithm='exact'"):
        balance_microbatches([1, 2, 3], 2, max_tokens_per_microbatch=8, algorithm="test_never_packs",
                             num_microbatches=2)


def returning(result):
    """A kernel that returns `result(problem, num_microbatches)` for every M."""
    def kernel(problem, num_microbatches):
        return result(problem, num_microbatches)
    return kernel


def cells(n, m=0):
    return np.zeros(n, dtype=np.int64) + m


MALFORMED = {
    "short-rank": (lambda p, m: MicroBatchResult(cells(p.num_items - 1), cells(p.num_items)),
                   r"returned `rank` of shape \(2,\) and dtype int64; expected \(3,\) ints"),
    "2-d-microbatch": (lambda p, m: MicroBatchResult(cells(p.num_items), cells(p.num_items)[None, :]),
                       r"returned `microbatch` of shape \(1, 3\) and dtype int64; expected \(3,\) ints"),
    "float-rank": (lambda p, m: MicroBatchResult(cells(p.num_items) + 0.0, cells(p.num_items)),
                   r"returned `rank` of shape \(3,\) and dtype float64; expected \(3,\) ints"),
    "ragged": (lambda p, m: MicroBatchResult([0, [1, 2], 0], cells(p.num_items)),
               r"returned `rank` that is no array \(.*\); expected \(3,\) ints"),
    "microbatch-out-of-range": (lambda p, m: MicroBatchResult(cells(p.num_items), cells(p.num_items, m)),
                                r"put item 0 in microbatch (\d), outside \[0, \1\) for num_microbatches=\1 on 2 ranks"),
    "tuple": (lambda p, m: (cells(p.num_items), cells(p.num_items)),
              r"returned a tuple for num_microbatches=\d; expected a MicroBatchResult \(or None: no packing\)"),
    "status": (lambda p, m: MicroBatchResult(cells(p.num_items), cells(p.num_items), "best"),
               r"returned status 'best'; expected one of \['optimal', 'feasible', 'time_limit'\]"),
    "nan-bound": (lambda p, m: MicroBatchResult(cells(p.num_items), cells(p.num_items), lower_bound=float("nan")),
                  r"returned lower_bound=nan; expected a real number or None"),
}


@pytest.mark.parametrize("num_microbatches", [None, 2], ids=["free-M", "fixed-M"])
@pytest.mark.parametrize("fault", sorted(MALFORMED))
def test_regression_a_malformed_kernel_result_raised_a_numpy_error(monkeypatch, fault, num_microbatches):
    """Cause: with M free the step cost of each M's result was summed before any check of its
    form, so a kernel's wrong lengths or shapes surfaced as numpy's broadcast or index errors."""
    result, message = MALFORMED[fault]
    record = MicroBatchAlgorithm("test_malformed", returning(result), description="a malformed result")
    monkeypatch.setitem(registry._microbatch_records, record.name, record)
    with pytest.raises(RuntimeError, match=rf"^algorithm 'test_malformed' {message}"):
        balance_microbatches([3, 2, 1], 2, max_tokens_per_microbatch=8, algorithm="test_malformed",
                             num_microbatches=num_microbatches)


def budget_reader(problem, num_microbatches):
    """`one_per_cell`, reading the budget by its earlier name (`problem.max_tokens`)."""
    assert problem.max_tokens == problem.max_tokens_per_microbatch
    return one_per_cell(problem, num_microbatches)


def test_the_old_budget_name_still_reads_with_a_deprecation_warning():
    register_microbatch_algorithm("test_budget_reader", budget_reader, description="reads problem.max_tokens")
    with pytest.warns(DeprecationWarning, match="read max_tokens_per_microbatch"):
        plan = balance_microbatches([5, 4, 3], 2, max_tokens_per_microbatch=8, algorithm="test_budget_reader")
    assert plan.num_microbatches == 2


@pytest.mark.parametrize("lengths", [[9, 7, 5, 5, 4, 3, 2, 2], [3, 2, 2, 1]], ids=["several", "one_micro_batch"])
@pytest.mark.parametrize("algorithm", ["auto", "greedy", "cells", "exact"])
def test_our_kernels_read_the_budget_by_its_one_name(algorithm, lengths):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        balance_microbatches(lengths, 2, max_tokens_per_microbatch=12, algorithm=algorithm)


def test_regression_a_kernel_over_the_budget_was_repaired_silently_under_a_pipeline():
    """P4-13: with `pipeline=`, the pipeline re-plan rebuilt the kernel's cells, so a kernel putting 16 tokens in a
    cell of 8 got a valid plan labelled 'test_all_in_one+pipeline', status optimal, and its bug went unreported."""
    from orchmllm import Pipeline

    register_microbatch_algorithm("test_all_in_one", all_in_one, padded=False, description="one cell for all")
    with pytest.raises(RuntimeError, match=r"'test_all_in_one' put 16 tokens in cell \(rank 0, micro-batch 0\), "
                                           r"over max_tokens_per_microbatch=8"):
        balance_microbatches([5, 4, 3, 3, 1], 2, max_tokens_per_microbatch=8, algorithm="test_all_in_one",
                             pipeline=Pipeline(stages=2))


def test_regression_a_balancing_algorithm_given_for_a_micro_batch_budget_was_called_unknown_without_why():
    """P4-16: `BalancedDistributedSampler(..., max_tokens_per_microbatch=T, algorithm="lpt")` (and
    balance_microbatches) said only "unknown `algorithm` 'lpt'; choose one of ['auto', 'cells', ...]" of a known
    balancing algorithm; now the message says why, both ways."""
    with pytest.raises(ValueError, match=r"unknown `algorithm` 'lpt'; choose one of \['auto', 'cells', .*\] \('lpt' "
                                         r"balances a step of one pass per rank; a micro-batch budget takes one of "
                                         r"these micro-batch algorithms\)"):
        balance_microbatches([3, 2], 2, max_tokens_per_microbatch=4, algorithm="lpt")
    with pytest.raises(ValueError, match=r"\('cells' is a micro-batch algorithm: pass it with "
                                         r"`max_tokens_per_microbatch`, or to balance_microbatches\)"):
        balance([3, 2], 2, algorithm="cells")
