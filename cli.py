"""The `orchmllm` command: compare balancers, simulate a cluster, run the demo, plan a file.

Exit codes scripts can rely on: 0 success; 2 bad input or a missing optional dependency
(a one-line message on stderr names the problem and what to do about it); 1 when the
demo's checks fail, or for a bug in orchmllm itself (then with a traceback); 130
interrupted.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .balancers import ALGORITHMS, CostModel, Kind, algorithms, balance, get_algorithm
from .balancers.identity import home_ranks
from .balancers.validation import is_real
from .study.peers import peer_mode
from .plots import MissingDependencyError, require_matplotlib

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input from the command line or an input file; reported in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (via UsageError) instead of usage + exit."""

    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# ---------------------------------------------------------------- input files


def _parse_length(text: str, where: str) -> int:
    text = text.strip()
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise UsageError(f"{where}: expected an integer length, got {text!r}") from None
        if not math.isfinite(number) or number != math.floor(number):
            raise UsageError(f"{where}: expected an integer length, got {text!r}") from None
        value = int(number)
    if value < 0:
        raise UsageError(f"{where}: lengths must be non-negative, got {value}")
    if value >= 2**53:
        raise UsageError(f"{where}: lengths must be below 2**53, got {value}")
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _pick_column(header: list[str], column: str | None, path: Path) -> int:
    if column is None:
        if len(header) == 1:
            return 0
        raise UsageError(f"{path}: {len(header)} columns {header}; choose one with --column")
    if column not in header:
        raise UsageError(f"{path}: no column {column!r}; columns are {header}")
    return header.index(column)


def _read_csv(path: Path, column: str | None) -> list[int]:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    rows = [(number, row) for number, row in enumerate(rows, start=1) if any(cell.strip() for cell in row)]
    if not rows:
        raise UsageError(f"{path}: no lengths in the file")
    first = [cell.strip() for cell in rows[0][1]]
    has_header = not all(_is_number(cell) for cell in first)
    if has_header:
        index = _pick_column(first, column, path)
        rows = rows[1:]
    elif column is not None:
        raise UsageError(f"{path}: --column {column!r} given but the file has no header line")
    else:
        index = 0
    width = len(first)
    lengths = []
    for number, row in rows:
        if len(row) != width:
            raise UsageError(f"{path}:{number}: expected {width} comma-separated fields, got {len(row)}")
        lengths.append(_parse_length(row[index], f"{path}:{number}"))
    return lengths


def _read_json_lines(path: Path, column: str | None) -> list[int]:
    key = column or "length"
    lengths = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{where}: not valid JSON ({error.msg})") from None
        if isinstance(value, dict):
            if key not in value:
                raise UsageError(f"{where}: object has no key {key!r} (keys: {sorted(value)}); use --column")
            value = value[key]
        if not is_real(value):
            raise UsageError(f"{where}: expected an integer length, got {json.dumps(value)}")
        lengths.append(_parse_length(repr(value), where))
    if not lengths:
        raise UsageError(f"{path}: no lengths in the file")
    return lengths


def _read_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise UsageError(f"{path}: not a plain numeric .npy array ({_one_line(error)})") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1:
        raise UsageError(f"{path}: expected a 1-D array of lengths, got shape {getattr(array, 'shape', '?')}")
    if array.dtype.kind not in "iuf":
        raise UsageError(f"{path}: expected integer lengths, got dtype {array.dtype}")
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0) | (array != np.floor(array)) | (array >= 2.0**53)) \
        if array.dtype.kind == "f" else np.flatnonzero((array < 0) | (array >= 2**53))
    if bad.size:
        raise UsageError(f"{path}: index {bad[0]}: lengths must be non-negative integers below 2**53, "
                         f"got {array[bad[0]]}")
    if array.size == 0:
        raise UsageError(f"{path}: no lengths in the file")
    return array.astype(np.int64)


def load_lengths(path, column: str | None = None) -> np.ndarray:
    """Read item lengths from a .csv, .jsonl/.json (JSON lines) or .npy file, strictly.

    CSV: one integer per line, or a header line and `column` (required when there are
    several columns).  JSON lines: one integer or one object per line, taking key
    `column` (default "length").  .npy: a 1-D integer array, loaded without pickle.
    Raises UsageError naming the file and line of the first bad entry.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"lengths file {str(path)!r} not found")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        if column is not None:
            raise UsageError(f"{path}: --column applies to CSV and JSON lines files, not .npy")
        return _read_npy(path)
    try:
        if suffix == ".csv":
            return np.asarray(_read_csv(path, column), dtype=np.int64)
        if suffix in (".jsonl", ".json", ".ndjson"):
            return np.asarray(_read_json_lines(path, column), dtype=np.int64)
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file") from None
    raise UsageError(f"{path}: unknown file type {suffix!r}; use .csv, .jsonl or .npy")


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{name} must be comma-separated integers, e.g. 64,512; got {text!r}") from None
    if not values:
        raise UsageError(f"{name} must list at least one integer; got {text!r}")
    bad = [value for value in values if value < 1]
    if bad:
        raise UsageError(f"{name} must be >= 1; got {bad[0]}")
    return values


def _check_time_limit(seconds: float | None) -> None:
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"--time-limit must be a positive number of seconds; got {seconds}")


def _cost_model(text: str | None) -> CostModel:
    if text is None:
        return CostModel()
    try:
        per_item, linear, quadratic = (float(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"--cost must be three numbers PER_ITEM,LINEAR,QUADRATIC, e.g. 0,1,0.001; got {text!r}") from None
    try:
        return CostModel(per_item=per_item, linear=linear, quadratic=quadratic)
    except ValueError as error:
        raise UsageError(f"--cost {text!r}: {_one_line(error)}") from None


# ---------------------------------------------------------------- output helpers


def _console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 132  # pipes and files: wide enough for the tables
    return Console(stderr=stderr, highlight=False, width=width)


@contextmanager
def _progress(enabled: bool, total: int, description: str):
    """A rich progress bar on stderr (when enabled and stderr is a terminal); yields advance()."""
    if not enabled or not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _print_json(payload) -> None:
    json.dump(payload, sys.stdout, indent=2, default=_json_default, allow_nan=False)
    sys.stdout.write("\n")


# ---------------------------------------------------------------- compare


@dataclass(frozen=True, eq=False)
class StageItems:
    """The items one stage balances in one step: lengths, the rank that sampled each, costs, bytes."""

    name: str
    lengths: np.ndarray
    sources: np.ndarray
    cost: CostModel
    padded: bool
    item_bytes: np.ndarray


def _file_stages(lengths: np.ndarray, num_ranks: int, cost: CostModel, padded: bool,
                 bytes_per_token: float) -> list[StageItems]:
    sources = home_ranks(lengths.size, num_ranks)
    return [StageItems("items", lengths, sources, cost, padded, lengths * float(bytes_per_token))]


def _model_stages(model: str):
    from .study.models import MODELS

    if model not in MODELS:
        raise UsageError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    return MODELS[model].stages()


def _workload_batch(args, num_ranks: int, samples_per_rank: int):
    from .study.workloads import list_workloads, load_workload_file, sample_workload

    if args.workload_file is not None:
        if not Path(args.workload_file).is_file():
            raise UsageError(f"workload file {args.workload_file!r} not found")
        return load_workload_file(args.workload_file, samples_per_rank, num_ranks)
    if args.workload not in list_workloads():
        raise UsageError(f"unknown workload {args.workload!r}; choose one of {', '.join(list_workloads())} "
                         f"or pass --lengths FILE / --workload-file FILE")
    return sample_workload(args.workload, num_ranks, samples_per_rank, args.seed)


def _workload_stages(batch, stages) -> list[StageItems]:
    """Every stage's items of `batch`; bytes are an item's input (the LLM: text + embeddings it receives)."""
    from .orchestrator.planner import stage_items

    embedding_bytes = np.zeros(len(batch.modalities))
    for stage in stages:
        if not stage.is_llm and stage.modality in batch.modalities:
            embedding_bytes[batch.modalities.index(stage.modality)] = stage.output_bytes_per_token
    received = np.bincount(batch.segment_sample, minlength=batch.num_samples,
                           weights=batch.segment_tokens * embedding_bytes[batch.segment_modality])
    result = []
    for stage in stages:
        item_sample, _, item_length = stage_items(batch, stage)
        item_bytes = (batch.sample_text * stage.input_bytes_per_unit + received if stage.is_llm
                      else item_length * stage.input_bytes_per_unit)
        if item_length.size:
            result.append(StageItems(stage.name, np.asarray(item_length), batch.sample_source[item_sample],
                                     stage.cost, stage.padded, np.asarray(item_bytes, dtype=np.float64)))
    return result


LOCALITY = "+locality"  # suffix: the communication-aware variant of a registered algorithm
BASELINE = "none"  # every item stays on the rank that sampled it


def _peer_names() -> list[str]:
    return [record.name for record in algorithms(kind=Kind.PEER)]


def _algorithm_names(text: str | None) -> list[str]:
    """The algorithm and peer names in `text` (comma-separated), or the default set.

    A registered name with the suffix "+locality" runs communication-aware: within 0.2 % of
    the plain makespan, items stay on their rank, else on their node, as far as possible.
    """
    records = algorithms()
    ours = [record for record in records if record.kind is not Kind.PEER]
    known = ([record.name for record in ours] + [record.name + LOCALITY for record in ours
                                                 if record.kind is not Kind.BASELINE] + _peer_names())
    if text is None:
        plain = [record.name for record in ours if record.default]
        return plain + [f"auto{LOCALITY}"] + [record.name for record in records if record.default
                                              and record.kind is Kind.PEER]
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in known:
            raise UsageError(f"unknown algorithm {name!r}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def _plan_for(name: str, stage: StageItems, num_ranks: int, time_limit: float | None, topology,
              max_tokens_per_rank: int | None = None):
    """The plan of algorithm, peer or baseline `name` for one stage's items."""
    options = dict(cost=stage.cost, padded=stage.padded, time_limit=time_limit,
                   max_tokens_per_rank=max_tokens_per_rank)
    if name == BASELINE:
        return balance(stage.lengths, num_ranks, algorithm="identity", sources=stage.sources, **options)
    if name.endswith(LOCALITY):
        return balance(stage.lengths, num_ranks, algorithm=name.removesuffix(LOCALITY), sources=stage.sources,
                       item_bytes=stage.item_bytes, topology=topology, **options)
    return balance(stage.lengths, num_ranks, algorithm=name, **options)


def _does_not_apply(name: str, padded: bool) -> str:
    """Why algorithm `name` cannot balance a stage of this padding ("" when it can), from its record."""
    return "" if name == BASELINE else get_algorithm(name.removesuffix(LOCALITY)).why_not(padded)


def _topology(num_ranks: int, gpus_per_node: int):
    from .topology import Topology

    try:
        return Topology.for_world_size(num_ranks, gpus_per_node=min(gpus_per_node, num_ranks))
    except ValueError as error:
        raise UsageError(f"--ranks {num_ranks}: {_one_line(error)}; choose D in whole nodes or set "
                         f"--gpus-per-node") from None


def node_traffic_matrix(sources: np.ndarray, destinations: np.ndarray, item_bytes: np.ndarray,
                        gpus_per_node: int, num_nodes: int) -> np.ndarray:
    """Bytes moved from node i to node j (nodes x nodes); items that stay on their rank count nowhere."""
    matrix = np.zeros((num_nodes, num_nodes))
    moved = sources != destinations
    np.add.at(matrix, (sources[moved] // gpus_per_node, destinations[moved] // gpus_per_node), item_bytes[moved])
    return matrix


RESULT_FIELDS = ("makespan", "lower_bound", "makespan_over_bound", "imbalance", "speedup_vs_none",
                 "solve_seconds", "bytes_moved", "bytes_inter_node")


def _compare_rows(configs, algorithms, explicit, args, advance):
    """Run identity (the baseline) and every algorithm on every stage of every configuration."""
    from .topology import traffic

    rows, details, peers = [], {}, _peer_names()
    for num_ranks, items_per_rank, stages in configs:
        topology = _topology(num_ranks, args.gpus_per_node)
        for stage in stages:
            baseline = None
            for name in [BASELINE] + algorithms:
                peer = name in peers
                row = {"ranks": num_ranks, "items_per_rank": items_per_rank, "stage": stage.name,
                       "algorithm": name, "kind": "peer" if peer else "orchmllm",
                       "label": get_algorithm(name).description if peer else "", "num_items": int(stage.lengths.size),
                       "mode": peer_mode(name, stage.lengths.size, num_ranks) if peer else ""}
                reason = _does_not_apply(name, stage.padded)
                if reason:
                    if explicit:
                        rows.append({**row, **dict.fromkeys(RESULT_FIELDS), "status": "n/a", "note": reason})
                    advance()
                    continue
                plan = _plan_for(name, stage, num_ranks, args.time_limit, topology)
                move = traffic(stage.sources, plan.assignment, stage.item_bytes, topology)
                baseline = plan.makespan if baseline is None else baseline
                rows.append({
                    **row, "makespan": plan.makespan, "lower_bound": plan.lower_bound,
                    "makespan_over_bound": _ratio(plan.makespan, plan.lower_bound),
                    "imbalance": plan.imbalance,
                    "speedup_vs_none": _ratio(baseline, plan.makespan),
                    "solve_seconds": plan.solve_seconds, "bytes_moved": move.bytes_moved,
                    "bytes_inter_node": move.bytes_inter_node, "status": str(plan.status), "note": "",
                })
                details[(num_ranks, items_per_rank, stage.name, name)] = (stage, plan, topology)
                advance()
    return rows, details


def _summaries(rows) -> list[dict]:
    """Per configuration: slowest-rank work summed over stages, as sampled vs the best plans.

    "best" takes the best registered algorithm of every stage (stages are balanced
    independently); "best_peer" the peer heuristic whose plans sum lowest over all stages.
    """
    summaries = []
    configs = sorted({(row["ranks"], row["items_per_rank"] or 0) for row in rows})
    for num_ranks, items_per_rank in configs:
        mine = [row for row in rows if row["ranks"] == num_ranks and (row["items_per_rank"] or 0) == items_per_rank
                and row["makespan"] is not None]
        stages = list(dict.fromkeys(row["stage"] for row in mine))
        baseline = {row["stage"]: row for row in mine if row["algorithm"] == BASELINE}
        before = sum(row["makespan"] for row in baseline.values())
        summary = {"ranks": num_ranks, "items_per_rank": items_per_rank or None, "stages": stages,
                   "work_before": before, "work_ideal": sum(row["lower_bound"] for row in baseline.values())}
        ours = [row for row in mine if row["kind"] == "orchmllm" and row["algorithm"] != BASELINE]
        if ours:
            chosen = {stage: min((row for row in ours if row["stage"] == stage),
                                 key=lambda row: (row["makespan"], row["algorithm"]), default=baseline[stage])
                      for stage in stages}
            work = sum(row["makespan"] for row in chosen.values())
            summary["best"] = {"algorithms": {stage: row["algorithm"] for stage, row in chosen.items()},
                               "work": work, "speedup_vs_none": _ratio(before, work)}
        totals = {}
        for name in _peer_names():
            peer_rows = [row for row in mine if row["algorithm"] == name]
            if len(peer_rows) == len(stages):
                totals[name] = sum(row["makespan"] for row in peer_rows)
        if totals:
            name = min(totals, key=lambda n: (totals[n], n))
            summary["best_peer"] = {"algorithm": name, "work": totals[name],
                                    "speedup_vs_none": _ratio(before, totals[name])}
        summary["locality"] = []
        for aware in sorted({row["algorithm"] for row in mine if row["algorithm"].endswith(LOCALITY)}):
            plain = aware.removesuffix(LOCALITY)
            pairs = [[row for row in mine if row["algorithm"] == name] for name in (plain, aware)]
            if len(pairs[0]) == len(pairs[1]) == len(stages):
                entry = {"algorithm": plain}
                for suffix, group in (("", pairs[0]), ("_locality", pairs[1])):
                    for field in ("makespan", "bytes_moved", "bytes_inter_node"):
                        entry[("work" if field == "makespan" else field) + suffix] = sum(row[field] for row in group)
                summary["locality"].append(entry)
        summaries.append(summary)
    return summaries


def _ratio(value: float, reference: float) -> float:
    """value / reference, 1.0 when both are 0 (a step with no work is balanced)."""
    if reference > 0:
        return value / reference
    return 1.0 if value == 0 else math.inf


def _print_compare(rows, summaries, source: str) -> None:
    from rich.table import Table

    console = _console()
    notes = []
    for summary in summaries:
        num_ranks, items_per_rank = summary["ranks"], summary["items_per_rank"]
        head = f"D={num_ranks}" + (f", {items_per_rank} items/rank" if items_per_rank else "")
        table = Table(title=f"{source}, {head}", title_justify="left", title_style="bold")
        for header in ("stage", "algorithm", "items", "makespan/LB", "max/mean", "speed-up", "ms",
                       "moved GB", "inter-node GB"):
            table.add_column(header, justify="left" if header in ("stage", "algorithm") else "right",
                             no_wrap=True)
        mine = [row for row in rows if row["ranks"] == num_ranks and row["items_per_rank"] == items_per_rank]
        for index, row in enumerate(mine):
            if index and row["stage"] != mine[index - 1]["stage"]:
                table.add_section()
            name = row["algorithm"] + (" (peer)" if row["kind"] == "peer" else "")
            if "does not divide" in row["mode"]:
                name += " †"
            cells = ["n/a"] * 6
            if row["makespan"] is None:
                notes.append(f"{row['algorithm']} on {row['stage']}: {row['note']}")
            else:
                cells = [f"{row['makespan_over_bound']:.3f}", f"{row['imbalance']:.3f}",
                         f"{row['speedup_vs_none']:.2f}x", f"{1e3 * row['solve_seconds']:.1f}",
                         f"{row['bytes_moved'] / 1e9:.3f}", f"{row['bytes_inter_node'] / 1e9:.3f}"]
            style = "dim" if row["algorithm"] == BASELINE else None
            table.add_row(row["stage"], name, str(row["num_items"]), *cells, style=style)
        console.print(table)
    for note in dict.fromkeys(notes):
        console.print(f"n/a: {note}")
    console.print(f"{BASELINE}: no balancing, every item stays on the rank that sampled it. "
                  "makespan/LB: slowest rank's work over a lower bound no plan can beat.")
    fallback = sorted({row["algorithm"] for row in rows if "does not divide" in row["mode"]})
    if fallback:
        console.print(f"†: D does not divide the stage's item count, so {', '.join(fallback)} ran in "
                      "its fallback mode (verl: equal_size=False; LLaVA: strided split).")
    used = [name for name in _peer_names() if any(row["algorithm"] == name for row in rows)]
    if used:
        console.print("Peers, reimplemented from their published descriptions (solve times are of these "
                      "reimplementations):")
        for name in used:
            console.print(f"  {name:<22} {get_algorithm(name).description}")
    console.print("\n[bold]Before / after[/bold] (slowest rank's work summed over stages; "
                  "each stage waits for its slowest rank):")
    for summary in summaries:
        head = f"D={summary['ranks']}" + (f", {summary['items_per_rank']} items/rank" if summary["items_per_rank"] else "")
        before, ideal = summary["work_before"], summary["work_ideal"]
        console.print(f"  {head}: before (as sampled) {before:.4g} = {_ratio(before, ideal):.2f}x the lower bound")
        for key, what in (("best", "after"), ("best_peer", "best peer")):
            if key in summary:
                best = summary[key]
                names = best.get("algorithm") or ", ".join(f"{name} on {stage}"
                                                           for stage, name in best["algorithms"].items())
                console.print(f"    {what:<9} {best['work']:.4g} = {_ratio(best['work'], ideal):.2f}x the lower bound "
                              f"-> step [bold]{best['speedup_vs_none']:.2f}x[/bold] faster ({names})")
        for entry in summary["locality"]:
            console.print(f"    {entry['algorithm'] + LOCALITY}: work {_ratio(entry['work_locality'], entry['work']) - 1:+.2%} vs "
                          f"{entry['algorithm']}, bytes moved {entry['bytes_moved'] / 1e9:.3g} -> "
                          f"{entry['bytes_moved_locality'] / 1e9:.3g} GB, across nodes "
                          f"{entry['bytes_inter_node'] / 1e9:.3g} -> {entry['bytes_inter_node_locality'] / 1e9:.3g} GB")


def _write_csv(rows, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _compare_plots(details, summaries, directory: Path) -> list[str]:
    from . import plots

    last = summaries[-1]
    num_ranks, items_per_rank = last["ranks"], last["items_per_rank"]
    chosen = last["best"]["algorithms"] if "best" in last else dict.fromkeys(last["stages"],
                                                                               last["best_peer"]["algorithm"])
    loads = {}
    for stage_name, name in chosen.items():
        _, before, _ = details[(num_ranks, items_per_rank, stage_name, BASELINE)]
        _, after, _ = details[(num_ranks, items_per_rank, stage_name, name)]
        loads[stage_name] = (before.loads, after.loads)
    written = [plots.plot_rank_loads(loads, directory / "loads.png", labels=("as sampled", "balanced"),
                                     title=f"Per-rank load before / after balancing, D={num_ranks} "
                                           f"({', '.join(dict.fromkeys(chosen.values()))})")]
    stage_name = last["stages"][-1]
    shown = [(chosen[stage_name], "traffic.png")] + [
        (entry["algorithm"] + LOCALITY, "traffic_locality.png") for entry in last["locality"][:1]]
    for name, filename in shown:
        stage, plan, topology = details[(num_ranks, items_per_rank, stage_name, name)]
        one_node = topology.num_nodes == 1  # then show ranks: node-level traffic is a single cell
        matrix = node_traffic_matrix(stage.sources, plan.assignment, stage.item_bytes,
                                     1 if one_node else topology.gpus_per_node,
                                     num_ranks if one_node else topology.num_nodes)
        written.append(plots.plot_traffic_heatmap(matrix, directory / filename, level="rank" if one_node else "node",
                                                  title=f"{stage.name} stage, {name}, D={num_ranks}"))
    return [str(path) for path in written]


def cmd_compare(args) -> int:
    """`orchmllm compare`: every balancer and peer on a workload or a lengths file."""
    if args.plot is not None:
        require_matplotlib()
    _check_time_limit(args.time_limit)
    algorithms = _algorithm_names(args.algorithms)
    ranks = _int_list(args.ranks, "--ranks")
    items = _int_list(args.items_per_rank, "--items-per-rank")
    if args.lengths is not None:
        lengths = load_lengths(args.lengths, args.column)
        cost = _cost_model(args.cost)
        source = f"{args.lengths} ({lengths.size} items)"
        configs = [(d, None, _file_stages(lengths, d, cost, args.padded, args.bytes_per_token)) for d in ranks]
    else:
        if args.cost is not None or args.padded:
            raise UsageError("--cost and --padded apply to --lengths files; workloads define their own stage costs")
        source = f"workload {args.workload_file or args.workload!r} on the {args.model} model"
        stages = _model_stages(args.model)
        configs = [(d, k, _workload_stages(_workload_batch(args, d, k), stages)) for d in ranks for k in items]
    for num_ranks, _, _ in configs:
        _topology(num_ranks, args.gpus_per_node)
    total = sum(len(stages) for _, _, stages in configs) * (len(algorithms) + 1)
    with _progress(not args.json, total, "balancing") as advance:
        rows, details = _compare_rows(configs, algorithms, args.algorithms is not None, args, advance)
    summaries = _summaries(rows)
    written = []
    if args.csv is not None:
        _write_csv(rows, Path(args.csv))
        written.append(args.csv)
    if args.plot is not None:
        written += _compare_plots(details, summaries, Path(args.plot))
    if args.json:
        _print_json({"command": "compare", "source": source, "rows": rows, "summary": summaries, "files": written})
        return 0
    _print_compare(rows, summaries, source)
    for path in written:
        _console().print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------- plan


def _plan_payload(plan) -> dict:
    return {"algorithm": plan.algorithm, "num_ranks": plan.num_ranks, "num_items": plan.num_items,
            "padded": plan.padded, "cost": {"per_item": plan.cost.per_item, "linear": plan.cost.linear,
                                            "quadratic": plan.cost.quadratic},
            "makespan": plan.makespan, "lower_bound": plan.lower_bound, "gap": plan.gap,
            "imbalance": plan.imbalance, "status": str(plan.status), "solve_seconds": plan.solve_seconds,
            "digest": plan.digest(), "assignment": plan.assignment, "loads": plan.loads, "tokens": plan.tokens}


def _save_plan(plan, path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv", ".npy"):
        raise UsageError(f"--output {str(path)!r}: unknown file type {suffix!r}; use .json, .csv or .npy")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".npy":
        np.save(path, np.asarray(plan.assignment), allow_pickle=False)
    elif suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["item", "rank"])
            writer.writerows(enumerate(plan.assignment.tolist()))
    else:
        path.write_text(json.dumps(_plan_payload(plan), default=_json_default, allow_nan=False) + "\n")


def cmd_plan(args) -> int:
    """`orchmllm plan`: balance one lengths file and print or save the assignment."""
    from .balancers import InfeasibleError

    _check_time_limit(args.time_limit)
    lengths = load_lengths(args.lengths, args.column)
    name = _algorithm_names(args.algorithm)
    if len(name) != 1:
        raise UsageError(f"--algorithm takes one name; got {args.algorithm!r}")
    if args.ranks < 1:
        raise UsageError(f"--ranks must be >= 1; got {args.ranks}")
    stage = _file_stages(lengths, args.ranks, _cost_model(args.cost), args.padded, args.bytes_per_token)[0]
    topology = _topology(args.ranks, args.gpus_per_node) if name[0].endswith(LOCALITY) else None
    try:
        with _progress(not args.json, 1, f"balancing {lengths.size} items on {args.ranks} ranks") as advance:
            plan = _plan_for(name[0], stage, args.ranks, args.time_limit, topology, args.max_tokens)
            advance()
    except InfeasibleError as error:
        raise UsageError(f"{error} (smallest cap known to be needed: --max-tokens {error.min_cap})") from None
    if args.output is not None:
        _save_plan(plan, Path(args.output))
    if args.json:
        _print_json(_plan_payload(plan))
        return 0
    from rich.table import Table

    console = _console()
    if not args.quiet:
        kind = get_algorithm(name[0].removesuffix(LOCALITY)).kind
        table = Table(title=f"{args.lengths}: {plan.num_items} items on {plan.num_ranks} ranks with {plan.algorithm} "
                            f"({kind})", title_justify="left")
        for header in ("rank", "items", "tokens", "load", "load / mean"):
            table.add_column(header, justify="right")
        mean = float(plan.loads.mean()) or 1.0
        counts = np.bincount(plan.assignment, minlength=plan.num_ranks)
        for rank in range(plan.num_ranks):
            table.add_row(str(rank), str(counts[rank]), str(plan.tokens[rank]), f"{plan.loads[rank]:.6g}",
                          f"{plan.loads[rank] / mean:.3f}")
        console.print(table)
    console.print(f"makespan {plan.makespan:.6g}, lower bound {plan.lower_bound:.6g} (gap {plan.gap:.2%}), "
                  f"status {plan.status}, {1e3 * plan.solve_seconds:.1f} ms, digest {plan.digest()[:16]}")
    if args.output is not None:
        console.print(f"wrote {args.output}")
    return 0


# ---------------------------------------------------------------- simulate


def _simulated_rank_seconds(args, run: dict, strategy: str) -> dict[str, np.ndarray]:
    """Compute seconds per rank of every stage for one strategy of a simulated `run`, as the simulator models them
    (same batch: the run's samples per rank, micro-batch size included)."""
    from .study import simulator
    from .study.models import GPUS, MODELS
    from .study.strategies import STRATEGIES

    topology = simulator.cluster(run["gpus"])
    batch = _workload_batch(args, topology.world_size, run["samples_per_rank"])
    plan = STRATEGIES[strategy].plan(MODELS[args.model].stages(), topology, batch)
    return simulator.stage_rank_seconds(plan, GPUS["h100"], run["strategies"][strategy]["micro_batch_size"])


def _batch_rule(run: dict) -> str:
    """How the run's samples per rank were chosen, for the table title."""
    choice = run["samples_per_rank_choice"]
    if choice["rule"] == "explicit":
        return ""
    fits = (f"{choice['reference_strategy']} fits in {choice['headroom']:.0%} of GPU memory, "
            f"{choice['limit_gib']:.0f} GiB")
    return {"memory": f" (largest at which {fits})", "grid end": f" (largest tried; {fits})",
            "over memory at the smallest": f" (smallest tried; {choice['reference_strategy']} is over "
                                           f"{choice['limit_gib']:.0f} GiB even so)"}[choice["limited_by"]]


def _print_simulation(runs) -> None:
    from rich.table import Table

    console = _console()
    last = runs[-1]
    table = Table(title=f"{last['model']} model ({last['model_params_billion']:.1f}B) on {last['gpus']} H100s "
                        f"({last['nodes']} nodes), workload {last['workload']!r}, "
                        f"{last['samples_per_rank']} samples per rank{_batch_rule(last)}", title_justify="left",
                  title_style="bold")
    for header in ("strategy", "step s", "speed-up", "MFU", "exchange s", "plan ms", "overhead", "idle",
                   "a2a", "GiB peak", "OOM"):
        table.add_column(header, justify="left" if header == "strategy" else "right", no_wrap=True)
    for name, result in last["strategies"].items():
        table.add_row(name, f"{result['step_seconds']:.3f}", f"{result['speedup_vs_none']:.2f}x",
                      f"{result['mfu']:.1%}", f"{result['exchange_seconds']:.3f}",
                      f"{1e3 * result['planning_seconds']:.1f}", f"{result['overhead_fraction']:.2%}",
                      f"{result['idle_fraction']:.1%}", str(result["exchanges_per_step"]),
                      f"{result['memory_peak_gib']:.1f}", "OOM" if result["oom"] else "",
                      style="bold red" if result["oom"] else None)
    console.print(table)
    if len(runs) > 1:
        scaling = Table(title="speed-up vs none (MFU) against the GPU count", title_justify="left", title_style="bold")
        scaling.add_column("strategy")
        for run in runs:
            scaling.add_column(f"{run['gpus']} GPUs", justify="right")
        for name in last["strategies"]:
            scaling.add_row(name, *(f"{run['strategies'][name]['speedup_vs_none']:.2f}x "
                                    f"({run['strategies'][name]['mfu']:.1%})" for run in runs))
        console.print(scaling)
    best = max(last["strategies"], key=lambda name: (not last["strategies"][name]["oom"],
                                                     last["strategies"][name]["speedup_vs_none"]))
    result = last["strategies"][best]
    console.print(f"Fastest without running out of memory: [bold]{best}[/bold], "
                  f"{result['speedup_vs_none']:.2f}x the step of no balancing, MFU {result['mfu']:.1%}, "
                  f"overhead {result['overhead_fraction']:.2%} of the step.")


def cmd_simulate(args) -> int:
    """`orchmllm simulate`: the cluster simulator's strategy table (and plots) for one or more GPU counts."""
    from .study.simulator import run_simulation

    if args.plot is not None:
        require_matplotlib()
    gpus = _int_list(args.gpus, "--gpus")
    strategies = None if args.strategies is None else [part.strip() for part in args.strategies.split(",")
                                                       if part.strip()]
    if args.workload_file is not None and not Path(args.workload_file).is_file():
        raise UsageError(f"workload file {args.workload_file!r} not found")
    _model_stages(args.model)
    runs = []
    with _progress(not args.json, len(gpus), "simulating") as advance:
        for count in gpus:
            runs.append(run_simulation(model=args.model, gpus=count, workload=args.workload,
                                       workload_file=args.workload_file, samples_per_rank=args.samples_per_rank,
                                       strategies=strategies, seed=args.seed))
            advance()
    written = []
    if args.plot is not None:
        from . import plots

        directory = Path(args.plot)
        last = runs[-1]
        shown = [name for name in ("none", "ours") if name in last["strategies"]] or list(last["strategies"])[:1]
        longest = max(last["strategies"][name]["compute_seconds"] for name in shown)
        for name in shown:
            result = last["strategies"][name]
            written.append(plots.plot_step_timeline(
                _simulated_rank_seconds(args, last, name), directory / f"timeline_{name}.png",
                max_seconds=longest, title=f"{name}: one step of the {last['model']} model on {last['gpus']} GPUs "
                                           f"(+ {result['exchange_seconds']:.3g} s exchanges)"))
        if len(runs) > 1:
            names = list(last["strategies"])
            written.append(plots.plot_scaling(
                [run["gpus"] for run in runs],
                {name: [run["strategies"][name]["speedup_vs_none"] for run in runs] for name in names},
                {name: [run["strategies"][name]["mfu"] for run in runs] for name in names},
                directory / "scaling.png",
                oom={name: [run["strategies"][name]["oom"] for run in runs] for name in names},
                title=f"{last['model']} model, workload {last['workload']!r}"))
    if args.json:
        _print_json({"command": "simulate", "runs": runs, "files": [str(path) for path in written]})
        return 0
    _print_simulation(runs)
    for path in written:
        _console().print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------- demo

# Largest relative gradient difference between the balanced and unbalanced runs that is
# still summation-order rounding (sums commute; only their order changes).
GRADIENT_TOLERANCE = {"float32": 1e-6, "float64": 1e-12}  # the equivalence targets


def _print_demo(report) -> list[str]:
    """Print the demo report; return the checks that failed."""
    from rich.table import Table

    console = _console()
    console.print(f"[bold]{report['ranks']} gloo ranks x {report['steps']} steps ({report['dtype']}): the same "
                  "batches with and without post-balancing[/bold]")
    table = Table()
    table.add_column("rank", justify="right")
    table.add_column("busy s unbalanced", justify="right")
    table.add_column("busy s balanced", justify="right")
    for rank, (before, after) in enumerate(zip(report["busy_seconds_per_rank_unbalanced"],
                                               report["busy_seconds_per_rank_balanced"])):
        table.add_row(str(rank), f"{before:.3f}", f"{after:.3f}")
    console.print(table)
    tolerance = GRADIENT_TOLERANCE[report["dtype"]]
    failed = []
    if report["grad_max_rel_diff"] > tolerance:
        failed.append(f"gradients differ by {report['grad_max_rel_diff']:.3g} (relative) > {tolerance:g}")
    if report["samples_lost"] or report["samples_duplicated"]:
        failed.append(f"{report['samples_lost']} samples lost, {report['samples_duplicated']} duplicated")
    console.print(f"gradients, balanced vs unbalanced: max |diff| {report['grad_max_abs_diff']:.3g}, relative "
                  f"{report['grad_max_rel_diff']:.3g} ({'within' if report['grad_max_rel_diff'] <= tolerance else 'ABOVE'} "
                  f"{report['dtype']} rounding tolerance {tolerance:g})")
    console.print(f"samples lost {report['samples_lost']}, duplicated {report['samples_duplicated']}")
    console.print(f"slowest rank's busy time / mean: unbalanced {report['busy_max_over_mean_unbalanced']:.3f}, "
                  f"balanced {report['busy_max_over_mean_balanced']:.3f}")
    hidden = (f"{report['planning_hidden_fraction']:.1%} hidden by prefetch" if report["steps"] > 1
              else "the first step's plan cannot be prefetched")
    console.print(f"exchange {1e3 * report['exchange_seconds']:.1f} ms, planning {1e3 * report['planning_seconds']:.1f} ms "
                  f"({hidden}), overhead {report['overhead_fraction']:.1%} of the balanced step")
    for problem in failed:
        console.print(f"[bold red]check failed:[/bold red] {problem}")
    return failed


def cmd_demo(args) -> int:
    """`orchmllm demo`: train the tiny multimodal model on local gloo ranks with and without balancing."""
    if args.ranks < 1 or args.steps < 1:
        raise UsageError(f"--ranks and --steps must be >= 1; got --ranks {args.ranks} --steps {args.steps}")
    from .runtime.demo import run_demo

    with _progress(not args.json, 1, f"training on {args.ranks} gloo ranks") as advance:
        report = run_demo(ranks=args.ranks, steps=args.steps, seed=args.seed, dtype=args.dtype,
                          samples_per_rank=args.samples_per_rank)
        advance()
    if args.json:
        _print_json(report)
        tolerance = GRADIENT_TOLERANCE[report["dtype"]]
        ok = report["grad_max_rel_diff"] <= tolerance and not (report["samples_lost"] or report["samples_duplicated"])
        return 0 if ok else 1
    return 1 if _print_demo(report) else 0


# ---------------------------------------------------------------- parser and main

COMPARE_EXAMPLES = """examples:
  orchmllm compare                                   # default tri-modal workload, D=64 and 512
  orchmllm compare --ranks 8,64,2560 --items-per-rank 4,16
  orchmllm compare --lengths lengths.csv --ranks 32 --cost 0,1,0.0005
  orchmllm compare --lengths trace.csv --column ContextTokens --ranks 64 --json
  orchmllm compare --algorithms lpt,karmarkar_karp,verl_kk --plot out/ --csv out/compare.csv
"""

SIMULATE_EXAMPLES = """examples:
  orchmllm simulate                                  # 84b model, 2560 GPUs, default workload, batch sized by memory
  orchmllm simulate --model 18b --gpus 64,256,1024 --plot out/
  orchmllm simulate --strategies none,llm_only,ours --samples-per-rank 8 --json
  orchmllm simulate --workload-file samples.jsonl --gpus 64
"""

DEMO_EXAMPLES = """examples:
  orchmllm demo                                      # 4 CPU gloo ranks, 3 steps
  orchmllm demo --ranks 2 --steps 2 --dtype float64 --json
on a GPU cluster, the same training step under torchrun and NCCL:
  torchrun --nproc-per-node 8 -m orchmllm.runtime.demo --json
exit code 1 when a check fails (gradients differ beyond rounding, a sample lost or duplicated)
"""

PLAN_EXAMPLES = """examples:
  orchmllm plan lengths.csv --ranks 8
  orchmllm plan lengths.npy --ranks 64 --algorithm lpt --output plan.json --quiet
  orchmllm plan lengths.jsonl --ranks 16 --padded --max-tokens 65536 --json
  orchmllm plan lengths.csv --ranks 64 --algorithm auto+locality --gpus-per-node 8
"""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the `orchmllm` command and its subcommands."""
    parser = _Parser(prog="orchmllm", description=__doc__.split("\n")[0],
                     epilog="run `orchmllm COMMAND --help` for the options and examples of each command",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"orchmllm {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    compare = commands.add_parser(
        "compare", help="compare every balancer and peers' heuristics on a workload or lengths file",
        description="Balance every stage of a workload (or a file of lengths) with every registered "
                    "algorithm and the peers' heuristics; report makespan against the lower bound, "
                    "solve time and bytes moved within and across nodes.",
        epilog=COMPARE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = compare.add_mutually_exclusive_group()
    from .study.models import list_models
    from .study.strategies import STRATEGIES
    from .study.workloads import list_workloads

    workloads = ", ".join(list_workloads())
    models = ", ".join(list_models())
    source.add_argument("--workload", default="default", help=f"built-in workload: {workloads} "
                                                              "(default: %(default)s)")
    source.add_argument("--workload-file", metavar="FILE",
                        help="JSON lines of multimodal samples, e.g. {\"text\": 212, \"segments\": "
                             "[{\"modality\": \"image\", \"length\": 1024, \"tokens\": 256}]}")
    source.add_argument("--lengths", metavar="FILE", help="lengths file: .csv, .jsonl or .npy (one stage)")
    compare.add_argument("--model", default="84b", help=f"model whose stage costs and bytes a workload uses: "
                                                        f"{models} (default: %(default)s)")
    compare.add_argument("--column", help="CSV column or JSON key holding the lengths (default: the only "
                                          "column / 'length')")
    compare.add_argument("-D", "--ranks", default="64,512", help="comma-separated data-parallel sizes D "
                                                                 "(default: %(default)s)")
    compare.add_argument("--items-per-rank", default="16", help="comma-separated samples per rank, "
                                                                "workloads only (default: %(default)s)")
    compare.add_argument("--algorithms", help="comma-separated algorithms, NAME+locality variants and peers "
                                              "(default: those registered as default, plus auto+locality); "
                                              f"algorithms: {', '.join(ALGORITHMS)}")
    compare.add_argument("--cost", metavar="A,B,C", help="lengths files: cost f(l) = A + B*l + C*l^2 "
                                                         "(default: 0,1,0)")
    compare.add_argument("--padded", action="store_true", help="lengths files: padded rank cost count*f(max l)")
    compare.add_argument("--time-limit", type=float,
                         help="seconds an exact solver may spend per stage; also lets auto finish small "
                              "stages with the ILP (default: none, so auto is deterministic; ilp then uses "
                              "its own default)")
    compare.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default: %(default)s)")
    compare.add_argument("--bytes-per-token", type=float, default=8192.0,
                         help="bytes moved per length unit, for --lengths files (default: %(default)s, "
                              "hidden 4096 in bf16)")
    compare.add_argument("--seed", type=int, default=0, help="workload sampling seed (default: %(default)s)")
    compare.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    compare.add_argument("--csv", metavar="FILE", help="also write one row per run to this CSV file")
    compare.add_argument("--plot", metavar="DIR", help="write loads.png, traffic.png (and traffic_locality.png "
                                                       "with a +locality algorithm) to DIR (needs matplotlib)")
    compare.set_defaults(handler=cmd_compare)

    simulate = commands.add_parser(
        "simulate", help="simulate one training step on a cluster under each balancing strategy",
        description="Model one training step of a multimodal model on H100 nodes for each strategy of the "
                    "OrchMLLM ablations: step time, speed-up, MFU, overhead and memory.\n\nstrategies:\n" +
                    "\n".join(f"  {name:<17} {strategy.description}" for name, strategy in STRATEGIES.items()),
        epilog=SIMULATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    simulate.add_argument("--model", default="84b", help=f"{models} (default: %(default)s)")
    simulate.add_argument("--gpus", default="2560", help="comma-separated GPU counts, nodes of 8 "
                                                         "(default: %(default)s)")
    sim_source = simulate.add_mutually_exclusive_group()
    sim_source.add_argument("--workload", default="default", help=f"built-in workload: {workloads} "
                                                                  "(default: %(default)s)")
    sim_source.add_argument("--workload-file", metavar="FILE", help="JSON lines of multimodal samples")
    simulate.add_argument("--samples-per-rank", type=int, default=None,
                          help="samples per rank (default: sized by memory like a training run: the largest of "
                               "1, 2, 4, 8, ..., 64 at which ours fits in 90%% of GPU memory; every strategy "
                               "then runs that same batch)")
    simulate.add_argument("--strategies", help="comma-separated strategies (default: all; none is always "
                                               "simulated as the reference)")
    simulate.add_argument("--seed", type=int, default=0, help="workload sampling seed (default: %(default)s)")
    simulate.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    simulate.add_argument("--plot", metavar="DIR", help="write timeline_*.png (and scaling.png for several "
                                                        "--gpus) to DIR (needs matplotlib)")
    simulate.set_defaults(handler=cmd_simulate)

    demo = commands.add_parser(
        "demo", help="train a tiny vision+audio+text model on local gloo ranks, balanced and not",
        description="Spawn CPU processes in a gloo group and train the tiny multimodal model on the same "
                    "batches with and without post-balancing: compare gradients, per-rank busy time, lost "
                    "samples, exchange and planning time.",
        epilog=DEMO_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--ranks", type=int, default=4, help="processes (default: %(default)s)")
    demo.add_argument("--steps", type=int, default=3, help="training steps (default: %(default)s)")
    demo.add_argument("--samples-per-rank", type=int, default=16, help="samples per rank (default: %(default)s)")
    demo.add_argument("--dtype", choices=sorted(GRADIENT_TOLERANCE), default="float32",
                      help="parameter dtype (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="data seed (default: %(default)s)")
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.set_defaults(handler=cmd_demo)

    plan = commands.add_parser(
        "plan", help="balance a lengths file and print or save the assignment",
        description="Balance the items of a lengths file over D ranks and print the per-rank loads, "
                    "or save the assignment (item -> rank) for another tool.",
        epilog=PLAN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("lengths", metavar="FILE", help="lengths file: .csv, .jsonl or .npy")
    plan.add_argument("-D", "--ranks", type=int, required=True, help="number of data-parallel ranks")
    plan.add_argument("--algorithm", default="auto" if "auto" in ALGORITHMS else "lpt",
                      help="algorithm or peer name; NAME+locality keeps items near the rank that listed "
                           "them, the file's items being listed rank by rank (default: %(default)s)")
    plan.add_argument("--column", help="CSV column or JSON key holding the lengths")
    plan.add_argument("--cost", metavar="A,B,C", help="cost f(l) = A + B*l + C*l^2 (default: 0,1,0)")
    plan.add_argument("--padded", action="store_true", help="padded rank cost count*f(max l)")
    plan.add_argument("--max-tokens", type=int, help="memory cap: tokens per rank")
    plan.add_argument("--time-limit", type=float, help="seconds an exact solver may spend")
    plan.add_argument("--gpus-per-node", type=int, default=8,
                      help="with a +locality algorithm: GPUs per node (default: %(default)s)")
    plan.add_argument("--bytes-per-token", type=float, default=8192.0,
                      help="with a +locality algorithm: bytes moved per length unit (default: %(default)s)")
    plan.add_argument("--output", "-o", metavar="FILE", help="save the plan: .json (full), .csv (item,rank) "
                                                             "or .npy (assignment)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--quiet", "-q", action="store_true", help="print only the summary line")
    plan.set_defaults(handler=cmd_plan)
    return parser


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def main(argv=None) -> int:
    """Entry point of the `orchmllm` console script; returns the exit code."""
    parser = build_parser()
    command = "orchmllm"
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("choose a command: compare, simulate, demo or plan (see `orchmllm --help`)")
        command = f"orchmllm {args.command}"
        return args.handler(args)
    except (UsageError, ValueError, TypeError, MissingDependencyError) as error:
        print(f"{command}: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
