"""orchmllm.cli.plots: every figure is a readable, non-blank PNG; bad input and missing matplotlib are named."""

import re
import sys

import numpy as np
import pytest

from orchmllm.cli import plots

image = pytest.importorskip("matplotlib.image")


def check_png(path):
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    pixels = image.imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) > 100 and pixels[..., :3].std() > 0.05


def test_rank_loads(tmp_path):
    rng = np.random.default_rng(0)
    stages = {name: (rng.lognormal(0, 0.5, 64), np.full(64, 1.0) + rng.normal(0, 0.01, 64))
              for name in ("image encoder", "llm")}
    check_png(plots.plot_rank_loads(stages, tmp_path / "loads.png", labels=("as sampled", "lpt"), title="t"))


@pytest.mark.parametrize("num_ranks", [4, 300], ids=["all ranks", "sampled ranks"])
def test_step_timeline(tmp_path, num_ranks):
    rng = np.random.default_rng(1)
    stages = {"vision": rng.uniform(1, 3, num_ranks), "audio": rng.uniform(0, 1, num_ranks),
              "llm": rng.uniform(5, 9, num_ranks)}
    check_png(plots.plot_step_timeline(stages, tmp_path / "timeline.png", title="one step", max_seconds=20.0))


@pytest.mark.parametrize("level,size", [("node", 8), ("node", 64), ("rank", 8)])
def test_traffic_heatmap(tmp_path, level, size):
    matrix = np.random.default_rng(2).uniform(0, 2e9, (size, size))
    check_png(plots.plot_traffic_heatmap(matrix, tmp_path / "traffic.png", title="llm", level=level))


def test_scaling(tmp_path):
    gpus = [64, 256, 2560]
    speedup = {"none": [1, 1, 1], "ours": [1.9, 2.0, 2.2], "allgather": [1.8, 1.7, 1.5]}
    mfu = {"none": [0.2, 0.2, 0.19], "ours": [0.41, 0.41, 0.41], "allgather": [0.38, 0.36, 0.3]}
    oom = {"none": [True, False, True], "ours": [False] * 3, "allgather": [False, False, True]}
    check_png(plots.plot_scaling(gpus, speedup, mfu, tmp_path / "nested" / "scaling.png", oom=oom, title="84b"))


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="`node_bytes` must be a square nodes x nodes matrix; got shape"):
        plots.plot_traffic_heatmap(np.zeros((2, 3)), tmp_path / "x.png")
    with pytest.raises(ValueError, match="`level` must be 'node' or 'rank'; got 'gpu'"):
        plots.plot_traffic_heatmap(np.zeros((2, 2)), tmp_path / "x.png", level="gpu")
    with pytest.raises(ValueError, match="`stages` must name at least one stage"):
        plots.plot_rank_loads({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="`stage_seconds` must name at least one stage"):
        plots.plot_step_timeline({}, tmp_path / "x.png")


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails as where it is not installed
    with pytest.raises(plots.MissingDependencyError, match=re.escape("pip install 'matplotlib>=3.7'")):
        plots.plot_traffic_heatmap([[1.0]], tmp_path / "x.png")


def test_cli_reports_missing_matplotlib_in_one_line(tmp_path, monkeypatch, capsys):
    from orchmllm.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["compare", "--ranks", "8", "--items-per-rank", "2", "--plot", str(tmp_path)]) == 2
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and stderr.strip().splitlines() == [
        "orchmllm compare: error: plots need matplotlib: python3.11 -m pip install 'matplotlib>=3.7'"]


def test_timelines_of_several_strategies_show_the_same_ranks_with_every_stages_slowest():
    rng = np.random.default_rng(3)
    none = {"vision": rng.uniform(1, 3, 300), "llm": rng.uniform(5, 9, 300)}
    ours = {"vision": np.full(300, 2.0), "llm": np.full(300, 7.0)}
    ours["llm"][123] = 7.5
    shown = plots.timeline_ranks([none, ours], max_ranks=32)
    assert shown.size <= 32 and np.all(np.diff(shown) > 0) and {0, 299, 123} <= set(shown.tolist())
    assert {int(np.argmax(seconds)) for seconds in none.values()} <= set(shown.tolist())
    np.testing.assert_array_equal(plots.timeline_ranks([ours], max_ranks=400), np.arange(300))


def test_rank_load_grid_has_a_column_per_configuration(tmp_path):
    rng = np.random.default_rng(4)
    columns = {f"D={d}": {"llm": (rng.lognormal(0, 0.5, d), np.full(d, 1.0)),
                          "image encoder": (rng.lognormal(0, 0.7, d), rng.uniform(0.9, 1.1, d))} for d in (8, 64)}
    path = plots.plot_rank_load_grid(columns, tmp_path / "loads.png", labels=("as sampled", "balanced"))
    check_png(path)
    assert image.imread(path).shape[1] > 900  # two columns of panels


def test_traffic_heatmaps_on_a_shared_scale(tmp_path):
    matrix = np.random.default_rng(5).uniform(0, 1e8, (8, 8))
    check_png(plots.plot_traffic_heatmap(matrix, tmp_path / "shared.png", max_bytes=4e9))
    check_png(plots.plot_traffic_heatmap(np.zeros((8, 8)), tmp_path / "nothing.png", max_bytes=0.0))


def text_boxes(figure):
    """Window extents of every text a drawn figure shows, with its text (tick labels of ticks
    outside the axis limits are not drawn)."""
    from matplotlib.text import Text

    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    hidden = {id(label) for axis in figure.axes for scale in (axis.xaxis, axis.yaxis)
              for tick in scale.get_major_ticks() + scale.get_minor_ticks()
              if not min(scale.get_view_interval()) <= tick.get_loc() <= max(scale.get_view_interval())
              for label in (tick.label1, tick.label2)}
    return [(text.get_text(), text.get_window_extent(renderer)) for text in figure.findobj(Text)
            if text.get_visible() and text.get_text().strip() and id(text) not in hidden]


def overlapping_texts(figure):
    """Pairs of texts whose boxes share more than a pixel each way."""
    boxes = text_boxes(figure)
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:]
            if min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0) > 1 and
            min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0) > 1]


def test_regression_cells_title_overlapped_the_panel_titles_and_the_colour_bar_offset():
    """Cause: the suptitle sat over the panel titles (no layout made room for it), and each colour
    bar's '1e15' offset text sat over its panel's title."""
    rng = np.random.default_rng(6)
    panels = {"as sampled (per-rank fill)": rng.uniform(0, 7e15, (3, 64)), "ours": np.full((2, 64), 3.8e15)}
    figure = plots.cell_loads_figure(panels, title="llm stage, D=64: cost of every (micro-batch, rank) cell")
    assert overlapping_texts(figure) == []
    texts = [text for text, _ in text_boxes(figure)]
    assert not any(text.startswith("1e") for text in texts)  # no offset text: the unit is in the labels
    assert "cell cost ($\\times 10^{15}$)" in texts and len(figure.axes) == 3  # one shared colour bar
    assert any("step cost Σ_m max_r = " in text and "$\\times 10^{15}$" in text for text in texts)


def test_regression_scaling_speed_up_axis_started_where_the_data_did():
    """Cause: only the MFU axis was pinned at 0; the speed-up axis started at 0.4 or 0.95, as the
    lowest line happened to lie, so heights did not read as ratios."""
    speedup = {"none": [1, 1], "megatron": [0.45, 0.5], "ours": [1.9, 2.0]}
    mfu = {"none": [0.2, 0.2], "megatron": [0.1, 0.1], "ours": [0.4, 0.4]}
    figure = plots.scaling_figure([64, 256], speedup, mfu)
    speedup_axis, mfu_axis = figure.axes
    assert speedup_axis.get_ylim()[0] == 0 and mfu_axis.get_ylim()[0] == 0
    assert speedup_axis.get_ylim()[1] >= 2.0
    assert overlapping_texts(figure) == []


@pytest.mark.parametrize("size", [8, 64, 320])
def test_regression_traffic_used_megabytes_and_irregular_ticks(size):
    """Cause: below 1 GB the heat map switched to MB (the tables print GB) and its ticks were
    linspace(0, size - 1, 9) rounded: 0, 8, 16, 24, 32, 39, 47, 55, 63."""
    matrix = np.random.default_rng(7).uniform(0, 3e8, (size, size))
    figure = plots.traffic_heatmap_figure(matrix, title="llm stage", level="node")
    axis, colour_bar = figure.axes
    texts = [text for text, _ in text_boxes(figure)]
    assert "MB" not in " ".join(texts) and "GB sent" in colour_bar.get_ylabel()
    off_diagonal = matrix.sum() - np.trace(matrix)
    assert f"inter-node {off_diagonal / 1e9:.3f} GB, intra-node {np.trace(matrix) / 1e9:.3f} GB" in axis.get_title()
    for ticks in (axis.get_xticks(), axis.get_yticks()):
        steps = np.diff(ticks)
        assert ticks[0] == 0 and ticks[-1] <= size - 1 and len(set(steps)) == 1 and len(ticks) <= 8
    assert overlapping_texts(figure) == []


def test_load_panels_name_the_algorithm_that_balanced_them():
    """The figure's title listed every chosen algorithm at once ("auto, multifit"): which stage
    used which was not said."""
    rng = np.random.default_rng(8)
    columns = {"D=8": {"llm": (rng.lognormal(0, 0.5, 8), np.ones(8), "multifit"),
                       "image encoder": (rng.lognormal(0, 0.5, 8), np.ones(8), "auto")}}
    figure = plots.rank_load_grid_figure(columns, labels=("as sampled", "balanced"))
    legends = [[text.get_text() for text in axis.get_legend().get_texts()] for axis in figure.axes]
    assert legends[0][1].startswith("balanced by multifit (max 1.00x mean)")
    assert legends[1][1].startswith("balanced by auto (max 1.00x mean)")
    assert overlapping_texts(figure) == []


def test_timeline_legend_lists_the_stages_in_order_then_idle():
    stages = {"image encoder": np.array([1.0, 2.0]), "audio encoder": np.array([0.5, 0.2]), "llm": np.array([3.0, 4.0])}
    figure = plots.step_timeline_figure(stages, title="none: one step")
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == [
        "image encoder", "audio encoder", "llm", "idle"]
    assert overlapping_texts(figure) == []


def test_split_work_draws_each_split_item_as_one_span_over_its_group(tmp_path):
    from matplotlib.patches import Rectangle

    start, degree = np.array([0, 0, 4, 6, 2, 3, 7]), np.array([4, 4, 2, 2, 1, 1, 1])
    seconds = np.array([3.0, 2.0, 4.0, 1.0, 0.5, 0.25, 6.0])
    panels = {"static": (np.arange(7) // 2 * 2 % 8, np.full(7, 2), seconds), "ours": (start, degree, seconds)}
    figure = plots.split_work_figure(panels, 8, title="t")
    axis = figure.axes[1]
    spans = sorted((round(p.get_x() + 0.4), round(p.get_width() + 0.2), p.get_y(), p.get_height())
                   for p in axis.patches if isinstance(p, Rectangle) and p.get_edgecolor()[:3] == (0.0, 0.0, 0.0))
    assert spans == [(0, 4, 0.0, 3.0), (0, 4, 3.0, 2.0), (4, 2, 0.0, 4.0), (6, 2, 0.0, 1.0)]  # stacked in a group
    assert figure.axes[0].get_ylim() == axis.get_ylim() and axis.get_ylim()[1] >= 7.0  # one time axis: rank 7, 1 + 6
    check_png(plots.plot_split_work(panels, 8, tmp_path / "split.png"))
    start, degree = np.repeat([0, 64, 70], [1, 40, 1]), np.repeat([8, 2, 1], [1, 40, 1])
    assert plots.split_window(start, degree, np.repeat([5.0, 0.1, 2.0], [1, 40, 1]), 256) == (0, 32)
    assert plots.split_window(start, degree, np.repeat([5.0, 0.1, 9.0], [1, 40, 1]), 256) == (64, 96)


def rank_axis_figures():
    rng = np.random.default_rng(9)
    return {"loads.png": plots.rank_load_grid_figure({"D=2": {"llm": (rng.lognormal(0, 0.5, 2), np.ones(2))}}),
            "cells.png": plots.cell_loads_figure({"ours": rng.uniform(1, 2, (3, 2))}),
            "cp_work.png": plots.split_work_figure({"ours": (np.array([0, 0, 1]), np.array([2, 1, 1]),
                                                             np.array([1.0, 0.5, 2.0]))}, 2)}


@pytest.mark.parametrize("name", ["loads.png", "cells.png", "cp_work.png"])
def test_regression_a_few_ranks_were_ticked_at_fractions(name):
    """Cause: matplotlib's default locator ticked the rank axis of 2 ranks at -0.50, -0.25, ..., 1.50, and a reader
    looks for rank 0.25 (probe6 P6-11)."""
    figure = rank_axis_figures()[name]
    figure.canvas.draw()
    for axis in figure.axes:
        if axis.get_xlabel().startswith("rank"):
            low, high = axis.get_xlim()
            shown = [tick for tick in axis.get_xticks() if low <= tick <= high]
            assert shown == [0.0, 1.0], (axis.get_xlabel(), shown)


def test_regression_cp_work_costs_were_scaled_by_an_offset_text_under_the_panel_title():
    """Cause: `compare --context-parallel --plot` draws costs near 1e16, and matplotlib's '1e16' offset text sat
    between each panel's title and its axis, apart from the 'cost' label (cells.png names its power of ten in its
    labels since issue 24; cp_work.png did not)."""
    seconds = np.array([6.1e16, 2.0e16, 3.5e16, 1.2e16])
    panels = {"static_cp": (np.array([0, 2, 2, 3]), np.array([2, 1, 1, 1]), seconds),
              "ours": (np.array([0, 1, 2, 3]), np.ones(4, dtype=np.int64), seconds)}
    figure = plots.split_work_figure(panels, 4, title="llm stage, D=4: per-rank cost with split items", unit="cost")
    texts = [text for text, _ in text_boxes(figure)]
    assert not any(text.startswith("1e") for text in texts), texts
    assert [axis.get_ylabel() for axis in figure.axes] == ["cost ($\\times 10^{16}$)"] * 2
    assert "slowest rank of all 4: 6.1 ($\\times 10^{16}$) (rank 0)" in texts
    assert overlapping_texts(figure) == []
    seconds_figure = plots.split_work_figure({"ours": panels["ours"][:2] + (seconds / 1e16,)}, 4)
    assert seconds_figure.axes[0].get_ylabel() == "seconds"  # seconds keep their unit, no power of ten
