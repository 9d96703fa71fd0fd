"""PNG figures for `orchmllm compare` and `orchmllm simulate` (matplotlib, an optional extra).

Every function takes plain numbers (numpy arrays, dicts of them) and writes one PNG to
`path`, returning the path.  matplotlib is imported on first use, with the Agg backend,
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
            "plots need matplotlib: python3.11 -m pip install 'orchmllm[plot]' (or matplotlib>=3.7)") from error
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


def plot_rank_loads(stages: Mapping[str, tuple[np.ndarray, np.ndarray]], path, *,
                    labels: tuple[str, str] = ("before", "after"), title: str = "") -> Path:
    """Per-rank load of every stage before and after balancing, as multiples of the mean before.

    `stages` maps a stage name to (loads before, loads after), one value per rank.  Ranks
    are sorted by their load before balancing, so the spread reads at a glance.
    """
    plt = _pyplot()
    names = list(stages)
    if not names:
        raise ValueError("`stages` must name at least one stage")
    figure, axes = plt.subplots(len(names), 1, figsize=(9, 2.4 * len(names) + 0.6), squeeze=False)
    for axis, name in zip(axes[:, 0], names):
        before, after = (np.asarray(loads, dtype=np.float64) for loads in stages[name])
        mean = before.mean() if before.mean() > 0 else 1.0
        order = np.argsort(-before, kind="stable")
        ranks = np.arange(before.size)
        axis.fill_between(ranks, before[order] / mean, step="mid", color="#B0B0B0", alpha=0.8,
                          label=f"{labels[0]} (max {before.max() / mean:.2f}x mean)")
        axis.step(ranks, after[order] / mean, where="mid", color="#C44E52", linewidth=1.4,
                  label=f"{labels[1]} (max {after.max() / mean:.2f}x mean)")
        axis.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
        axis.set_xlim(-0.5, before.size - 0.5)
        axis.set_ylim(0, max(before.max(), after.max()) / mean * 1.08)
        axis.set_ylabel(f"{name}\nload / mean {labels[0]}")
        axis.legend(loc="upper right", fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("rank (sorted by load before balancing)")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_step_timeline(stage_seconds: Mapping[str, np.ndarray], path, *, title: str = "",
                       max_ranks: int = 32, max_seconds: float | None = None) -> Path:
    """Timeline of one step: every stage runs on all ranks, then all wait for the slowest.

    `stage_seconds` maps stage name -> compute seconds per rank, in execution order.  Each
    rank's bar shows its compute (coloured by stage) and its idle time (hatched) until the
    slowest rank finishes that stage.  With more than `max_ranks` ranks, evenly spaced
    ranks are shown plus the slowest one of every stage.  `max_seconds` fixes the time
    axis, so timelines of several strategies compare at a glance.
    """
    plt = _pyplot()
    names = list(stage_seconds)
    if not names:
        raise ValueError("`stage_seconds` must name at least one stage")
    matrix = np.stack([np.asarray(stage_seconds[name], dtype=np.float64) for name in names])
    num_ranks = matrix.shape[1]
    shown = np.arange(num_ranks)
    if num_ranks > max_ranks:
        slowest = np.argmax(matrix, axis=1)
        spaced = np.linspace(0, num_ranks - 1, max_ranks - len(names)).round().astype(np.int64)
        shown = np.unique(np.concatenate((spaced, slowest)))
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
    axis.set_xlabel(f"seconds (step {ends[-1]:.3g} s, {idle:.1%} of rank-time idle)")
    axis.set_ylabel("rank")
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if title:
        axis.set_title(title)
    return _save(figure, path)


def plot_traffic_heatmap(node_bytes: np.ndarray, path, *, title: str = "", level: str = "node") -> Path:
    """Bytes sent from node i (row) to node j (column); the diagonal is traffic within a node.

    `level="rank"` draws a rank x rank matrix instead (useful when everything is one node).
    """
    plt = _pyplot()
    if level not in ("node", "rank"):
        raise ValueError(f"`level` must be 'node' or 'rank'; got {level!r}")
    matrix = np.asarray(node_bytes, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"`node_bytes` must be a square {level}s x {level}s matrix; got shape {matrix.shape}")
    unit, scale = ("GB", 1e9) if matrix.sum() >= 1e9 else ("MB", 1e6)
    figure, axis = plt.subplots(figsize=(6.4, 5.4))
    image = axis.imshow(matrix / scale, cmap="viridis", interpolation="nearest")
    colourbar = figure.colorbar(image, ax=axis)
    colourbar.set_label(f"{unit} sent")
    size = matrix.shape[0]
    ticks = np.arange(size) if size <= 16 else np.unique(np.linspace(0, size - 1, 9).round().astype(int))
    axis.set_xticks(ticks)
    axis.set_yticks(ticks)
    axis.set_xlabel(f"destination {level}")
    axis.set_ylabel(f"source {level}")
    off_diagonal, diagonal = matrix.sum() - np.trace(matrix), np.trace(matrix)
    summary = (f"inter-node {off_diagonal / scale:.3g} {unit}, intra-node {diagonal / scale:.3g} {unit}"
               if level == "node" else f"{off_diagonal / scale:.3g} {unit} moved between ranks")
    axis.set_title((title + "\n" if title else "") + summary, fontsize=10)
    return _save(figure, path)


def plot_scaling(gpus: Sequence[int], speedup: Mapping[str, Sequence[float]],
                 mfu: Mapping[str, Sequence[float]], path, *, oom: Mapping[str, Sequence[bool]] | None = None,
                 highlight: str = "ours", title: str = "") -> Path:
    """Speed-up over no balancing and MFU against GPU count, one line per strategy.

    `oom` marks, per strategy and GPU count, runs that exceed GPU memory (red crosses);
    the `highlight` strategy is drawn thicker.
    """
    plt = _pyplot()
    gpus = np.asarray(gpus, dtype=np.float64)
    colours = plt.get_cmap("tab10")
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    for index, name in enumerate(speedup):
        colour = "black" if name == highlight else colours(index % 10)
        style = dict(marker="o", color=colour, linewidth=2.6 if name == highlight else 1.4)
        left.plot(gpus, np.asarray(speedup[name], dtype=np.float64), label=name, **style)
        right.plot(gpus, 100 * np.asarray(mfu[name], dtype=np.float64), **style)
        failed = np.asarray(oom[name], dtype=bool) if oom is not None and name in oom else np.zeros(gpus.size, bool)
        if failed.any():
            left.plot(gpus[failed], np.asarray(speedup[name], dtype=np.float64)[failed], linestyle="none",
                      marker="x", markersize=11, markeredgewidth=2.2, color="red")
            right.plot(gpus[failed], 100 * np.asarray(mfu[name], dtype=np.float64)[failed], linestyle="none",
                       marker="x", markersize=11, markeredgewidth=2.2, color="red")
    for axis, label in ((left, "speed-up vs no balancing (x)"), (right, "MFU (%)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(gpus, [str(int(g)) for g in gpus])
        axis.minorticks_off()
        axis.set_xlabel("GPUs")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    left.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
    right.set_ylim(bottom=0)
    if oom is not None and any(np.any(np.asarray(flags, dtype=bool)) for flags in oom.values()):
        left.plot([], [], linestyle="none", marker="x", markersize=9, markeredgewidth=2.2, color="red",
                  label="out of memory")
    figure.legend(*left.get_legend_handles_labels(), loc="center left", bbox_to_anchor=(0.99, 0.5),
                  fontsize=8, frameon=False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return _save(figure, path)
