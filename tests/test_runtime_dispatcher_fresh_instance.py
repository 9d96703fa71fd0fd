"""A dispatcher rebuilt on one rank (same options) meets its peers' warm ones (probe27 P27-08).

Warm dispatchers send their exchange headers in the payload all-to-all; a dispatcher built since had no schema agreed
and sent its first header in an all-reduce, so every rank waited until the group's timeout.  The metadata all-gather
of `plan` now carries a word of each rank's exchange sites: where they differ, every rank starts its sites afresh;
and a dispatcher that has made no plan exchanges another's plans through the dispatcher that made them.

Real gloo groups of 3 ranks; each rank counts its own collectives (`runtime.counting`)."""

import pickle

import numpy as np
import pytest
import torch

from orchmllm.runtime import PlanMismatchError, PostBalancingDispatcher, Prefetcher, accumulate, normalize_loss
from orchmllm.runtime.counting import CollectiveCounter
from orchmllm.runtime.launch import spawn

REBUILT_RANK, REBUILT_STEP = 2, 1


def _lengths(rank, step):
    return [4, 4] if rank == 2 else [3 + step, 1 + (step * 2) % 5, 2]


def _batch(rank, step, lengths):
    return {"x": torch.arange(sum(lengths), dtype=torch.float32)[:, None] + 100 * rank + 1000 * step,
            "id": torch.arange(len(lengths)) + 10 * rank}


def _exchanged(dispatcher, batch, plan):
    """Dispatch and combine `batch` along `plan`; the collectives they ran, after checking that the moved ids are
    the plan's items and that home is the batch."""
    counter = CollectiveCounter()
    try:
        moved = dispatcher.dispatch(batch, plan)
        home = dispatcher.combine(dict(moved), plan, differentiable=False, order="local_items")
    finally:
        counter.close()
    firsts = np.cumsum(plan.metadata.counts) - plan.metadata.counts  # global index of each rank's item 0
    sources = plan.metadata.source_ranks[plan.local_items]
    assert moved["id"].tolist() == (plan.local_items - firsts[sources] + 10 * sources).tolist()
    assert torch.equal(home["x"], batch["x"]) and torch.equal(home["id"], batch["id"])
    return sum(counter.calls.values())


def _rebuilt_job(rank, size):
    """Three steps of plan, dispatch, combine; rank 2 alone builds a new dispatcher at step 1.  Per step: the
    collectives its dispatch and combine ran."""
    dispatcher, counts = PostBalancingDispatcher(per_item_keys={"id"}), []
    for step in range(3):
        if rank == REBUILT_RANK and step == REBUILT_STEP:
            dispatcher = PostBalancingDispatcher(per_item_keys={"id"})
        lengths = _lengths(rank, step)
        plan = dispatcher.plan(lengths)
        counts.append(_exchanged(dispatcher, _batch(rank, step, lengths), plan))
    return counts


def test_regression_a_dispatcher_rebuilt_on_one_rank_waited_for_its_peers_until_the_timeout():
    """Cause: rank 2's new dispatcher sent its first header in an all-reduce while ranks 0-1 rode theirs in the
    payload all-to-all: every rank raised PeerFailureError after the collective timeout, naming nothing.  Now the
    step of the rebuild moves its rows on every rank with a header all-reduce at dispatch and at combine (four
    collectives, as the first step), and the next step's headers ride again (two)."""
    counts = spawn(_rebuilt_job, 3, timeout_s=60, collective_timeout_s=5)
    assert counts == [[4, 4, 2]] * 3, counts


def _exchanged_by_another_job(rank, size):
    """Rank 2 exchanges step 1's plan through another dispatcher (same options, no plan made), and step 2's
    through a dispatcher built after the plan; step 3 is planned by that new one.  Per step: the collectives."""
    dispatcher, counts = PostBalancingDispatcher(per_item_keys={"id"}), []
    for step in range(4):
        lengths = _lengths(rank, step)
        plan, exchanging = dispatcher.plan(lengths), dispatcher
        if rank == REBUILT_RANK and step == 1:
            exchanging = PostBalancingDispatcher(per_item_keys={"id"})
        if rank == REBUILT_RANK and step == 2:
            dispatcher = exchanging = PostBalancingDispatcher(per_item_keys={"id"})
        counts.append(_exchanged(exchanging, _batch(rank, step, lengths), plan))
    return counts


def test_regression_a_plan_exchanged_on_one_rank_by_a_dispatcher_that_made_none_waited_until_the_timeout():
    """Cause: as above, the other dispatcher's first header went in an all-reduce.  Now it exchanges the plan
    through the dispatcher that made it, whose headers ride as its peers' do (two collectives); the new
    dispatcher's first plan starts every rank's sites afresh (four)."""
    counts = spawn(_exchanged_by_another_job, 3, timeout_s=60, collective_timeout_s=5)
    assert counts == [[4, 2, 2, 4]] * 3, counts


def _trained_job(rank, size):
    """A DDP model trained in `accumulate` over the micro-batches of each step; rank 2 alone builds a new dispatcher
    at step 1.  Per step: the collectives the step ran (plan to the last backward)."""
    torch.manual_seed(0)
    model, dispatcher, counts = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1)), None, []
    for step in range(3):
        if dispatcher is None or (rank == REBUILT_RANK and step == REBUILT_STEP):
            dispatcher = PostBalancingDispatcher()
        lengths, counter = _lengths(rank, step), CollectiveCounter()
        try:
            plan = dispatcher.plan(lengths)
            moved = dispatcher.dispatch({"x": _batch(rank, step, lengths)["x"]}, plan)
            for micro in dispatcher.microbatches(plan, moved):
                with accumulate(model, micro):
                    normalize_loss(model(micro.data["x"]).sum(), micro).backward()
        finally:
            counter.close()
        counts.append(sum(counter.calls.values()))
    return counts


def test_regression_a_dispatcher_rebuilt_on_one_rank_under_ddp_owed_the_model_check_alone():
    """Cause (rt42, after the fix above): the model check's all-gather runs at a dispatcher's first training step;
    the rebuilt rank owed it while its warm peers did not, so it waited in that all-gather and they in the next
    all-to-all until the timeout.  The plan's state word now carries whether a loop trained: where it differs, the
    check runs on every rank at that step (five collectives, as the first step), and not after (three)."""
    counts = spawn(_trained_job, 3, timeout_s=60, collective_timeout_s=5)
    assert counts == [[5, 5, 3]] * 3, counts


def _two_warm_job(rank, size):
    """A training and an evaluation dispatcher (same options), both planning and exchanging at steps 0-1 on every
    rank; at step 2 rank 2 gives the training plan to the evaluation dispatcher.  Per step: the collectives of the
    training plan's exchange."""
    train, evaluation = PostBalancingDispatcher(per_item_keys={"id"}), PostBalancingDispatcher(per_item_keys={"id"})
    counts = []
    for step in range(3):
        lengths = _lengths(rank, step)
        plan = train.plan(lengths)
        if step < 2:
            others = list(reversed(lengths))
            _exchanged(evaluation, _batch(rank, step, others), evaluation.plan(others))
        counts.append(_exchanged(evaluation if rank == REBUILT_RANK and step == 2 else train,
                                 _batch(rank, step, lengths), plan))
    return counts


def test_regression_a_warm_second_dispatcher_given_the_others_plan_on_one_rank_aborted_gloo():
    """Cause (probe27 P27-10): only a dispatcher that had made no plan handed another's plan to its maker; a warm
    evaluation dispatcher exchanged the training plan through its own sites on rank 2, and gloo aborted the
    processes (SIGABRT, '48 vs 24' bytes).  Now a plan goes through the dispatcher that made it wherever that one
    has the options and group: every step's headers ride (two collectives) from the second on."""
    counts = spawn(_two_warm_job, 3, timeout_s=60, collective_timeout_s=5)
    assert counts == [[4, 2, 2]] * 3, counts


def _other_options_job(rank, size, warm, call, options=None, copied=False):
    """A training dispatcher plans every step; an evaluation one (of `options`, default a token budget) plans and
    exchanges its own at steps 0-1 where `warm`, and plans after the training one every step where `warm` is None;
    at step 2 rank 2 gives the training plan (a pickled copy where `copied`) to the evaluation one's `call`
    ("dispatch" or "combine").  What each rank raised there."""
    train = PostBalancingDispatcher(per_item_keys={"id"})
    options = {"max_tokens_per_microbatch": 64} if options is None else options
    evaluation = PostBalancingDispatcher(per_item_keys={"id"}, **options)
    for step in range(3):
        lengths = _lengths(rank, step)
        batch, plan = _batch(rank, step, lengths), train.plan(lengths)
        if warm and step < 2:
            _exchanged(evaluation, batch, evaluation.plan(lengths))
        if warm is None:
            evaluation.plan(list(reversed(lengths)))
        odd = evaluation if rank == REBUILT_RANK and step == 2 else train
        plan = pickle.loads(pickle.dumps(plan)) if copied and odd is evaluation else plan
        try:
            moved = (odd if call == "dispatch" else train).dispatch(batch, plan)
            (odd if call == "combine" else train).combine(moved, plan, differentiable=False)
        except PlanMismatchError as error:
            return str(error)
    return "no error"


@pytest.mark.parametrize("warm, call", [(True, "dispatch"), (False, "combine"), (None, "dispatch")],
                         ids=["warm", "fresh", "planned_since"])
def test_regression_a_plan_given_on_one_rank_to_a_dispatcher_of_other_options_is_named_on_every_rank(warm, call):
    """Cause (probe27 P27-10b): the evaluation dispatcher refused the plan through its own sites, so a fresh one's
    header all-reduce met its peers' payload all-to-all (every rank timed out, naming nothing) and a warm one's
    header gloo aborted on (SIGABRT, '48 vs 24' bytes).  Now the refusal rides in the training dispatcher's
    exchange, which its peers run: every rank raises it, naming rank 2 and the option that differs.  Also where the
    evaluation dispatcher planned after the training plan (probe30 P30-01: it then exchanged the plan itself)."""
    messages = spawn(_other_options_job, 3, args=(warm, call), timeout_s=60, collective_timeout_s=5)
    for message in messages:
        assert "ranks [2] disagree with ranks [0, 1]" in message, messages
        assert f"{call} on rank 2: the plan was made by a dispatcher with other options (`max_tokens_per_microbatch`" \
            in message, messages


def _kept_job(rank, size):
    """Every rank plans steps 0-2 ahead with a second dispatcher (same options) that exchanges nothing; at step 2
    rank 2 dispatches that one's step-0 plan through the training dispatcher.  What each rank raised there."""
    train, ahead = PostBalancingDispatcher(per_item_keys={"id"}), PostBalancingDispatcher(per_item_keys={"id"})
    kept = [ahead.plan(_lengths(rank, step)) for step in range(3)]
    for step in range(3):
        lengths = _lengths(rank, step)
        plan = train.plan(lengths)
        plan = kept[0] if rank == REBUILT_RANK and step == 2 else plan
        try:
            train.combine(train.dispatch(_batch(rank, step, lengths), plan), plan, differentiable=False)
        except PlanMismatchError as error:
            return str(error)
    return "no error"


def test_regression_a_plan_kept_from_an_idle_dispatcher_went_through_its_sites_until_the_timeout():
    """Cause (P27-10b's twin): a plan went through the dispatcher that made it, whose fresh sites' header all-reduce
    met the peers' payload all-to-all.  A plan of a dispatcher that only planned now goes through the one given it,
    and every rank names rank 2's plan."""
    for message in spawn(_kept_job, 3, timeout_s=60, collective_timeout_s=5):
        assert "the plan differs across ranks" in message and "ranks [2] disagree with ranks [0, 1]" in message, message


def test_a_training_plan_given_on_one_rank_to_a_same_options_dispatcher_that_planned_since_moves_its_rows():
    """probe30 P30-01: the evaluation dispatcher (same options) planned after the training plan, so the plan went
    through its fresh sites, whose header all-reduce met its peers' payload all-to-all: every rank timed out naming
    nothing.  The training plan's maker exchanged before: the plan goes through it (`steps.plan_runner`)."""
    assert spawn(_other_options_job, 3, args=(None, "dispatch", {}), timeout_s=60, collective_timeout_s=5) \
        == ["no error"] * 3


def _prefetched_evaluation_job(rank, size, steps, items):
    """An evaluation dispatcher plans in a Prefetcher thread while the training plan is made; every rank then gives
    the training plan to the evaluation dispatcher.  Per step: whether the rows came home."""
    train, evaluation = PostBalancingDispatcher(), PostBalancingDispatcher()
    prefetcher = Prefetcher(lambda lengths, group: evaluation.plan(lengths, metadata_group=group))
    rng, home = np.random.default_rng(rank), []
    try:
        for _ in range(steps):
            lengths = rng.integers(1, 50, items).tolist()
            batch = {"x": torch.arange(sum(lengths), dtype=torch.float32)[:, None]}
            prefetcher.submit(rng.integers(1, 50, items).tolist())
            plan = train.plan(lengths)
            prefetcher.result()
            moved = evaluation.combine(dict(evaluation.dispatch(batch, plan)), plan, differentiable=False,
                                       order="local_items")
            home.append(torch.equal(moved["x"], batch["x"]))
    finally:
        prefetcher.close()
    return home


def test_regression_which_dispatcher_runs_a_handed_plan_followed_a_thread_race():
    """probe30 P30-03, the same program on every rank: 69d3d4b chose the runner from the order in which the two
    dispatchers' plans were numbered, which the planning thread races, so ranks chose apart and every rank timed
    out naming nothing (5 of 5 runs of 30 steps).  The choice now follows only what this rank's program did (the
    maker exchanged before, or the given dispatcher made no plan): the same on every rank."""
    assert spawn(_prefetched_evaluation_job, 3, args=(12, 1000), timeout_s=90, collective_timeout_s=5) \
        == [[True] * 12] * 3


def test_a_copied_plan_given_on_one_rank_to_another_dispatcher_finds_its_maker():
    """probe30 P30-02: a pickled (or deep-copied) plan dropped its maker, so given on rank 2 to a fresh dispatcher of
    the same options it ran that one's header all-reduce against its peers' payload all-to-all: every rank timed
    out naming nothing.  A copy in the same process finds its maker again by its token."""
    assert spawn(_other_options_job, 3, args=(False, "dispatch", {}, True), timeout_s=60, collective_timeout_s=5) \
        == ["no error"] * 3
