"""`orchmllm compare`: every balancer and peer on a workload or a lengths file."""

from __future__ import annotations

from pathlib import Path

from ..balancers import InfeasibleError
from ..study.compare import (BASELINE, LOCALITY_SUFFIX, CompareConfig, compare_microbatches, compare_topology,
                             file_stages, run_comparison, workload_stages)
from ..study.context_parallel_compare import compare_context_parallel
from .arguments import (DEFAULT_BYTES_PER_TOKEN, algorithms as algorithm_names, batch_size, check_time_limit,
                        check_workload_source, degree_list, file_cost, int_list, model_stages, positive_int, rank_list,
                        topology as checked_topology, workload_batch)
from .errors import UsageError, usage_errors
from .files import check_not_input, check_parent, check_plot_directory, load_lengths, write_rows_csv, writing
from .parsers import DEFAULT_MODEL, items_per_rank
from .render import (KEPT_WHOLE, print_compare, print_json, print_microbatch_rows, print_split_rows, print_written,
                     progress)

FIGURES = ("loads.png", "traffic.png", "traffic_locality.png", "cells.png", "cp_work.png")  # what --plot DIR may hold


def check_node_tiling(text: str, degrees: tuple[int, ...], ranks: list[int], gpus_per_node: int) -> None:
    """Degrees no wider than a node must divide it: the peers compared beside ours (static CP, Megatron's dynamic
    CP) lay groups on every aligned block, some of which would straddle nodes (orchmllm's planner uses only the
    blocks inside a node); a degree wider than a node lets every degree's groups cross nodes (`compare_spec`)."""
    for num_ranks in ranks:
        gpus = compare_topology(num_ranks, gpus_per_node).gpus_per_node  # the study's nodes (`compare_spec`)
        straddling = [degree for degree in degrees if gpus % degree] if degrees[-1] <= gpus else []
        if straddling:
            raise UsageError(f"--context-parallel {text}: degree {straddling[0]} does not divide the {gpus} GPUs of a "
                             f"node at -D {num_ranks} (--gpus-per-node {gpus_per_node}), so the peers' aligned groups "
                             f"would straddle nodes (orchmllm's planner alone would keep them inside); use degrees "
                             f"that divide {gpus}, or also list a degree wider than a node, which lets every degree's "
                             f"groups cross nodes")


def configs_of(args, ranks: list[int]) -> tuple[list[CompareConfig], str]:
    """The configurations to compare on, and a description of their source."""
    if args.lengths is not None:
        ignored = [flag for flag, value in (("--model", args.model), ("--items-per-rank", args.items_per_rank))
                   if value is not None]
        if ignored:
            raise UsageError(f"{' and '.join(ignored)} {'apply' if len(ignored) > 1 else 'applies'} to workloads, "
                             f"not --lengths files (a file gives its items; --cost their costs)")
        lengths = load_lengths(args.lengths, args.column)
        cost = file_cost(args.cost, lengths, args.padded)
        bytes_per_token = DEFAULT_BYTES_PER_TOKEN if args.bytes_per_token is None else args.bytes_per_token
        with usage_errors("--bytes-per-token"):
            configs = [CompareConfig(d, None, file_stages(lengths, d, cost, args.padded, bytes_per_token))
                       for d in ranks]
        return configs, f"{args.lengths} ({lengths.size} items)"
    if args.cost is not None or args.padded:
        raise UsageError("--cost and --padded apply to --lengths files; workloads define their own stage costs")
    for option, value in (("--column", args.column), ("--bytes-per-token", args.bytes_per_token)):
        if value is not None:
            raise UsageError(f"{option} applies to --lengths files; workloads define their own items and bytes")
    model = DEFAULT_MODEL if args.model is None else args.model
    stages = model_stages(model)
    available = check_workload_source(args, stages)
    items = int_list(items_per_rank(args), "--items-per-rank")
    for d in ranks:
        for k in items:
            batch_size(d, k, "--items-per-rank")
    given = "" if args.items_per_rank is not None else " (the default)"
    configs = [CompareConfig(d, k, workload_stages(workload_batch(args, d, k, available,
                                                                  f"--items-per-rank {k}{given}"), stages))
               for d in ranks for k in items]
    return configs, f"workload {args.workload_file or args.workload!r} on the {model} model"


def _chosen(summary) -> dict[str, str]:
    """Per stage, the algorithm whose plan the figures show: orchmllm's best (else the best peer, else plugin)."""
    if summary.best is not None:
        return dict(summary.best.algorithms)
    return dict.fromkeys(summary.stages, (summary.best_peer or summary.best_plugin).algorithm)


def figures(comparison, directory: Path) -> list[str]:
    """loads.png (one column per configuration), traffic.png and traffic_locality.png (the last
    configuration's last stage, on one colour scale)."""
    from ..topology import traffic_matrix
    from .plots import plot_rank_load_grid, plot_traffic_heatmap

    columns = {}
    for summary in comparison.summaries:
        chosen = _chosen(summary)
        key = (summary.ranks, summary.items_per_rank)
        columns[f"D={summary.ranks}" + (f", {summary.items_per_rank} items/rank" if summary.items_per_rank else "")] = {
            stage: (comparison.runs[(*key, stage, BASELINE)].plan.loads,
                    comparison.runs[(*key, stage, name)].plan.loads,
                    name) for stage, name in chosen.items()}
    last = comparison.summaries[-1]
    stage_name = last.stages[-1]
    shown = [(_chosen(last)[stage_name], "traffic.png")] + [
        (entry.algorithm + LOCALITY_SUFFIX, "traffic_locality.png") for entry in last.locality[:1]]
    runs = [comparison.runs[(last.ranks, last.items_per_rank, stage_name, name)] for name, _ in shown]
    level = "rank" if runs[0].topology.num_nodes == 1 else "node"  # one node: a single cell at node level
    matrices = [traffic_matrix(run.stage.sources, run.plan.assignment, run.stage.item_bytes, run.topology, level)
                for run in runs]
    top = max(float(matrix.max()) for matrix in matrices)
    with writing("--plot", directory):
        written = [plot_rank_load_grid(columns, directory / "loads.png", labels=("as sampled", "balanced"),
                                             title="Per-rank load before / after balancing")]
        for (name, filename), matrix in zip(shown, matrices):
            written.append(plot_traffic_heatmap(matrix, directory / filename, level=level, max_bytes=top,
                                                      title=f"{stage_name} stage, {name}, D={last.ranks}"))
    return [str(path) for path in written]


def cell_figure(plans, config, directory: Path, whole: str = "") -> str:
    """cells.png: the M × D cell loads of the last configuration as sampled (each rank fills its own
    micro-batches in order) and as ours plans them, on one colour scale; `whole`: a title note (`KEPT_WHOLE`)."""
    from .plots import plot_cell_loads

    key = (config.num_ranks, config.items_per_rank)
    with writing("--plot", directory):
        return str(plot_cell_loads({"as sampled (per-rank fill)": plans[(*key, BASELINE)].cell_loads,
                                          "ours": plans[(*key, "ours")].cell_loads}, directory / "cells.png",
                                         title=f"{config.stages[-1].name} stage, D={config.num_ranks}: cost of every "
                                               f"(micro-batch, rank) cell{whole}"))


def split_figure(plans, config, directory: Path) -> str:
    """cp_work.png: the last configuration's last stage under static_cp and ours, on one cost axis, split
    items drawn as spans over their group."""
    from .plots import plot_split_work

    key = (config.num_ranks, config.items_per_rank)
    panels = {name: (plan.assignment, plan.degree, plan.item_time)
              for name, plan in ((name, plans[(*key, name)]) for name in ("static_cp", "ours"))}
    with writing("--plot", directory):
        return str(plot_split_work(panels, config.num_ranks, directory / "cp_work.png", unit="cost",
                                         title=f"{config.stages[-1].name} stage, D={config.num_ranks}: per-rank "
                                               f"cost with split items"))


def run(args) -> int:
    """`orchmllm compare`: every balancer and peer on a workload or a lengths file."""
    if args.plot is not None:
        from .plots import require_matplotlib

        require_matplotlib()
    check_time_limit(args.time_limit)
    algorithms = algorithm_names(args.algorithms)
    ranks = rank_list(args.ranks, "--ranks")
    for num_ranks in ranks:
        checked_topology(num_ranks, args.gpus_per_node)
    if args.plot is not None:
        check_plot_directory(args.plot)
    if args.csv is not None:
        check_parent("--csv", args.csv, made=args.plot)
        check_not_input("--csv", args.csv, [args.lengths, args.workload_file])
        if args.plot is not None and Path(args.csv).name in FIGURES and \
                Path(args.csv).resolve().parent == Path(args.plot).resolve():
            raise UsageError(f"--csv {args.csv!r} is a figure --plot writes into {args.plot!r}; choose another name")
    degrees = (None if args.context_parallel is None
               else degree_list(args.context_parallel, "--context-parallel", ranks))
    if degrees is not None:
        check_node_tiling(args.context_parallel, degrees, ranks, args.gpus_per_node)
    if degrees is not None and args.lengths is not None and args.cost is None:  # a token is no FLOP
        raise UsageError("--context-parallel with --lengths needs --cost in FLOPs (split times add communication "
                         "seconds at an H100's FLOP rate; the default cost of 1 per token makes every split all "
                         "communication): e.g. --cost 0,6e9,0 for the 6·N FLOPs per token of a 1B-parameter model")
    configs, source = configs_of(args, ranks)
    total = sum(len(config.stages) for config in configs) * (len(algorithms) + 1)
    with progress(not args.json, total, "balancing") as advance:
        comparison = run_comparison(configs, algorithms, gpus_per_node=args.gpus_per_node, time_limit=args.time_limit,
                                    report_not_applicable=args.algorithms is not None, advance=advance)
    microbatches = None
    if args.max_tokens_per_microbatch is not None:
        positive_int(args.max_tokens_per_microbatch, "--max-tokens-per-microbatch")
        with usage_errors("--max-tokens-per-microbatch"):
            try:
                microbatches = compare_microbatches(configs, args.max_tokens_per_microbatch)
            except InfeasibleError as error:
                if degrees is None:
                    raise
                raise InfeasibleError(f"{error} (the micro-batch table keeps every item whole; --context-parallel "
                                      f"splits items in its own table only)", error.min_cap) from None
    split_rows = None
    if degrees is not None:
        with usage_errors("--context-parallel"):
            split_rows, split_plans = compare_context_parallel(configs, degrees, args.gpus_per_node)
    written = []
    whole = "" if degrees is None else KEPT_WHOLE  # beside split items' tables and cp_work.png (probe32 P32-05)
    if args.plot is not None:  # first: --csv may go into it
        with writing("--plot", args.plot) as directory:
            directory.mkdir(exist_ok=True)
    if args.csv is not None:
        write_rows_csv([row.to_json() for row in comparison.rows], args.csv)
        written.append(args.csv)
    if args.plot is not None:
        written += figures(comparison, Path(args.plot))
        if microbatches is not None:
            written.append(cell_figure(microbatches[1], configs[-1], Path(args.plot), whole))
        if split_rows is not None:
            written.append(split_figure(split_plans, configs[-1], Path(args.plot)))
    if args.json:
        extra = {} if microbatches is None else {"microbatches": [row.to_json() for row in microbatches[0]]}
        if split_rows is not None:
            extra["context_parallel"] = [row.to_json() for row in split_rows]
        print_json({"command": "compare", "source": source, **comparison.to_json(), **extra, "files": written})
        return 0
    print_compare(comparison, source)
    if microbatches is not None:
        print_microbatch_rows(microbatches[0], whole)
    if split_rows is not None:
        print_split_rows(split_rows)
    print_written(written)
    return 0
