"""`orchmllm demo`: a thin front end to `orchmllm.runtime.demo` (gloo ranks on this machine)."""

from __future__ import annotations

import importlib.util

from . import arguments, render
from .errors import EXIT_FAILED, EXIT_OK, MissingDependencyError, UsageError

EXAMPLES = """examples:
  orchmllm demo                                      # 4 CPU gloo ranks, 3 steps
  orchmllm demo --ranks 2 --steps 2 --dtype float64 --json
on a GPU cluster, the same training step under torchrun and NCCL:
  torchrun --nproc-per-node 8 -m orchmllm.runtime.demo --json
exit code 1 when a check fails (gradients differ beyond rounding, a sample lost or duplicated)
"""

# Largest relative gradient difference between the balanced and unbalanced runs that is
# still summation-order rounding (sums commute; only their order changes).
GRADIENT_TOLERANCE = {"float32": 1e-6, "float64": 1e-12}  # the equivalence targets


def add_parser(commands) -> None:
    demo = arguments.subcommand(
        commands, "demo", "train a tiny vision+audio+text model on local gloo ranks, balanced and not",
        "Spawn CPU processes in a gloo group and train the tiny multimodal model on the same "
        "batches with and without post-balancing: compare gradients, per-rank busy time, lost "
        "samples, exchange and planning time.",
        EXAMPLES)
    demo.add_argument("--ranks", type=int, default=4, help="processes (default: %(default)s)")
    demo.add_argument("--steps", type=int, default=3, help="training steps (default: %(default)s)")
    demo.add_argument("--samples-per-rank", type=int, default=16, help="samples per rank (default: %(default)s)")
    demo.add_argument("--dtype", choices=sorted(GRADIENT_TOLERANCE), default="float32",
                      help="parameter dtype (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="data seed (default: %(default)s)")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.set_defaults(handler=run)


def failed_checks(report) -> list[str]:
    """The demo's checks that failed: gradients beyond rounding, samples lost or duplicated."""
    tolerance = GRADIENT_TOLERANCE[report["dtype"]]
    failed = []
    if report["grad_max_rel_diff"] > tolerance:
        failed.append(f"gradients differ by {report['grad_max_rel_diff']:.3g} (relative) > {tolerance:g}")
    if report["samples_lost"] or report["samples_duplicated"]:
        failed.append(f"{report['samples_lost']} samples lost, {report['samples_duplicated']} duplicated")
    return failed


def print_demo(report) -> list[str]:
    """Print the demo report; return the checks that failed."""
    from rich.table import Table

    out = render.console()
    out.print(f"[bold]{report['ranks']} gloo ranks x {report['steps']} steps ({report['dtype']}): the same "
              "batches with and without post-balancing[/bold]")
    table = Table()
    table.add_column("rank", justify="right")
    table.add_column("busy s unbalanced", justify="right")
    table.add_column("busy s balanced", justify="right")
    for rank, (before, after) in enumerate(zip(report["busy_seconds_per_rank_unbalanced"],
                                               report["busy_seconds_per_rank_balanced"])):
        table.add_row(str(rank), f"{before:.3f}", f"{after:.3f}")
    out.print(table)
    tolerance = GRADIENT_TOLERANCE[report["dtype"]]
    failed = failed_checks(report)
    out.print(f"gradients, balanced vs unbalanced: max |diff| {report['grad_max_abs_diff']:.3g}, relative "
              f"{report['grad_max_rel_diff']:.3g} ({'within' if report['grad_max_rel_diff'] <= tolerance else 'ABOVE'} "
              f"{report['dtype']} rounding tolerance {tolerance:g})")
    out.print(f"samples lost {report['samples_lost']}, duplicated {report['samples_duplicated']}")
    out.print(f"slowest rank's busy time / mean: unbalanced {report['busy_max_over_mean_unbalanced']:.3f}, "
              f"balanced {report['busy_max_over_mean_balanced']:.3f}")
    hidden = (f"{report['planning_hidden_fraction']:.1%} hidden by prefetch" if report["steps"] > 1
              else "the first step's plan cannot be prefetched")
    out.print(f"exchange {1e3 * report['exchange_seconds']:.1f} ms, planning {1e3 * report['planning_seconds']:.1f} ms "
              f"({hidden}), overhead {report['overhead_fraction']:.1%} of the balanced step")
    for problem in failed:
        out.print(f"[bold red]check failed:[/bold red] {problem}")
    return failed


def _run_demo():
    """`runtime.demo.run_demo`, or MissingDependencyError when torch is not installed."""
    try:
        from ..runtime.demo import run_demo
    except ImportError as error:
        if importlib.util.find_spec("torch") is not None:
            raise
        raise MissingDependencyError("the demo needs torch: python3.11 -m pip install 'orchmllm[runtime]'") from error
    return run_demo


def run(args) -> int:
    """`orchmllm demo`: train the tiny multimodal model on local gloo ranks with and without balancing."""
    if args.ranks < 1 or args.steps < 1:
        raise UsageError(f"--ranks and --steps must be >= 1; got --ranks {args.ranks} --steps {args.steps}")
    if args.samples_per_rank < 1:
        raise UsageError(f"--samples-per-rank must be >= 1; got {args.samples_per_rank}")
    run_demo = _run_demo()
    with render.progress(not args.json, 1, f"training on {args.ranks} gloo ranks") as advance:
        report = run_demo(ranks=args.ranks, steps=args.steps, seed=args.seed, dtype=args.dtype,
                          samples_per_rank=args.samples_per_rank)
        advance()
    if args.json:
        render.print_json(report)
        return EXIT_FAILED if failed_checks(report) else EXIT_OK
    return EXIT_FAILED if print_demo(report) else EXIT_OK
