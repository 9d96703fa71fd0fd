"""`orchmllm demo`: the one front end to `orchmllm.runtime.demo` (gloo ranks on this machine,
or the ranks torchrun started)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time

from .arguments import degree_list
from .errors import EXIT_FAILED, EXIT_OK, MissingDependencyError, UsageError, naming_flag, usage_errors
from .render import console, print_json


def print_demo(report) -> list[str]:
    """Print the demo report (a `DemoReport`), saying which busy figure is which; return
    the checks that failed."""
    from rich.table import Table

    from ..runtime.demo.report import BALANCED_ISOLATED_TARGET

    out = console()
    out.print(f"[bold]{report.ranks} ranks x {report.steps} steps ({report.dtype}): the same batches with and "
              "without post-balancing[/bold]")
    table = Table(title="busy seconds per rank (CPU time of forward + backward, summed over steps)")
    table.add_column("rank", justify="right")
    for name in ("unbalanced, isolated", "balanced, isolated", "unbalanced, concurrent", "balanced, concurrent"):
        table.add_column(name, justify="right")
    for rank, row in enumerate(zip(report.busy_seconds_per_rank_unbalanced_isolated,
                                   report.busy_seconds_per_rank_balanced_isolated,
                                   report.busy_seconds_per_rank_unbalanced, report.busy_seconds_per_rank_balanced)):
        table.add_row(str(rank), *[f"{value:.3f}" for value in row])
    out.print(table)
    tolerance = report.gradient_tolerance
    out.print(f"gradients, balanced vs unbalanced: max |diff| {report.grad_max_abs_diff:.3g}, relative "
              f"{report.grad_max_rel_diff:.3g} ({'within' if report.grad_max_rel_diff <= tolerance else 'ABOVE'} "
              f"{report.dtype} rounding tolerance {tolerance:.2g} for sums of {report.gradient_terms} terms)")
    out.print(f"samples lost {report.samples_lost}, duplicated {report.samples_duplicated}")

    def steps(values):
        return ", ".join(f"{value:.3f}" for value in values)

    out.print("slowest rank's busy time / mean (mean over steps; per step in brackets):")
    out.print(f"  isolated (every rank's recorded work replayed by one process, one piece of one work at a time, "
              f"the ranks' pieces side by side, thread CPU time, trimmed mean share of {report.replay_repeats} "
              f"rounds; the check uses these): "
              f"balanced {report.busy_max_over_mean_balanced_isolated:.3f} "
              f"({steps(report.busy_max_over_mean_balanced_isolated_per_step)}), unbalanced "
              f"{report.busy_max_over_mean_unbalanced_isolated:.3f} "
              f"({steps(report.busy_max_over_mean_unbalanced_isolated_per_step)}), noise floor (identical work) "
              f"{report.busy_max_over_mean_identical_work_isolated:.3f}")
    out.print(f"  concurrent (every rank at once, as trained; contention included): balanced "
              f"{report.busy_max_over_mean_balanced:.3f}, unbalanced {report.busy_max_over_mean_unbalanced:.3f}, "
              f"noise floor {report.busy_max_over_mean_identical_work:.3f}")
    out.print(f"  planned (the cost models' prediction): balanced {report.busy_max_over_mean_balanced_planned:.3f}, "
              f"unbalanced {report.busy_max_over_mean_unbalanced_planned:.3f}")
    if report.max_tokens_per_microbatch is not None:
        out.print(f"micro-batched balanced step (<= {report.max_tokens_per_microbatch} tokens per rank and "
                  f"micro-batch; micro-batches per step {report.num_microbatches}): sum over micro-batches of the "
                  f"slowest rank's busy time / sum of the means (what synchronised micro-batches cost), isolated "
                  f"{report.microbatch_busy_max_over_mean_isolated:.3f} "
                  f"({steps(report.microbatch_busy_max_over_mean_isolated_per_step)}), noise floor (identical cells) "
                  f"{report.microbatch_busy_max_over_mean_identical_work_isolated:.3f}, concurrent "
                  f"{report.microbatch_busy_max_over_mean:.3f}, planned "
                  f"{report.microbatch_busy_max_over_mean_planned:.3f}")
        out.print("  per micro-batch, slowest rank / mean, isolated: " + "; ".join(
            f"step {step}: {steps(cells)}" for step, cells in
            enumerate(report.microbatch_busy_max_over_mean_isolated_per_cell)))
        out.print(f"  target: that isolated figure <= {BALANCED_ISOLATED_TARGET} and below isolated unbalanced")
    else:
        out.print(f"  target: isolated balanced <= {BALANCED_ISOLATED_TARGET} and below isolated unbalanced")
    hidden = (f"{report.planning_hidden_fraction:.1%} hidden by prefetch" if report.steps > 1
              else "the first step's plan cannot be prefetched")
    out.print(f"exchange {1e3 * report.exchange_seconds:.1f} ms, planning {1e3 * report.planning_seconds:.1f} ms "
              f"({hidden}), overhead {report.overhead_fraction:.1%} of the balanced step")
    out.print(f"wall {report.wall_seconds:.1f} s: cost-model calibration {report.calibration_seconds:.1f} s, training "
              f"{report.concurrent_seconds:.1f} s, isolated replay "
              f"{report.replay_seconds:.1f} s ({report.replay_share:.0%} of the rest)")
    failed = report.failed_checks()
    for problem in failed:
        out.print(f"[bold red]check failed:[/bold red] {problem}")
    return failed


def _demo_module():
    """`orchmllm.runtime.demo`, or MissingDependencyError when torch is not installed."""
    try:
        from ..runtime import demo
    except ImportError as error:
        if importlib.util.find_spec("torch") is not None:
            raise
        raise MissingDependencyError("the demo needs torch: python3.11 -m pip install 'torch>=2.4,<3'") from error
    return demo


def stage_printer():
    """`progress(message)` for the demo: each stage on stderr with the seconds since the start, one
    line each, --json included (a run takes minutes; stdout stays the report alone)."""
    start = time.perf_counter()

    def say(message: str) -> None:
        print(f"orchmllm demo: {time.perf_counter() - start:6.1f} s  {message}", file=sys.stderr, flush=True)
    return say


def run(args) -> int:
    """`orchmllm demo`: train the tiny multimodal model with and without balancing (its options checked by
    `prechecks`, the algorithm here, before torch is imported)."""
    if args.workload == "giants":
        return run_giants(args)
    from ..balancers import CostModel
    from ..balancers.registry import algorithms
    from ..orchestrator.stages import MICROBATCHED_LLM_ALGORITHMS, Stage, one_pass_replaced
    names = [record.name for record in algorithms(padded=False)]
    if args.algorithm not in names:  # every stage takes it (`demo_stages`), each balancing unpadded costs
        known = args.algorithm in {record.name for record in algorithms()}
        raise UsageError(f"--algorithm {args.algorithm}: {'solves the padded cost only' if known else 'unknown'}; "
                         f"the demo's stages balance unpadded costs sum f(l): choose one of {', '.join(names)}")
    with usage_errors():  # what else a stage refuses, named by the vision stage
        Stage("vision", "image", CostModel(), algorithm=args.algorithm)
    problem = None if args.max_tokens_per_microbatch is None else one_pass_replaced(
        args.algorithm, MICROBATCHED_LLM_ALGORITHMS, "--algorithm", "--max-tokens-per-microbatch")
    if problem is not None:
        raise UsageError(problem)
    demo = _demo_module()
    torchrun = "RANK" in os.environ
    gpus_per_node = args.gpus_per_node
    if gpus_per_node is None and args.transport == "hierarchical":
        gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:  # the options' own validation (e.g. --gpus-per-node not dividing --ranks) is a usage error
        options = demo.DemoOptions(args.samples_per_rank, args.algorithm, args.transport, gpus_per_node, args.costs,
                                   args.repeats, args.replay_repeats, args.max_tokens_per_microbatch)
        if not torchrun:
            demo.check_run(args.ranks, args.steps, args.dtype, options, args.seed)
    except ValueError as error:
        raise UsageError(naming_flag(error, {name: f"--{name.replace('_', '-')} {getattr(args, name)}" for name in
                                             ("ranks", "steps", "seed", "samples_per_rank", "max_tokens_per_microbatch",
                                              "gpus_per_node", "repeats", "replay_repeats")})) from error
    say = stage_printer()
    if torchrun:
        report = demo.run_demo_in_process_group(args.steps, args.seed, args.dtype, options=options, progress=say)
    else:
        report = demo.run_demo(args.ranks, args.steps, args.seed, args.dtype, options=options, progress=say)
    if report is None:  # a torchrun rank other than 0: rank 0 prints and decides
        return EXIT_OK
    say("done")
    if args.json:
        print_json(report.to_json())
        return EXIT_FAILED if report.failed_checks() else EXIT_OK
    return EXIT_FAILED if print_demo(report) else EXIT_OK


def run_giants(args) -> int:
    """`orchmllm demo --workload giants`: the giant split over context-parallel groups, and not (the options
    it takes checked by `prechecks`)."""
    default = ",".join(str(d) for d in (1, 2, 4) if d <= args.ranks)
    degrees = degree_list(default if args.context_parallel is None else args.context_parallel, "--context-parallel",
                          [args.ranks])
    if degrees[-1] == 1:  # nothing can split: the check that splitting balances the giant would fail by construction
        raise UsageError("--ranks 1: the giants workload splits an item over 2 or more ranks" if args.ranks == 1 else
                         f"--context-parallel {args.context_parallel}: the giants workload needs a degree above 1 to "
                         f"split its giant")
    _demo_module()
    from ..runtime.demo.giants import GiantsConfig, run_giants as run

    say = stage_printer()
    report = run(args.ranks, args.steps, args.seed, args.dtype, degrees=degrees,
                 config=GiantsConfig(samples_per_rank=args.samples_per_rank), replay_repeats=args.replay_repeats,
                 progress=say)
    say("done")
    if args.json:
        print_json(report.to_json())
    else:
        out = console()
        out.print(f"[bold]{report.ranks} ranks x {report.steps} steps ({report.dtype}), giants workload, "
                  f"degrees {report.context_parallel}[/bold]")
        out.print(f"items split {report.items_split} (degrees per step {report.degrees_per_step}); tokens lost "
                  f"{report.tokens_lost}, duplicated {report.tokens_duplicated}; samples lost {report.samples_lost}")
        out.print(f"gradients vs the unsplit unbalanced single-process reference: max |diff| "
                  f"{report.grad_max_abs_diff:.3g}, relative {report.grad_max_rel_diff:.3g} (tolerance "
                  f"{report.gradient_tolerance:.2g})")
        out.print(f"isolated busy max/mean: with splitting {report.busy_max_over_mean_isolated_split:.3f}, without "
                  f"{report.busy_max_over_mean_isolated_unsplit:.3f} (planned "
                  f"{report.busy_max_over_mean_planned_split:.3f} / {report.busy_max_over_mean_planned_unsplit:.3f})")
        for problem in report.failed_checks():
            out.print(f"[bold red]check failed:[/bold red] {problem}")
    return EXIT_FAILED if report.failed_checks() else EXIT_OK
