"""`orchmllm simulate`: the cluster simulator's strategy table (and plots) for one or more GPU counts."""

from __future__ import annotations

from pathlib import Path

from .arguments import (batch_size, check_file_holds, check_workload_source, degree_list, model_stages, name_list,
                        positive_int, rank_list, strategy_names)
from .errors import UsageError, usage_errors
from .files import check_plot_directory, writing
from .pipeline import run_pipelined
from .render import (print_context_parallel_simulation, print_microbatch_simulation, print_simulation,
                     print_simulation_runs, progress)


def figures(runs, directory: Path) -> list[str]:
    """timeline_none.png / timeline_ours.png of the last run (the same ranks shown in each),
    scaling.png over several runs."""
    from .plots import plot_scaling, plot_step_timeline, timeline_ranks

    last = runs[-1]
    shown = [name for name in ("none", "ours") if name in last.strategies] or list(last.strategies)[:1]
    longest = max(last.strategies[name].compute_seconds for name in shown)
    ranks = timeline_ranks([last.strategies[name].rank_seconds for name in shown])
    written = []
    with writing("--plot", directory):
        for name in shown:
            result = last.strategies[name]
            written.append(plot_step_timeline(
                result.rank_seconds, directory / f"timeline_{name}.png", max_seconds=longest, ranks=ranks,
                title=f"{name}: one step of the {last.model} model on {last.gpus} GPUs "
                      f"(+ {result.exchange_seconds:.3g} s exchanges)"))
        if len(runs) > 1:
            names = list(last.strategies)
            written.append(plot_scaling(
                [run.gpus for run in runs],
                {name: [run.strategies[name].speedup_vs_none for run in runs] for name in names},
                {name: [run.strategies[name].mfu for run in runs] for name in names},
                directory / "scaling.png",
                oom={name: [run.strategies[name].oom for run in runs] for name in names},
                samples_per_rank=[run.samples_per_rank for run in runs],
                title=f"{last.model} model, workload {last.workload!r}"))
    return [str(path) for path in written]


def _flags(args, samples_per_rank) -> dict[str, str]:
    """The options of `simulate` by the name of the simulator's argument they give (`errors.naming_flag`)."""
    return {"samples_per_rank": f"--samples-per-rank {samples_per_rank}",
            "max_tokens_per_microbatch": f"--max-tokens-per-microbatch {args.max_tokens_per_microbatch}",
            "strategy": "--strategies", "workload": f"--workload {args.workload}"}


def run(args) -> int:
    """`orchmllm simulate`: the cluster simulator's strategy table (and plots) for one or more GPU counts."""
    from ..study.simulator import check_simulation, run_simulation

    if args.plot is not None:
        from .plots import require_matplotlib

        require_matplotlib()
    gpus = rank_list(args.gpus, "--gpus")
    if args.plot is not None:
        check_plot_directory(args.plot)
    if args.pipeline_stages is not None:
        return run_pipelined(args, gpus)
    if args.max_tokens_per_microbatch is not None:
        return run_microbatched(args, gpus)
    if args.context_parallel is not None:
        return run_context_parallel(args, gpus)
    strategies = name_list(args.strategies, "--strategies")
    stages = model_stages(args.model)
    available = None if args.workload_file is None else check_workload_source(args, stages)  # bad lines, any --gpus
    for count in gpus:
        if args.samples_per_rank is not None:
            batch_size(count, args.samples_per_rank, "--samples-per-rank")
            check_file_holds(args, count, args.samples_per_rank, available,
                             f"--samples-per-rank {args.samples_per_rank}")
        else:  # the simulator picks samples per rank from its grid: at least one each (probe27 P27-05)
            check_file_holds(args, count, 1, available, f"--workload-file {args.workload_file}")
        with usage_errors(f"--gpus {count}", _flags(args, args.samples_per_rank)):
            check_simulation(model=args.model, gpus=count, workload=args.workload, workload_file=args.workload_file,
                             samples_per_rank=args.samples_per_rank, strategies=strategies)
    runs = []
    with progress(not args.json, len(gpus), "simulating") as advance:
        for count in gpus:
            runs.append(run_simulation(model=args.model, gpus=count, workload=args.workload,
                                       workload_file=args.workload_file, samples_per_rank=args.samples_per_rank,
                                       strategies=strategies, seed=args.seed))
            advance()
    return print_simulation_runs(args, runs, print_simulation,
                                 figures(runs, Path(args.plot)) if args.plot is not None else [])


def run_microbatched(args, gpus: list[int]) -> int:
    """`orchmllm simulate --max-tokens-per-microbatch T`: the micro-batched strategies' table."""
    from ..study.microbatch_sim import (DEFAULT_SAMPLES_PER_RANK, STRATEGIES, check_simulated_samples,
                                        run_microbatch_simulation)

    positive_int(args.max_tokens_per_microbatch, "--max-tokens-per-microbatch")
    positive_int(args.samples_per_rank, "--samples-per-rank")
    model_stages(args.model)
    for option, value in (("--workload-file", args.workload_file), ("--plot", args.plot)):
        if value is not None:
            raise UsageError(f"{option} is not available with --max-tokens-per-microbatch")
    strategies = strategy_names(args.strategies, STRATEGIES, "micro-batch")
    samples = DEFAULT_SAMPLES_PER_RANK if args.samples_per_rank is None else args.samples_per_rank
    for count in gpus:
        batch_size(count, samples, "--samples-per-rank")
        with usage_errors(f"--gpus {count}", _flags(args, samples)):
            check_simulated_samples(count, samples)
    runs = []
    with progress(not args.json, len(gpus), "simulating") as advance:
        for count in gpus:
            with usage_errors(f"--gpus {count}", _flags(args, samples)):
                runs.append(run_microbatch_simulation(args.model, count, max_tokens_per_microbatch=
                                                      args.max_tokens_per_microbatch, workload=args.workload,
                                                      samples_per_rank=samples, strategies=strategies,
                                                      seed=args.seed))
            advance()
    return print_simulation_runs(args, runs, print_microbatch_simulation)


def run_context_parallel(args, gpus: list[int]) -> int:
    """`orchmllm simulate --context-parallel DEGREES`: the context-parallel strategies' table (and cp_work.png)."""
    from ..study.context_parallel_sim import (DEFAULT_SAMPLES_PER_RANK, STRATEGIES,
                                               check_context_parallel_simulation, run_context_parallel_simulation)

    degrees = degree_list(args.context_parallel, "--context-parallel", gpus)
    positive_int(args.samples_per_rank, "--samples-per-rank")
    model_stages(args.model)
    if args.workload_file is not None:
        raise UsageError("--workload-file is not available with --context-parallel")
    strategies = name_list(args.strategies, "--strategies") or list(STRATEGIES)
    samples = DEFAULT_SAMPLES_PER_RANK if args.samples_per_rank is None else args.samples_per_rank
    flags = {**_flags(args, samples), "degrees": f"--context-parallel {args.context_parallel}",
             "strategy": "--strategies"}
    for count in gpus:
        batch_size(count, samples, "--samples-per-rank")
        with usage_errors(f"--gpus {count}", flags):
            check_context_parallel_simulation(args.model, count, args.workload, samples, degrees, strategies)
    runs = []
    with progress(not args.json, len(gpus), "simulating") as advance:
        for count in gpus:
            runs.append(run_context_parallel_simulation(args.model, count, workload=args.workload,
                                                        samples_per_rank=samples, degrees=degrees,
                                                        strategies=strategies, seed=args.seed))
            advance()
    return print_simulation_runs(args, runs, print_context_parallel_simulation,
                                 [context_parallel_figure(runs[-1], Path(args.plot))] if args.plot is not None else [])


def context_parallel_figure(run, directory: Path) -> str:
    """cp_work.png: the LLM stage's per-rank work of the last run under static_cp and ours (those of
    them simulated, else the first strategy) on one time axis, split items drawn as spans over their
    group; the title gives no_split's slowest rank for scale."""
    from .plots import plot_split_work

    shown = [name for name in ("static_cp", "ours") if name in run.strategies] or list(run.strategies)[:1]
    panels = {}
    for name in shown:
        plan = run.strategies[name].llm_plan
        label = name if name != "static_cp" else f"static_cp (degree {run.static_degree})"
        panels[label] = (plan.assignment, plan.degree, plan.item_time * plan.context_parallel.seconds_per_cost)
    today = run.strategies.get("no_split")
    scale = f"\n(no_split's LLM stage: {today.llm_seconds:.3g} s on its slowest rank)" if today is not None else ""
    with writing("--plot", directory):
        return str(plot_split_work(
            panels, run.gpus, directory / "cp_work.png",
            title=f"LLM stage of the {run.model} model on {run.gpus} GPUs, workload {run.workload!r}, degrees "
                  f"{','.join(map(str, run.degrees))}{scale}"))
