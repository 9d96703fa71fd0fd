"""What the `orchmllm` command refuses from its options alone, before the subcommand's module is imported.

`command` runs `precheck(args)` right after parsing: a refusal here costs the interpreter and argparse (~0.1 s
of CPU) where it cost the imports of numpy, scipy and the balancers (~1 s), and for the demo torch too (4-5 s;
issue 24).  A check that needs the solvers' own validation (rank limits, algorithm names, degrees, a workload's
samples) stays in the subcommand's `run`, before any work.
"""

from __future__ import annotations

import os

from .arguments import check_seed, int_list, positive_int, require_file
from .errors import UsageError
from .parsers import MIXED_ONLY, items_per_rank

MAX_SAMPLES_PER_RANK = 1024  # 64 × the default: every sample is drawn and trained on the CPU (16 take minutes)
MAX_SPAWNED_RANKS = 64  # runtime.demo.MAX_SPAWNED_RANKS, whose module imports torch (a test checks they agree)


def precheck(args) -> None:
    """UsageError for what the options of `args.command` alone show wrong."""
    {"compare": _compare, "simulate": _simulate, "demo": _demo, "plan": _plan}[args.command](args)


def _compare(args) -> None:
    int_list(args.ranks, "--ranks")
    check_seed(args.seed)
    int_list(items_per_rank(args), "--items-per-rank")


def _simulate(args) -> None:
    int_list(args.gpus, "--gpus")
    check_seed(args.seed)
    if args.samples_per_rank is not None and args.samples_per_rank < 1:
        raise UsageError(f"--samples-per-rank must be >= 1; got {args.samples_per_rank}")
    needs = {"--schedule": (args.schedule, args.pipeline_stages, "--pipeline-stages"),
             "--virtual-stages": (args.virtual_stages, args.schedule == "interleaved", "--schedule interleaved")}
    for option, (value, given, required) in needs.items():  # an option without the one it applies to: ignored
        if value is not None and not given:
            raise UsageError(f"{option} {value} applies only with {required}")
    if args.pipeline_stages is None and args.max_tokens_per_microbatch is not None and \
            args.context_parallel is not None:
        raise UsageError("--context-parallel is not available with --max-tokens-per-microbatch")


def _plan(args) -> None:
    positive_int(args.ranks, "--ranks")
    require_file(args.lengths, "lengths file")


def _demo(args) -> None:
    if args.ranks < 1 or args.steps < 1:
        raise UsageError(f"--ranks and --steps must be >= 1; got --ranks {args.ranks} --steps {args.steps}")
    if args.samples_per_rank < 1:
        raise UsageError(f"--samples-per-rank must be >= 1; got {args.samples_per_rank}")
    if args.samples_per_rank > MAX_SAMPLES_PER_RANK:
        raise UsageError(f"--samples-per-rank must be at most MAX_SAMPLES_PER_RANK = {MAX_SAMPLES_PER_RANK} (the demo "
                         f"draws and trains every sample on the CPU; the default 16 take minutes); got "
                         f"{args.samples_per_rank}")
    if args.repeats < 1 or args.replay_repeats < 1:
        raise UsageError(f"--repeats and --replay-repeats must be >= 1; got {args.repeats} and {args.replay_repeats}")
    if args.max_tokens_per_microbatch is not None and args.max_tokens_per_microbatch < 1:
        raise UsageError(f"--max-tokens-per-microbatch must be >= 1; got {args.max_tokens_per_microbatch}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be >= 1; got {args.gpus_per_node}")
    check_seed(args.seed)
    if args.workload == "giants":
        _demo_giants(args)
        return
    if args.context_parallel is not None:
        raise UsageError("--context-parallel needs --workload giants")
    if args.gpus_per_node is not None and args.transport != "hierarchical":
        raise UsageError("--gpus-per-node applies only with --transport hierarchical (the flat all-to-all does "
                         "not look at nodes)")
    if "RANK" in os.environ:  # torchrun started the ranks: how many is not the demo's to check
        return
    _spawned_ranks(args, " (start more ranks with torchrun)")
    if args.transport == "hierarchical" and args.gpus_per_node is not None and args.ranks % args.gpus_per_node:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: transport 'hierarchical' needs `gpus_per_node` "
                         f"dividing ranks={args.ranks}; got {args.gpus_per_node}")


def _demo_giants(args) -> None:
    """`--workload giants`: the options it takes."""
    if "RANK" in os.environ:
        raise UsageError("--workload giants spawns its own gloo ranks; run it without torchrun")
    for name in ("max_tokens_per_microbatch", "gpus_per_node"):
        if getattr(args, name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} is not available with --workload giants")
    for name, default in MIXED_ONLY.items():
        if getattr(args, name) != default:
            raise UsageError(f"--{name} {getattr(args, name)} is not available with --workload giants (it runs "
                             f"its own split and unsplit steps)")
    _spawned_ranks(args)


def _spawned_ranks(args, hint: str = "") -> None:
    """The demo spawns its ranks as CPU processes here (the runtime's `check_run` refuses the same, later)."""
    if args.ranks > MAX_SPAWNED_RANKS:
        raise UsageError(f"--ranks must be at most {MAX_SPAWNED_RANKS} spawned CPU processes on this machine; got "
                         f"{args.ranks}{hint}")
