"""What the `orchmllm` command prints: rich tables, progress bars on stderr, JSON on stdout."""

from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager
from functools import cache

import numpy as np

from ..balancers import get_algorithm
from ..study.compare import BASELINE, LOCALITY_SUFFIX, PEER_TIMING, peer_names, ratio


@cache
def _console_class():
    from rich.console import Console

    class PipeConsole(Console):
        """rich's Console, but a reader closing the pipe raises BrokenPipeError (rich exits 1 silently),
        which the command's `main` ends with exit 141."""

        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipeConsole


def console(stderr: bool = False):
    """A rich console on stdout (or stderr); 132 columns when not a terminal, wide enough for the tables."""
    stream = sys.stderr if stderr else sys.stdout
    return _console_class()(stderr=stderr, highlight=False, width=None if stream.isatty() else 132)


@contextmanager
def progress(enabled: bool, total: int, description: str):
    """A rich progress bar on stderr (when enabled and stderr is a terminal); yields advance()."""
    if not enabled or not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json_text(payload, indent: int | None = None) -> str:
    """`payload` as strict JSON (numpy scalars and arrays as numbers and lists); a number JSON has no form for
    (a ratio over a zero bound is inf: `step / LB` of items that are all empty) as null."""
    try:
        return json.dumps(payload, indent=indent, default=_json_default, allow_nan=False)
    except ValueError:  # inf or nan somewhere (else the same error again below)
        return json.dumps(_finite_or_null(payload), indent=indent, default=_json_default, allow_nan=False)


def _finite_or_null(value):
    """`value` with every inf or nan (in dicts, lists, tuples and arrays) replaced by None."""
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_finite_or_null(item) for item in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return None
    return value


def print_json(payload) -> None:
    sys.stdout.write(to_json_text(payload, indent=2) + "\n")


def print_written(paths) -> None:
    for path in paths:
        console().print(f"wrote {path}")


def print_simulation_runs(args, runs, show, written=()) -> int:
    """`orchmllm simulate`'s output, exit 0: the runs and the files written as JSON with --json, else
    `show(runs)`'s table and the files written."""
    if args.json:
        print_json({"command": "simulate", "runs": [run.to_json() for run in runs], "files": list(written)})
        return 0
    show(runs)
    print_written(written)
    return 0


def _config_head(ranks: int, items_per_rank: int | None) -> str:
    return f"D={ranks}" + (f", {items_per_rank} items/rank" if items_per_rank else "")


def _compare_table(comparison, summary, source: str, notes: list[str]):
    from rich.table import Table

    table = Table(title=f"{source}, {_config_head(summary.ranks, summary.items_per_rank)}", title_justify="left",
                  title_style="bold")
    for header in ("stage", "algorithm", "items", "makespan/LB", "max/mean", "speed-up", "ms",
                   "moved GB", "inter-node GB"):
        table.add_column(header, justify="left" if header in ("stage", "algorithm") else "right", no_wrap=True)
    mine = [row for row in comparison.rows
            if row.ranks == summary.ranks and row.items_per_rank == summary.items_per_rank]
    for index, row in enumerate(mine):
        if index and row.stage != mine[index - 1].stage:
            table.add_section()
        name = row.algorithm + (f" ({row.kind})" if row.kind in ("peer", "plugin") else "")
        if "does not divide" in row.mode:
            name += " †"
        cells = [row.status if row.status == "failed" else "n/a"] * 6
        if not row.applies:
            notes.append(f"{row.status}: {row.algorithm} on {row.stage}: {row.note}")
        else:
            timed = "*" if row.timed == PEER_TIMING else ""
            cells = [f"{row.makespan_over_bound:.3f}", f"{row.imbalance:.3f}", f"{row.speedup_vs_none:.2f}x",
                     f"{1e3 * row.solve_seconds:.1f}{timed}", f"{row.bytes_moved / 1e9:.3f}",
                     f"{row.bytes_inter_node / 1e9:.3f}"]
        table.add_row(row.stage, name, str(row.num_items), *cells, style="dim" if row.algorithm == BASELINE else None)
    return table


def print_compare(comparison, source: str) -> None:
    """The tables of `orchmllm compare`, one per configuration, then the before / after summary."""
    out = console()
    notes: list[str] = []
    for summary in comparison.summaries:
        out.print(_compare_table(comparison, summary, source, notes))
    for note in dict.fromkeys(notes):
        out.print(note)
    out.print(f"{BASELINE}: no balancing, every item stays on the rank that sampled it. "
              "makespan/LB: slowest rank's work over a lower bound no plan can beat.")
    fallback = sorted({row.algorithm for row in comparison.rows if "does not divide" in row.mode})
    if fallback:
        out.print(f"†: D does not divide the stage's item count, so {', '.join(fallback)} ran in "
                  "its fallback mode (verl: equal_size=False; LLaVA: strided split).")
    used = [name for name in peer_names() if any(row.algorithm == name for row in comparison.rows)]
    if used:
        out.print("Peers, reimplemented from their published descriptions (ms*: the solve time of our "
                  "reimplementation, not of the peer's own code):")
        for name in used:
            out.print(f"  {name:<22} {get_algorithm(name).description}")
    out.print("\n[bold]Before / after[/bold] (slowest rank's work summed over stages; "
              "each stage waits for its slowest rank):")
    for summary in comparison.summaries:
        before, ideal = summary.work_before, summary.work_ideal
        out.print(f"  {_config_head(summary.ranks, summary.items_per_rank)}: before (as sampled) {before:.4g} = "
                  f"{ratio(before, ideal):.2f}x the lower bound")
        for best, what in ((summary.best, "after"), (summary.best_peer, "best peer"),
                           (summary.best_plugin, "best plugin")):
            if best is not None:
                names = getattr(best, "algorithm", None) or ", ".join(
                    f"{name} on {stage}" for stage, name in best.algorithms.items())
                out.print(f"    {what:<9} {best.work:.4g} = {ratio(best.work, ideal):.2f}x the lower bound "
                          f"-> step [bold]{best.speedup_vs_none:.2f}x[/bold] faster ({names})")
        for entry in summary.locality:
            out.print(f"    {entry.algorithm + LOCALITY_SUFFIX}: work "
                      f"{ratio(entry.work_locality, entry.work) - 1:+.2%} "
                      f"vs {entry.algorithm}, bytes moved {entry.bytes_moved / 1e9:.3g} -> "
                      f"{entry.bytes_moved_locality / 1e9:.3g} GB, across nodes "
                      f"{entry.bytes_inter_node / 1e9:.3g} -> {entry.bytes_inter_node_locality / 1e9:.3g} GB")


MAX_TABLE_RANKS = 64  # rows of `plan`'s table (a row per rank took ~2 ms: half an hour at 2**20 ranks)


def _ranks_shown(loads: np.ndarray) -> np.ndarray:
    """Every rank in order, or beyond MAX_TABLE_RANKS the heaviest and lightest halves, heaviest first."""
    if loads.size <= MAX_TABLE_RANKS:
        return np.arange(loads.size)
    order = np.argsort(-loads, kind="stable")
    return np.concatenate([order[:MAX_TABLE_RANKS // 2], order[-(MAX_TABLE_RANKS // 2):]])


def print_plan(plan, source: str, quiet: bool, kind: str) -> None:
    """Per-rank items, tokens and loads of one plan (unless `quiet`; beyond MAX_TABLE_RANKS ranks the
    heaviest and lightest, `_ranks_shown`), then its summary line; `kind` is the algorithm's (ours, peer,
    baseline, plugin)."""
    from rich.table import Table

    out = console()
    if not quiet:
        name = plan.algorithm + (LOCALITY_SUFFIX if plan.communication_aware else "")
        table = Table(title=f"{source}: {plan.num_items} items on {plan.num_ranks} ranks with {name} ({kind})",
                      title_justify="left")
        for header in ("rank", "items", "tokens", "load", "load / mean"):
            table.add_column(header, justify="right")
        mean = float(plan.loads.mean()) or 1.0
        counts = np.bincount(plan.assignment, minlength=plan.num_ranks)
        for rank in _ranks_shown(plan.loads):
            table.add_row(str(rank), str(counts[rank]), str(plan.tokens[rank]), f"{plan.loads[rank]:.6g}",
                          f"{plan.loads[rank] / mean:.3f}")
        out.print(table)
        if plan.num_ranks > MAX_TABLE_RANKS:
            half = MAX_TABLE_RANKS // 2
            out.print(f"{MAX_TABLE_RANKS} of {plan.num_ranks} ranks shown: the {half} heaviest and the {half} "
                      f"lightest, by load (all of them: --json or -o FILE)")
    out.print(f"makespan {plan.makespan:.6g}, lower bound {plan.lower_bound:.6g} (gap {plan.gap:.2%}), "
              f"status {plan.status}, {1e3 * plan.solve_seconds:.1f} ms, digest {plan.digest()[:16]}")


def _batch_rule(run) -> str:
    """How the run's samples per rank were chosen, for the table title."""
    choice = run.samples_per_rank_choice
    if choice.rule == "explicit":
        return ""
    fits = f"{choice.reference_strategy} fits in {choice.headroom:.0%} of GPU memory, {choice.limit_gib:.0f} GiB"
    return {"memory": f" (largest at which {fits})", "grid end": f" (largest tried; {fits})",
            "over memory at the smallest": f" (smallest tried; {choice.reference_strategy} is over "
                                           f"{choice.limit_gib:.0f} GiB even so)"}[choice.limited_by]


def print_simulation(runs) -> None:
    """The strategy table of the last run, a scaling table over all runs, and the fastest strategy."""
    from rich.table import Table

    out = console()
    last = runs[-1]
    table = Table(title=f"{last.model} model ({last.model_params_billion:.1f}B) on {last.gpus} H100s "
                        f"({last.nodes} nodes), workload {last.workload!r}, "
                        f"{last.samples_per_rank} samples per rank{_batch_rule(last)}", title_justify="left",
                  title_style="bold")
    for header in ("strategy", "step s", "speed-up", "MFU", "exchange s", "plan ms", "overhead", "idle",
                   "a2a", "GiB peak", "OOM"):
        table.add_column(header, justify="left" if header == "strategy" else "right", no_wrap=True)
    for name, result in last.strategies.items():
        table.add_row(name, f"{result.step_seconds:.3f}", f"{result.speedup_vs_none:.2f}x", f"{result.mfu:.1%}",
                      f"{result.exchange_seconds:.3f}", f"{1e3 * result.planning_seconds:.1f}",
                      f"{result.overhead_fraction:.2%}", f"{result.idle_fraction:.1%}", str(result.exchanges_per_step),
                      f"{result.memory_peak_gib:.1f}", "OOM" if result.oom else "",
                      style="bold red" if result.oom else None)
    out.print(table)
    if len(runs) > 1:
        scaling = Table(title="speed-up vs none (MFU) against the GPU count", title_justify="left", title_style="bold")
        scaling.add_column("strategy")
        for run in runs:
            scaling.add_column(f"{run.gpus} GPUs, {run.samples_per_rank}/rank", justify="right")
        for name in last.strategies:
            scaling.add_row(name, *(f"{run.strategies[name].speedup_vs_none:.2f}x ({run.strategies[name].mfu:.1%})"
                                    for run in runs))
        out.print(scaling)
    best = max(last.strategies, key=lambda name: (not last.strategies[name].oom, last.strategies[name].speedup_vs_none))
    result = last.strategies[best]
    if result.oom:  # every strategy: no fastest among those that fit
        remedy = ("more GPUs or shorter samples: one sample per rank is the least" if last.samples_per_rank == 1
                  else "a smaller --samples-per-rank or more GPUs")
        out.print(f"Every strategy runs out of memory at {last.samples_per_rank} samples per rank: no fastest among "
                  f"those that fit; try {remedy}.")
    else:
        out.print(f"Fastest without running out of memory: [bold]{best}[/bold], "
                  f"{result.speedup_vs_none:.2f}x the step of no balancing, MFU {result.mfu:.1%}, "
                  f"overhead {result.overhead_fraction:.2%} of the step.")
    unhidden = [name for name, figures in last.strategies.items()
                if figures.planning_unhidden_seconds > 0.5 * figures.step_seconds]
    if unhidden:  # a step of almost no compute: the speed-ups compare this machine's planning times
        out.print(f"Note: planning, measured on this machine and noisy run to run, is over half of the step of "
                  f"{', '.join(unhidden)}: the compute per step is too small for the speed-ups to measure balance.")


def print_microbatch_simulation(runs) -> None:
    """One table per run of `simulate --max-tokens-per-microbatch`: micro-batches, step, speed-up, MFU."""
    from rich.table import Table

    out = console()
    for run in runs:
        table = Table(title=f"{run.model} model on {run.gpus} H100s ({run.nodes} nodes), workload {run.workload!r}, "
                            f"{run.samples_per_rank} samples per rank in micro-batches of at most "
                            f"{run.max_tokens_per_microbatch} tokens per rank", title_justify="left",
                            title_style="bold")
        for header in ("strategy", "M", "step s", "speed-up", "MFU", "Σ_m max_r / LB", "gather s", "exchange s",
                       "plan ms", "GiB peak", "OOM"):
            table.add_column(header, justify="left" if header == "strategy" else "right", no_wrap=True)
        for name, result in run.strategies.items():
            table.add_row(name, str(result.num_microbatches), f"{result.step_seconds:.3f}",
                          f"{result.speedup_vs_none:.2f}x", f"{result.mfu:.1%}", f"{result.step_cost_over_bound:.4f}",
                          f"{result.param_gather_exposed_seconds:.3f}", f"{result.exchange_seconds:.3f}",
                          f"{1e3 * result.planning_seconds:.1f}", f"{result.memory_peak_gib:.1f}",
                          "OOM" if result.oom else "", style="bold red" if result.oom else None)
        out.print(table)
    out.print("M: micro-batches per rank (the same on every rank); gather s: ZeRO-3 parameter gathers not hidden "
              "behind compute; Σ_m max_r / LB: the step's synchronised cost over its certified lower bound.")


def print_context_parallel_simulation(runs) -> None:
    """One table per run of `simulate --context-parallel`: step, speed-up, LLM / bound, split items,
    exposed context-parallel communication and its bytes."""
    from rich.table import Table

    out = console()
    for run in runs:
        table = Table(title=f"{run.model} model on {run.gpus} H100s ({run.nodes} nodes), workload {run.workload!r}, "
                            f"{run.samples_per_rank} samples per rank, degrees {','.join(map(str, run.degrees))}",
                      title_justify="left", title_style="bold")
        for header in ("strategy", "step s", "vs none", "LLM/LB", "split", "widest", "waves", "CP exp s",
                       "CP TB", "inter", "a2a s", "GiB", "OOM"):
            table.add_column(header, justify="left" if header == "strategy" else "right", no_wrap=True)
        for name, result in run.strategies.items():
            table.add_row(name, f"{result.step_seconds:.2f}", f"{result.speedup_vs_none:.2f}x",
                          f"{result.llm_seconds_over_bound:.3f}", str(result.items_split), str(result.widest_degree),
                          str(result.waves), f"{result.cp_exposed_seconds:.3f}", f"{result.cp_bytes / 1e12:.3g}",
                          f"{result.cp_bytes_inter_node / result.cp_bytes if result.cp_bytes else 0.0:.1%}",
                          f"{result.exchange_seconds:.3f}", f"{result.memory_peak_gib:.1f}",
                          "OOM" if result.oom else "", style="bold red" if result.oom else None)
        out.print(table)
        extras = [f"static_cp at degree {run.static_degree}"] if run.static_degree is not None else []
        extras += [f"Megatron at capacity {run.megatron_capacity} tokens"] if run.megatron_capacity is not None else []
        out.print(f"vs none: speed-up over no balancing; LLM/LB: the LLM stage's time over its certified lower bound "
                  f"({run.llm_lower_bound_seconds:.3f} s); "
                  f"split: items run split; widest: the widest group; waves: Megatron's barriers; CP exp s: ring "
                  f"communication not hidden by attention, on the slowest rank; CP TB: K/V bytes the rings move; "
                  f"inter: their share between nodes; a2a s: the input and embedding exchanges"
                  + (f"; {', '.join(extras)} (each its fastest)." if extras else "."))


def print_split_rows(rows) -> None:
    """The split table of `compare --context-parallel`: step / bound, items split, widest group per algorithm."""
    from rich.table import Table

    out = console()
    table = Table(title=f"{rows[0].stage} stage with giant items splittable over context-parallel groups",
                  title_justify="left", title_style="bold")
    for header in ("D", "items/rank", "algorithm", "setting", "step / LB", "split", "widest", "waves", "ms"):
        table.add_column(header, justify="left" if header in ("algorithm", "setting") else "right", no_wrap=True)
    for row in rows:
        table.add_row(str(row.ranks), str(row.items_per_rank or ""), row.algorithm, row.setting,
                      f"{row.step_cost_over_bound:.4f}", str(row.items_split), str(row.widest_degree), str(row.waves),
                      f"{1e3 * row.solve_seconds:.1f}" + ("*" if row.kind == "peer" else ""))
    out.print(table)
    out.print("step / LB: the stage's step (Megatron: its waves summed) over the certified canonical-allotment bound; "
              "setting: the degree or capacity a peer ran at, its best; "
              "ms*: our reimplementation's time (one setting); "
              "split times take the stage's cost in FLOPs on an H100 at 55 % of peak.")


KEPT_WHOLE = " (items kept whole: no context parallelism)"  # the micro-batch table's and cells.png's, beside splits


def print_microbatch_rows(rows, whole: str = "") -> None:
    """The micro-batch table of `compare --max-tokens-per-microbatch`: M and Σ_m max_r / bound per algorithm;
    `whole`: a title note (`KEPT_WHOLE` with `--context-parallel`)."""
    from rich.table import Table

    out = console()
    table = Table(title=f"{rows[0].stage} stage as micro-batches of at most {rows[0].max_tokens_per_microbatch} "
                        f"tokens per rank{whole}", title_justify="left", title_style="bold")
    for header in ("D", "items/rank", "algorithm", "M", "Σ_m max_r / LB", "ms"):
        table.add_column(header, justify="left" if header == "algorithm" else "right", no_wrap=True)
    for row in rows:
        table.add_row(str(row.ranks), str(row.items_per_rank or ""), row.algorithm, str(row.num_microbatches),
                      f"{row.step_cost_over_bound:.4f}", f"{1e3 * row.solve_seconds:.1f}" + ("*" if row.kind == "peer"
                                                                                           else ""))
    out.print(table)
    out.print("M: micro-batches on every rank; Σ_m max_r / LB: the synchronised step cost over its certified bound; "
              "none: each rank fills its own micro-batches in sampling order; ms*: our reimplementation's time.")
    if all(row.kind != "peer" for row in rows):
        out.print("No peer rows: the reimplemented micro-batch peers do not model padded stages (count · f(max l)).")
