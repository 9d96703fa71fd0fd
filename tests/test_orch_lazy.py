"""What a plan builds on first read (`orchestrator.lazy`): a planned pass's routes and its stages' layouts are those
`compose`, `split_layout` and `group_order` / `offsets_within_rank` build eagerly, whenever and however they are
read."""

import dataclasses
import pickle

import numpy as np
import pytest

from orchmllm import ContextParallel, Orchestrator
from orchmllm.orchestrator.plan import PassPlan, compose, offsets_within_rank
from orchmllm.orchestrator.shards import split_layout
from orchmllm.orchestrator.samples import group_order
from orchmllm.study.models import MODELS
from orchmllm.study.simulator import cluster
from orchmllm.study.workloads import sample_workload

ROUTES = [field.name for field in dataclasses.fields(PassPlan) if field.name.startswith("route_")]
LAYOUT = ("rank_offsets", "rank_items", "item_input_offset", "item_offset")


def _steps():
    """A micro-batched step that splits samples (the long workload) and a plain step of the default mix, on 128 ranks
    (up to `WHOLE_STEP_RANKS` the steps of other placements are compared by the bytes they move: routes read)."""
    stages = MODELS["84b"].stages()
    split = Orchestrator(stages, cluster(128), context_parallel=ContextParallel(), max_tokens_per_microbatch=32768)
    return (split.plan(sample_workload("long", 128, 16, seed=11)),
            Orchestrator(stages, cluster(128)).plan(sample_workload("default", 128, 16, seed=11)))


@pytest.fixture
def steps():
    return _steps()


def test_routes_are_composed_on_first_read_as_compose_builds_them(steps):
    split_step, plain_step = steps
    assert split_step.num_microbatches > 1 and any(plan.llm.split is not None for plan in split_step.microbatches)
    for plan in (*split_step.microbatches, *plain_step.microbatches):
        assert not set(ROUTES) & set(vars(plan))  # planned and costed without its routes
        eager = compose(plan.batch, plan.stages, plan.stage_plans)
        plan.route_row  # one read builds them all
        assert set(ROUTES) <= set(vars(plan))
        for name in ROUTES:
            assert np.array_equal(getattr(plan, name), getattr(eager, name)), name
            assert getattr(plan, name) is vars(plan)[name]  # built once


def test_layouts_are_built_on_first_read_as_the_stage_plan_built_them(steps):
    for plan in (*steps[0].microbatches, *steps[1].microbatches):
        assert not any(set(LAYOUT) & set(vars(stage_plan)) for stage_plan in plan.stage_plans)
        for stage_plan in plan.stage_plans[:-1]:
            offsets, items = group_order(stage_plan.destination, plan.num_ranks)
            inputs, outputs = offsets_within_rank(offsets, items, stage_plan.item_length, stage_plan.item_tokens)
            for name, expected in zip(LAYOUT, (offsets, items, inputs, outputs)):
                assert np.array_equal(getattr(stage_plan, name), expected), name
        llm, batch = plan.llm, plan.batch
        if np.any(llm.degree > 1):  # the LLM stage's from its shards, each split sample's first one
            shards, chunks = split_layout(batch, llm.destination, llm.degree)
            assert np.array_equal(llm.split[1].packed, chunks.packed) and "_laid" not in vars(llm)
            first = shards.group_rank == 0
            expected = (shards.rank_offsets, shards.sample, shards.text_offset[first], shards.offset[first])
            expected = expected[:2] + tuple(column[np.argsort(shards.sample[first])] for column in expected[2:])
        else:  # from its samples' text
            offsets, items = group_order(llm.destination, plan.num_ranks)
            expected = (offsets, items, *offsets_within_rank(offsets, items, batch.sample_text, llm.item_tokens))
            assert llm.split is None
        for name, column in zip(LAYOUT, expected):
            assert np.array_equal(getattr(llm, name), column), name


def test_given_routes_are_kept_and_plans_stay_frozen():
    plan = _steps()[0].microbatches[0]
    moved = plan.route_llm_offset + 1  # replace reads (builds) the others and keeps the one given
    changed = dataclasses.replace(plan, route_llm_offset=moved)
    assert changed.route_llm_offset is moved and np.array_equal(changed.route_row, plan.route_row)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.route_row = moved
    llm = plan.llm
    with pytest.raises(ValueError, match="needs its rank layout given"):
        dataclasses.replace(llm, **{name: llm.__dataclass_fields__[name].default for name in LAYOUT}).rank_items


def test_an_unbuilt_plan_pickles_and_builds_the_same_routes():
    plan = _steps()[0].microbatches[-1]
    copy = pickle.loads(pickle.dumps(plan))
    assert not set(ROUTES) & set(vars(copy))
    assert copy.digest() == plan.digest()


def test_built_builds_every_route_and_layout_now():
    """`StepPlan.built()`, for a plan made in one thread and run in another: after it, no field is left to build on
    a read (the training loop's), and what it built is what the reads build."""
    for step in _steps():
        lazy_reads = pickle.loads(pickle.dumps(step))  # the same plan, nothing built
        assert step.built() is step
        for plan, other in zip(step.microbatches, lazy_reads.microbatches):
            assert set(ROUTES) <= set(vars(plan))
            for name in ROUTES:
                assert np.array_equal(getattr(plan, name), getattr(other, name)), name
            for stage_plan, other_stage in zip(plan.stage_plans, other.stage_plans):
                assert set(LAYOUT) <= set(vars(stage_plan))
                for name in LAYOUT:
                    assert np.array_equal(getattr(stage_plan, name), getattr(other_stage, name)), name


def test_regression_two_threads_first_reading_a_split_layout_raised_key_error():
    """Cause (probe57 Z1, rev56 R1): both threads ran the LLM layout's builder, and the second's pop of the chunks
    it had laid (`_laid`) raised KeyError; now one builds under the lazy lock and the other reads its values."""
    import threading

    step = _steps()[0]
    for plan in step.microbatches:
        barrier, read = threading.Barrier(2), []

        def first_read(plan=plan, barrier=barrier, read=read):
            barrier.wait()
            try:
                read.append(plan.llm.rank_offsets)
            except Exception as error:  # noqa: BLE001 (the regression: KeyError('_laid'))
                read.append(error)

        threads = [threading.Thread(target=first_read) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert read[0] is read[1], read  # one build, read by both


def test_regression_a_copy_taken_while_another_thread_builds_waits_for_that_build(monkeypatch):
    """Cause (probe58 Z2): pickling or copying read a plan's `__dict__` while another thread's build filled it:
    'dictionary changed size during iteration', 9 of 10 tries.  Now a copy reads it under the builders' lock: held
    here inside a build, the pickle waits and carries the whole build (on the parent it took the unbuilt state)."""
    import threading

    plan = _steps()[0].microbatches[-1]
    inside, release, copies = threading.Event(), threading.Event(), []
    routes = PassPlan._routes

    def slow_routes(self):
        inside.set()
        release.wait(30)
        return routes(self)

    monkeypatch.setattr(PassPlan, "_routes", slow_routes)
    builder = threading.Thread(target=lambda: plan.route_row)
    builder.start()
    assert inside.wait(30)
    copier = threading.Thread(target=lambda: copies.append(pickle.loads(pickle.dumps(plan))))
    copier.start()
    copier.join(0.5)
    assert copier.is_alive()  # waiting for the build, not reading a dict that is being filled
    release.set()
    builder.join(30)
    copier.join(30)
    assert set(ROUTES) <= set(vars(copies[0]))
    assert np.array_equal(copies[0].route_row, plan.route_row)


def test_regression_a_child_forked_while_a_thread_builds_reads_without_waiting():
    """Cause (probe58 F1): a process forked while another thread held the builders' lock inherited it held by a
    thread it does not have, and its first lazy read waited forever (5 of 5 forks).  The child's lock is new."""
    import os
    import signal
    import threading

    from orchmllm.orchestrator import lazy

    plan = _steps()[0].microbatches[-1]
    held, release = threading.Event(), threading.Event()

    def hold():
        with lazy._LOCK:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: a first read of a route, given 10 s (killed by the alarm, whatever handler was set)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(10)
        read = False
        try:  # whatever the read does, the child leaves here (never back into pytest's frames)
            read = plan.route_row.size == plan.route_stage.size
        finally:
            os._exit(0 if read else 1)
    release.set()
    holder.join(30)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status  # on the parent: killed by SIGALRM
