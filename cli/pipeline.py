"""`orchmllm simulate --pipeline-stages P --schedule S`: the pipelined step's strategy table."""

from __future__ import annotations

from .arguments import model_stages, name_list, positive_int
from .errors import UsageError, usage_errors
from .render import console, print_json

DEFAULT_MAX_TOKENS_PER_MICROBATCH = 16384


def run_pipelined(args, gpus: list[int]) -> int:
    """The pipelined strategies' table (or JSON) for each GPU count."""
    from ..balancers import Pipeline
    from ..study.pipeline_sim import DEFAULT_SAMPLES_PER_RANK, STRATEGIES, run_pipeline_simulation

    if args.context_parallel is not None:
        raise UsageError("--context-parallel is not available with --pipeline-stages: split items in a pipeline "
                         "are not modelled yet")
    for option, value in (("--workload-file", args.workload_file), ("--plot", args.plot)):
        if value is not None:
            raise UsageError(f"{option} is not available with --pipeline-stages")
    positive_int(args.samples_per_rank, "--samples-per-rank")
    positive_int(args.max_tokens_per_microbatch, "--max-tokens-per-microbatch")
    model_stages(args.model)
    schedule = args.schedule or "1f1b"
    virtual = (2 if args.virtual_stages is None else args.virtual_stages) if schedule == "interleaved" else 1
    with usage_errors("--pipeline-stages", {"stages": f"--pipeline-stages {args.pipeline_stages}",
                                            "virtual_stages": f"--virtual-stages {virtual}"}):
        pipeline = Pipeline(stages=args.pipeline_stages, schedule=schedule, virtual_stages=virtual)
    strategies = name_list(args.strategies, "--strategies") or STRATEGIES
    unknown = [name for name in strategies if name not in STRATEGIES]
    if unknown:
        raise UsageError(f"unknown pipeline strategy {unknown[0]!r} in --strategies; choose from "
                         f"{', '.join(STRATEGIES)}")
    samples = DEFAULT_SAMPLES_PER_RANK if args.samples_per_rank is None else args.samples_per_rank
    budget = args.max_tokens_per_microbatch or DEFAULT_MAX_TOKENS_PER_MICROBATCH
    flags = {"max_tokens_per_microbatch": f"--max-tokens-per-microbatch {budget}" + (
        " (the default with --pipeline-stages)" if args.max_tokens_per_microbatch is None else ""),
             "samples_per_rank": f"--samples-per-rank {samples}", "workload": f"--workload {args.workload}"}
    runs = []
    for count in gpus:
        with usage_errors(f"--gpus {count}", flags):
            runs.append(run_pipeline_simulation(args.model, count, pipeline=pipeline, max_tokens_per_microbatch=budget,
                                                workload=args.workload, samples_per_rank=samples,
                                                strategies=strategies, seed=args.seed))
    if args.json:
        print_json({"command": "simulate", "runs": [run.to_json() for run in runs], "files": []})
        return 0
    _print(runs)
    return 0


def _print(runs) -> None:
    from rich.table import Table

    out = console()
    for run in runs:
        p = run.pipeline
        table = Table(title=f"{run.model} model on {run.gpus} H100s: {run.replicas} replicas x {p.stages} pipeline "
                            f"stages ({p.schedule}{f', v = {p.virtual_stages}' if p.virtual_stages > 1 else ''}), "
                            f"workload {run.workload!r}, {run.samples_per_rank} samples per replica, micro-batches "
                            f"of at most {run.max_tokens_per_microbatch} tokens", title_justify="left",
                      title_style="bold")
        for header in ("strategy", "M", "step s", "bubble", "speed-up vs ours_unaware"):
            table.add_column(header, justify="left" if header == "strategy" else "right", no_wrap=True)
        for name, result in run.strategies.items():
            table.add_row(name, str(result.num_microbatches), f"{result.step_seconds:.3f}",
                          f"{result.bubble_fraction:.1%}", f"{result.speedup_vs_unaware:.3f}x")
        out.print(table)
    out.print("step s: the slowest replica's schedule; bubble: idle share of all GPUs' step time (fill, drain, "
              "waits, slower replicas); gradient reduction and exchanges left out.")
