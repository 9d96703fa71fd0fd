"""PNG figures for `orchmllm compare` and `orchmllm simulate` (matplotlib, an optional extra).

Every `plot_*` function takes plain numbers (numpy arrays, dicts of them) and writes one PNG
to `path`, returning the path; its `*_figure` twin returns the matplotlib Figure instead (what
the tests measure: axis limits, units, text that must not overlap).  Byte counts are in GB, as
the tables print them.  matplotlib is imported on first use, with the Agg backend,
so a solver-only install never needs it; without it the functions raise
`MissingDependencyError` saying how to install it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .errors import MissingDependencyError


STAGE_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3")


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise MissingDependencyError(
            "plots need matplotlib: python3.11 -m pip install 'matplotlib>=3.7'") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def require_matplotlib() -> None:
    """Raise MissingDependencyError now, before any work, when plots cannot be drawn."""
    _pyplot()


def _save(figure, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    figure.clf()
    _pyplot().close(figure)
    return path


def plot_rank_loads(stages: Mapping[str, tuple], path, *,
                    labels: tuple[str, str] = ("before", "after"), title: str = "") -> Path:
    """Per-rank load of every stage before and after balancing (one configuration).

    `stages` maps a stage name to (loads before, loads after[, algorithm]), one value per
    rank; see `plot_rank_load_grid`.
    """
    return plot_rank_load_grid({"": stages}, path, labels=labels, title=title)


def plot_rank_load_grid(columns: Mapping[str, Mapping[str, tuple]], path, *,
                        labels: tuple[str, str] = ("before", "after"), title: str = "") -> Path:
    """`rank_load_grid_figure` written to `path`."""
    return _save(rank_load_grid_figure(columns, labels=labels, title=title), path)


def rank_load_grid_figure(columns: Mapping[str, Mapping[str, tuple]], *,
                          labels: tuple[str, str] = ("before", "after"), title: str = ""):
    """Small multiples: one column per configuration (e.g. "D=64"), one row per stage.

    `columns` maps a column title to {stage name: (loads before, loads after[, algorithm])};
    the algorithm that balanced a panel's plan, when given, names its curve.  Each curve is
    drawn as multiples of its own mean, so "max 1.28x mean" in the legend is the max/mean a
    table reports for that plan.  Ranks are sorted by their load before balancing, so the
    spread reads at a glance.
    """
    plt = _pyplot()
    names = list(dict.fromkeys(name for stages in columns.values() for name in stages))
    if not names:
        raise ValueError("`stages` must name at least one stage")
    figure, axes = plt.subplots(len(names), len(columns), figsize=(max(9, 4.6 * len(columns)), 2.4 * len(names) + 0.8),
                                squeeze=False)
    for column, (heading, stages) in enumerate(columns.items()):
        for row, name in enumerate(names):
            axis = axes[row, column]
            if name not in stages:
                axis.set_axis_off()
                continue
            before, after = (np.asarray(loads, dtype=np.float64) for loads in stages[name][:2])
            before, after = before / _mean_or_one(before), after / _mean_or_one(after)
            balanced = labels[1] if len(stages[name]) < 3 else f"{labels[1]} by {stages[name][2]}"
            order = np.argsort(-before, kind="stable")
            ranks = np.arange(before.size)
            axis.fill_between(ranks, before[order], step="mid", color="#B0B0B0", alpha=0.8,
                              label=f"{labels[0]} (max {_max_over_mean(before):.2f}x mean)")
            axis.step(ranks, after[order], where="mid", color="#C44E52", linewidth=1.4,
                      label=f"{balanced} (max {_max_over_mean(after):.2f}x mean)")
            axis.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
            axis.set_xlim(-0.5, before.size - 0.5)
            _integer_ticks(axis.xaxis)
            axis.set_ylim(0, max(before.max(), after.max(), 1.0) * 1.08)
            if column == 0:
                axis.set_ylabel(f"{name}\nload / its mean")
            if row == 0 and heading:
                axis.set_title(heading, fontsize=10)
            axis.legend(loc="upper right", fontsize=8, frameon=False)
        axes[-1, column].set_xlabel("rank (sorted by load before balancing)")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def _integer_ticks(axis) -> None:
    """Ticks at whole numbers only on `axis` (an x or y axis of ranks or micro-batches): matplotlib's default puts
    a few ranks' axis at -0.5, 0.25, ..., and a reader looks for rank 0.25."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _mean_or_one(values: np.ndarray) -> float:
    mean = float(values.mean()) if values.size else 0.0
    return mean if mean > 0 else 1.0


def _max_over_mean(scaled: np.ndarray) -> float:
    """The max of loads divided by their mean (`_mean_or_one`): 1 where every load is 0, as the tables read an
    empty stage (probe29 P29-04: the legend read "max 0.00x mean")."""
    return float(scaled.max()) if scaled.any() else 1.0


def timeline_ranks(stage_seconds: Sequence[Mapping[str, np.ndarray]], max_ranks: int = 32) -> np.ndarray:
    """The ranks that timelines of several strategies all show: every rank when there are at
    most `max_ranks`, else evenly spaced ranks plus the slowest rank of every stage of every
    strategy (so their timelines show the same, labelled subset)."""
    matrices = [np.stack([np.asarray(seconds[name], dtype=np.float64) for name in seconds])
                for seconds in stage_seconds]
    num_ranks = matrices[0].shape[1]
    if num_ranks <= max_ranks:
        return np.arange(num_ranks)
    slowest = np.unique(np.concatenate([np.argmax(matrix, axis=1) for matrix in matrices]))
    spaced = np.linspace(0, num_ranks - 1, max(max_ranks - slowest.size, 2)).round().astype(np.int64)
    return np.unique(np.concatenate((spaced, slowest)))


def plot_step_timeline(stage_seconds: Mapping[str, np.ndarray], path, *, title: str = "",
                       max_ranks: int = 32, max_seconds: float | None = None, ranks=None) -> Path:
    """`step_timeline_figure` written to `path`."""
    return _save(step_timeline_figure(stage_seconds, title=title, max_ranks=max_ranks, max_seconds=max_seconds,
                                      ranks=ranks), path)


def step_timeline_figure(stage_seconds: Mapping[str, np.ndarray], *, title: str = "", max_ranks: int = 32,
                         max_seconds: float | None = None, ranks=None):
    """Timeline of one step: every stage runs on all ranks, then all wait for the slowest.

    `stage_seconds` maps stage name -> compute seconds per rank, in execution order.  Each
    rank's bar shows its compute (coloured by stage) and its idle time (hatched) until the
    slowest rank finishes that stage.  `ranks` chooses the ranks shown (default
    `timeline_ranks([stage_seconds], max_ranks)`; pass the same to timelines that should
    compare); the axis says which subset it is.  `max_seconds` fixes the time axis, so
    timelines of several strategies compare at a glance.
    """
    plt = _pyplot()
    names = list(stage_seconds)
    if not names:
        raise ValueError("`stage_seconds` must name at least one stage")
    matrix = np.stack([np.asarray(stage_seconds[name], dtype=np.float64) for name in names])
    num_ranks = matrix.shape[1]
    shown = timeline_ranks([stage_seconds], max_ranks) if ranks is None else np.asarray(ranks, dtype=np.int64)
    ends = np.concatenate(([0.0], np.cumsum(matrix.max(axis=1))))
    figure, axis = plt.subplots(figsize=(10, 0.22 * shown.size + 1.6))
    for row, rank in enumerate(shown):
        for stage, name in enumerate(names):
            busy = matrix[stage, rank]
            colour = STAGE_COLOURS[stage % len(STAGE_COLOURS)]
            axis.broken_barh([(ends[stage], busy)], (row - 0.4, 0.8), color=colour,
                             label=name if row == 0 else None)
            axis.broken_barh([(ends[stage] + busy, ends[stage + 1] - ends[stage] - busy)], (row - 0.4, 0.8),
                             facecolor="white", edgecolor="#999999", hatch="///", linewidth=0.0,
                             label="idle" if row == 0 and stage == 0 else None)
    idle = 1.0 - matrix.sum() / (ends[-1] * num_ranks) if ends[-1] > 0 else 0.0
    axis.set_yticks(np.arange(shown.size), [str(rank) for rank in shown], fontsize=7)
    axis.set_ylim(-0.6, shown.size - 0.4)
    axis.invert_yaxis()
    limit = max(ends[-1], max_seconds or 0.0)
    axis.set_xlim(0, limit * 1.01 if limit > 0 else 1.0)
    axis.set_xlabel(f"seconds (step {ends[-1]:.3g} s, {idle:.1%} of rank-time idle, all {num_ranks} ranks)")
    axis.set_ylabel("rank" if shown.size == num_ranks else
                    f"rank ({shown.size} of {num_ranks} shown: evenly spaced\nand the slowest of each stage)")
    handles = dict(zip(*reversed(axis.get_legend_handles_labels())))  # the stages in order, then idle
    axis.legend([handles[name] for name in (*names, "idle")], [*names, "idle"], loc="upper left",
                bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if title:
        axis.set_title(title)
    return figure


def plot_traffic_heatmap(node_bytes: np.ndarray, path, *, title: str = "", level: str = "node",
                         max_bytes: float | None = None) -> Path:
    """`traffic_heatmap_figure` written to `path`."""
    return _save(traffic_heatmap_figure(node_bytes, title=title, level=level, max_bytes=max_bytes), path)


def regular_ticks(size: int, most: int = 8) -> np.ndarray:
    """Indices 0..size-1 at one round step (1, 2, 4, 5, 8, 10, 16, 20, ...), at most `most` of them.

    >>> regular_ticks(8).tolist(), regular_ticks(64).tolist(), regular_ticks(320).tolist()[-1]
    ([0, 1, 2, 3, 4, 5, 6, 7], [0, 8, 16, 24, 32, 40, 48, 56], 300)
    """
    steps = sorted({m * 10 ** k for m in (1, 2, 5) for k in range(19)} | {2 ** k for k in range(63)})
    step = next(step for step in steps if -(-size // step) <= most)
    return np.arange(0, size, step)


def traffic_heatmap_figure(node_bytes: np.ndarray, *, title: str = "", level: str = "node",
                           max_bytes: float | None = None):
    """Bytes sent from node i (row) to node j (column); the diagonal is traffic within a node.

    `level="rank"` draws a rank x rank matrix instead (useful when everything is one node).
    The colour scale starts at 0 and ends at `max_bytes` (default: the largest cell): give
    several heat maps the same `max_bytes` and their colours compare.
    """
    plt = _pyplot()
    if level not in ("node", "rank"):
        raise ValueError(f"`level` must be 'node' or 'rank'; got {level!r}")
    matrix = np.asarray(node_bytes, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"`node_bytes` must be a square {level}s x {level}s matrix; got shape {matrix.shape}")
    top = float(matrix.max()) if max_bytes is None else float(max_bytes)
    figure, axis = plt.subplots(figsize=(6.4, 5.4))
    image = axis.imshow(matrix / 1e9, cmap="viridis", interpolation="nearest", vmin=0.0,
                        vmax=top / 1e9 if top > 0 else 1.0)
    colourbar = figure.colorbar(image, ax=axis)
    colourbar.set_label(f"GB sent by a source {level} to a destination {level}")
    ticks = regular_ticks(matrix.shape[0])
    axis.set_xticks(ticks)
    axis.set_yticks(ticks)
    axis.set_xlabel(f"destination {level}")
    axis.set_ylabel(f"source {level}")
    off_diagonal, diagonal = matrix.sum() - np.trace(matrix), np.trace(matrix)
    summary = (f"inter-node {off_diagonal / 1e9:.3f} GB, intra-node {diagonal / 1e9:.3f} GB"
               if level == "node" else f"{off_diagonal / 1e9:.3f} GB moved between ranks")
    axis.set_title((title + "\n" if title else "") + summary, fontsize=10)
    return figure


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
LINE_STYLES = ("-", "--", "-.", ":")
DODGE_OCTAVES = 0.06  # sideways offset between neighbouring strategies' lines, in octaves of the GPU axis


def plot_scaling(gpus: Sequence[int], speedup: Mapping[str, Sequence[float]],
                 mfu: Mapping[str, Sequence[float]], path, *, oom: Mapping[str, Sequence[bool]] | None = None,
                 highlight: str = "ours", title: str = "", samples_per_rank: Sequence[int] | None = None) -> Path:
    """`scaling_figure` written to `path`."""
    return _save(scaling_figure(gpus, speedup, mfu, oom=oom, highlight=highlight, title=title,
                                samples_per_rank=samples_per_rank), path)


def scaling_figure(gpus: Sequence[int], speedup: Mapping[str, Sequence[float]], mfu: Mapping[str, Sequence[float]],
                   *, oom: Mapping[str, Sequence[bool]] | None = None, highlight: str = "ours", title: str = "",
                   samples_per_rank: Sequence[int] | None = None):
    """Speed-up over no balancing and MFU against GPU count, one line per strategy.

    Every strategy has its own colour, marker and dash, hollow markers of decreasing size,
    and a small sideways offset, so strategies that coincide stay visible side by side;
    `highlight` is drawn thicker, beneath the others.  `oom` marks, per strategy and GPU count, runs that
    exceed GPU memory (red crosses).  `samples_per_rank` (one per GPU count) labels the
    x axis with the batch each run used, which may change with the GPU count.  Both axes start
    at 0, so a line's height is proportional to its speed-up or MFU.
    """
    plt = _pyplot()
    gpus = np.asarray(gpus, dtype=np.float64)
    colours = plt.get_cmap("tab10")
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for index, name in enumerate(speedup):
        x = gpus * 2.0 ** (DODGE_OCTAVES * (index - (len(speedup) - 1) / 2))
        mine = name == highlight
        style = dict(color="black" if mine else colours(index % 10), marker=MARKERS[index % len(MARKERS)],
                     linestyle=LINE_STYLES[index % len(LINE_STYLES)], markersize=max(12 - 0.8 * index, 4),
                     fillstyle="full" if mine else "none", markeredgewidth=1.4, linewidth=3.2 if mine else 1.3,
                     zorder=1 if mine else 2,
                     alpha=0.55 if mine else 1.0)
        left.plot(x, np.asarray(speedup[name], dtype=np.float64), label=name, **style)
        right.plot(x, 100 * np.asarray(mfu[name], dtype=np.float64), **style)
        failed = np.asarray(oom[name], dtype=bool) if oom is not None and name in oom else np.zeros(gpus.size, bool)
        if failed.any():
            left.plot(x[failed], np.asarray(speedup[name], dtype=np.float64)[failed], linestyle="none",
                      marker="x", markersize=11, markeredgewidth=2.2, color="red", zorder=3)
            right.plot(x[failed], 100 * np.asarray(mfu[name], dtype=np.float64)[failed], linestyle="none",
                       marker="x", markersize=11, markeredgewidth=2.2, color="red", zorder=3)
    ticks, xlabel = [str(int(g)) for g in gpus], "GPUs (lines slightly offset sideways to keep them apart)"
    if samples_per_rank is not None:
        ticks = [f"{tick}\n{count}/rank" for tick, count in zip(ticks, samples_per_rank)]
        xlabel = ("GPUs, samples per rank (the same at every count)" if len(set(samples_per_rank)) == 1 else
                  "GPUs, samples per rank (the batch per rank changes with the GPU count)")
    for axis, label in ((left, "speed-up vs no balancing (x)"), (right, "MFU (%)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(gpus, ticks)
        axis.minorticks_off()
        axis.set_xlabel(xlabel)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    left.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
    left.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    if oom is not None and any(np.any(np.asarray(flags, dtype=bool)) for flags in oom.values()):
        left.plot([], [], linestyle="none", marker="x", markersize=9, markeredgewidth=2.2, color="red",
                  label="out of memory")
    figure.legend(*left.get_legend_handles_labels(), loc="center left", bbox_to_anchor=(0.99, 0.5),
                  fontsize=8, frameon=False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_cell_loads(panels: Mapping[str, np.ndarray], path, *, title: str = "") -> Path:
    """`cell_loads_figure` written to `path`."""
    return _save(cell_loads_figure(panels, title=title), path)


def cell_loads_figure(panels: Mapping[str, np.ndarray], *, title: str = ""):
    """Heat maps of (micro-batch × rank) cell costs, one panel per plan, on one colour scale from 0
    (one colour bar, its unit a power of ten named in its label); each row's max is what the
    synchronised micro-batch costs."""
    plt = _pyplot()
    top = max(float(loads.max()) for loads in panels.values()) or 1.0
    scale, unit = _power_of_ten(top)
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) + 1, 4.4), squeeze=False,
                                layout="constrained")
    for axis, (label, loads) in zip(axes[0], panels.items()):
        image = axis.imshow(loads / scale, aspect="auto", cmap="viridis", vmin=0.0, vmax=top / scale,
                            interpolation="nearest")
        step = float(loads.max(axis=1).sum())
        axis.set_title(f"{label}\nM={loads.shape[0]}, step cost Σ_m max_r = {step / scale:#.3g}{unit}", fontsize=10)
        axis.set_xlabel("rank")
        axis.set_ylabel("micro-batch")
        axis.set_yticks(range(loads.shape[0]))
        _integer_ticks(axis.xaxis)
    figure.colorbar(image, ax=axes[0].tolist(), label=f"cell cost{unit}")
    if title:
        figure.suptitle(title)
    return figure


def _power_of_ten(top: float) -> tuple[float, str]:
    """10**e for e = floor(log10(top)), the scale a figure divides its values by, and the label suffix naming it
    ('' for e = 0): the unit in the labels, not matplotlib's offset text ('1e16') over a panel's title."""
    exponent = int(np.floor(np.log10(top))) if top > 0 else 0
    return 10.0 ** exponent, rf" ($\times 10^{{{exponent}}}$)" if exponent else ""


DEGREE_COLOURS = {2: "#DD8452", 4: "#C44E52", 8: "#8172B3", 16: "#937860", 32: "#DA8BC3"}


def split_window(start: np.ndarray, degree: np.ndarray, seconds: np.ndarray, num_ranks: int,
                 max_ranks: int = 32) -> tuple[int, int]:
    """[first, last) ranks a split-work plot shows: all when there are at most `max_ranks`, else the
    aligned window of `max_ranks` (at least the widest degree) that holds the slowest rank."""
    width = max(max_ranks, int(degree.max(initial=1)))
    if num_ranks <= width:
        return 0, num_ranks
    first = int(np.argmax(_rank_loads(start, degree, seconds, num_ranks))) // width * width
    return first, min(first + width, num_ranks)


def _split_arrays(start, degree, seconds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A split-work panel's (block start, degree, time) as int64, int64 and float64 arrays."""
    return (np.asarray(start, dtype=np.int64), np.asarray(degree, dtype=np.int64),
            np.asarray(seconds, dtype=np.float64))


def _rank_loads(start: np.ndarray, degree: np.ndarray, seconds: np.ndarray, num_ranks: int) -> np.ndarray:
    """Every rank's time: each item's on every rank of its block."""
    ranks = np.repeat(start, degree) + np.arange(degree.sum()) - np.repeat(np.cumsum(degree) - degree, degree)
    return np.bincount(ranks, weights=np.repeat(seconds, degree), minlength=num_ranks)


def plot_split_work(panels: Mapping[str, tuple], num_ranks: int, path, *, title: str = "", max_ranks: int = 32,
                    unit: str = "seconds") -> Path:
    """`split_work_figure` written to `path`."""
    return _save(split_work_figure(panels, num_ranks, title=title, max_ranks=max_ranks, unit=unit), path)


def split_work_figure(panels: Mapping[str, tuple], num_ranks: int, *, title: str = "", max_ranks: int = 32,
                      unit: str = "seconds"):
    """Per-rank work of split plans, one panel per plan on one time axis: a split item is one box
    spanning the ranks of its group (at the time each of them spends on it), whole items are
    stacked above on their rank.

    `panels` maps a label to (block start, degree, time per rank in `unit`) of every item.  The ranks
    shown are the same in every panel (`split_window`: around the last panel's slowest rank); the
    dashed line is each plan's slowest rank over all `num_ranks` ranks, which may lie outside the
    window.  A unit other than seconds (model costs, ~1e16) is scaled by a power of ten its label names.
    """
    plt = _pyplot()
    panels = {label: _split_arrays(*panel) for label, panel in panels.items()}
    first, last = split_window(*list(panels.values())[-1], num_ranks, max_ranks)
    top = max(float(_rank_loads(*panel, num_ranks).max(initial=0.0)) for panel in panels.values())
    scale, suffix = (1.0, "") if unit == "seconds" else _power_of_ten(top)
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, 2.8 * len(panels) + 0.9), sharex=True, sharey=True,
                                squeeze=False, layout="constrained")
    for axis, (label, (start, degree, seconds)) in zip(axes[:, 0], panels.items()):
        _draw_split_work(axis, start, degree, seconds / scale, num_ranks, first, last,
                         " s" if unit == "seconds" else suffix)
        axis.set_title(f"{label}: {int((degree > 1).sum())} items split", fontsize=10, loc="left")
        axis.set_ylabel(f"{unit}{suffix}")
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    axes[-1, 0].set_xlim(first - 0.6, last - 0.4)
    _integer_ticks(axes[-1, 0].xaxis)
    axes[-1, 0].set_xlabel("rank" if last - first == num_ranks else
                           f"rank ({last - first} of {num_ranks} shown: ranks {first}-{last - 1}, the window "
                           f"holding the slowest rank of {list(panels)[-1]})")
    if title:
        figure.suptitle(title)
    return figure


def _draw_split_work(axis, start, degree, seconds, num_ranks: int, first: int, last: int, value_unit: str) -> None:
    """One panel of `split_work_figure`: split boxes at the bottom of their group, whole items above
    (`value_unit` follows the slowest rank's figure in the legend)."""
    from matplotlib.patches import Rectangle

    ends = start + degree
    loads = _rank_loads(start, degree, seconds, num_ranks)
    base = np.zeros(num_ranks)
    seen = set()
    for item in np.flatnonzero((degree > 1) & (start < last) & (ends > first)):
        s, c = int(start[item]), int(degree[item])
        bottom = base[s]
        colour = DEGREE_COLOURS.get(c, "#777777")
        axis.add_patch(Rectangle((s - 0.4, bottom), c - 0.2, seconds[item], facecolor=colour, edgecolor="black",
                                 linewidth=0.6, label=None if c in seen else f"one item split over {c} ranks"))
        seen.add(c)
        base[s:s + c] += seconds[item]
    whole = np.flatnonzero((degree == 1) & (start >= first) & (start < last))
    whole = whole[np.argsort(start[whole], kind="stable")]
    if whole.size:
        ranks = start[whole]
        cumulative = np.cumsum(seconds[whole]) - seconds[whole]
        bottoms = base[ranks] + cumulative - cumulative[np.searchsorted(ranks, ranks)]
        axis.bar(ranks, seconds[whole], bottom=bottoms, width=0.8, color=STAGE_COLOURS[0], edgecolor="white",
                 linewidth=0.3, label="whole items (one box each)")
    makespan = float(loads.max())
    axis.axhline(makespan, color="black", linestyle="--", linewidth=0.8,
                 label=f"slowest rank of all {num_ranks}: {makespan:.3g}{value_unit} (rank {int(np.argmax(loads))})")
    axis.set_ylim(0, max(axis.get_ylim()[1], makespan * 1.05))
