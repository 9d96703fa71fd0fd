"""probe32's P32-05: with `--context-parallel`, `compare`'s micro-batch table and cells.png planned every item whole
beside cp_work.png's split items ("ours" 3x apart) without saying so."""

from orchmllm.cli import main, plots

COMPARE = ["compare", "--workload", "long", "--ranks", "8", "--items-per-rank", "4", "--algorithms", "lpt",
           "--context-parallel", "1,2,4,8", "--max-tokens-per-microbatch", "200000"]


def test_the_micro_batch_table_and_cells_png_say_items_are_kept_whole(tmp_path, capsys, monkeypatch):
    titles = []

    def cells(loads, path, *, title):
        titles.append(title)
        path.write_bytes(b"")
        return path

    monkeypatch.setattr(plots, "plot_cell_loads", cells)
    monkeypatch.setattr(plots, "require_matplotlib", lambda: None)
    assert main([*COMPARE, "--plot", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the title wraps at the table's width
    assert "tokens per rank (items kept whole: no context parallelism)" in out
    assert titles and titles[0].endswith("(items kept whole: no context parallelism)")
    assert main(COMPARE[:-4] + COMPARE[-2:]) == 0  # without --context-parallel: no note
    assert "items kept whole" not in capsys.readouterr().out


def test_the_samples_per_rank_help_states_each_mode_s_default(capsys, monkeypatch):
    """probe32: with --pipeline-stages the help said "default: sized by memory" while 128 per replica ran."""
    import pytest

    from orchmllm.study import context_parallel_sim, microbatch_sim, pipeline_sim

    monkeypatch.setenv("COLUMNS", "1000")  # argparse would wrap inside the flags' names
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (f"{microbatch_sim.DEFAULT_SAMPLES_PER_RANK} with --max-tokens-per-microbatch, "
            f"{context_parallel_sim.DEFAULT_SAMPLES_PER_RANK} with --context-parallel, "
            f"{pipeline_sim.DEFAULT_SAMPLES_PER_RANK} per replica with --pipeline-stages") in text
