"""Embedded workloads and the JSON-lines workload file parser."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from orchmllm.study.workloads import (LIBRISPEECH_SECONDS, WENETSPEECH_SECONDS, WORKLOADS, check_workload_file,
                                      list_workloads, load_workload_file, quantile_sample, sample_workload,
                                      text_length_table)


@pytest.mark.parametrize("name", sorted(WORKLOADS), ids=str)
def test_every_workload_deals_valid_samples_to_ranks_in_order(name):
    batch = sample_workload(name, 4, 8, seed=1)
    assert batch.num_samples == 32
    np.testing.assert_array_equal(batch.sample_source, np.arange(32) // 8)
    assert set(batch.modalities) == {"image", "audio"}
    assert np.all(batch.segment_position + batch.segment_tokens <= batch.sample_llm_length[batch.segment_sample])
    assert np.all(batch.sample_llm_length > 0)


def test_same_seed_same_batch_and_different_seed_different_batch():
    first, again, other = (sample_workload("default", 8, 4, seed) for seed in (3, 3, 4))
    np.testing.assert_array_equal(first.sample_llm_length, again.sample_llm_length)
    np.testing.assert_array_equal(first.segment_length, again.segment_length)
    assert not np.array_equal(first.sample_llm_length, other.sample_llm_length)


def test_kind_specific_shapes():
    image_qa = sample_workload("image_qa", 16, 16, seed=0)
    patches = image_qa.segment_length
    assert patches.min() >= 16 * 16 and patches.max() <= 96 * 96
    np.testing.assert_array_equal(image_qa.segment_tokens, patches // 4)
    document = sample_workload("document", 8, 8, seed=0)
    tiles = np.bincount(document.segment_sample, minlength=64)
    assert tiles.min() >= 3 and tiles.max() <= 13
    assert set(document.segment_length.tolist()) == {1024}
    chat = sample_workload("chat", 8, 8, seed=0)
    assert chat.num_segments == 0
    assert set(chat.sample_text.tolist()) <= set(text_length_table().sum(axis=1).tolist())


def test_audio_durations_follow_the_published_quantiles():
    rng = np.random.default_rng(0)
    for knots in (LIBRISPEECH_SECONDS, WENETSPEECH_SECONDS):
        draws = quantile_sample(rng, knots, 40_000)
        for probability, value in knots[1:-1]:
            assert np.mean(draws <= value) == pytest.approx(probability, abs=0.006)
    asr = sample_workload("asr", 32, 32, seed=0)
    seconds = asr.segment_length / 50
    assert np.median(seconds) == pytest.approx(13.8, rel=0.05) and seconds.max() <= 27.2 + 0.02
    audio_qa = sample_workload("audio_qa", 32, 32, seed=0)
    assert audio_qa.segment_length.max() <= 1500  # cut to the 30 s encoder window


def test_text_length_table_is_the_attributed_sample():
    table = text_length_table()
    assert table.shape == (4096, 2) and table.dtype == np.int64 and table.min() >= 0


def test_list_workloads_describes_every_workload():
    described = list_workloads()
    assert set(described) == set(WORKLOADS) and all(described.values())


def write_lines(tmp_path, lines):
    path = tmp_path / "workload.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_workload_file_deals_samples_in_file_order(tmp_path):
    lines = [json.dumps({"text": 212, "segments": [{"modality": "image", "length": 1024, "tokens": 256},
                                                  {"modality": "audio", "length": 1500, "tokens": 375,
                                                   "position": 300}]}),
             "",
             json.dumps({"text": 7}),
             json.dumps({"text": 5, "segments": [{"modality": "audio", "length": 10, "tokens": 3, "position": 2}]}),
             json.dumps({"text": 9, "segments": []}),
             json.dumps({"text": 1})]
    batch = load_workload_file(write_lines(tmp_path, lines), samples_per_rank=2, num_ranks=2)
    assert batch.num_samples == 4
    np.testing.assert_array_equal(batch.sample_text, [212, 7, 5, 9])
    np.testing.assert_array_equal(batch.sample_source, [0, 0, 1, 1])
    np.testing.assert_array_equal(batch.segment_position, [0, 300, 2])
    np.testing.assert_array_equal(batch.sample_llm_length, [212 + 256 + 375, 7, 8, 9])


@pytest.mark.parametrize("bad,message", [
    ("{not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
    ('{"segments": []}', "line 2: the sample needs the key 'text'"),
    ('{"text": -4}', "line 2: the sample 'text' must be a non-negative integer"),
    ('{"text": 3.5}', "line 2: the sample 'text' must be a non-negative integer"),
    ('{"text": 3, "images": 2}', "line 2: unknown key 'images'"),
    ('{"text": 3, "segments": {"modality": "image"}}', "line 2: 'segments' must be a list"),
    ('{"text": 3, "segments": [{"length": 4, "tokens": 1}]}', "line 2: segment 0 needs a 'modality'"),
    ('{"text": 3, "segments": [{"modality": "image", "tokens": 1}]}', "line 2: segment 0 needs the key 'length'"),
    ('{"text": 3, "segments": [{"modality": "image", "length": 4, "tokens": -1}]}',
     "line 2: segment 0 'tokens' must be a non-negative integer"),
    ('{"text": 3, "segments": [{"modality": "image", "length": 4, "tokens": 2, "position": 4}]}',
     "line 2: segment 0 spans LLM positions \\[4, 6\\) past the sample's LLM sequence of 5 tokens"),
    ('{"text": 3, "segments": [{"modality": "image", "length": 4, "tokens": 2, "pos": 1}]}',
     "line 2: segment 0 has unknown key 'pos'"),
])
def test_malformed_lines_are_reported_with_their_line_number(tmp_path, bad, message):
    path = write_lines(tmp_path, ['{"text": 1}', bad, '{"text": 2}'])
    with pytest.raises(ValueError, match="^" + message):
        load_workload_file(path, samples_per_rank=3, num_ranks=1)


def test_too_few_samples_is_an_error(tmp_path):
    path = write_lines(tmp_path, ['{"text": 1}', '{"text": 2}'])
    with pytest.raises(ValueError, match="has 2 samples; 2 ranks × 2 samples per rank need 4"):
        load_workload_file(path, samples_per_rank=2, num_ranks=2)


def test_regression_a_workload_without_a_token_was_simulated_into_noise_speedups(tmp_path):
    """Cause (probe16 P16-06): `simulate --workload-file` of samples that are all empty ran, and its table read
    6-13x speed-ups of planning-time noise and named a fastest strategy; such a file is refused (a step of
    little work gets the summary's note instead, tests/test_cli.py)."""
    path = write_lines(tmp_path, ['{"text": 0, "segments": []}'] * 3)
    with pytest.raises(ValueError, match=r"none of its 3 samples holds a token \(text 0, no segments\): there is "
                                         r"no work to balance"):
        check_workload_file(path)
    assert check_workload_file(write_lines(tmp_path, ['{"text": 0}'] * 2 + ['{"text": 3}'])) == 3


def test_bad_arguments_are_rejected(tmp_path):
    path = write_lines(tmp_path, ['{"text": 1}'])
    with pytest.raises(ValueError, match="`samples_per_rank` must be a positive int"):
        load_workload_file(path, samples_per_rank=0, num_ranks=1)
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        sample_workload("nope", 1, 1)


def test_lines_beyond_the_samples_used_are_validated_too(tmp_path):
    """A bad line past the num_ranks × samples_per_rank a run reads once passed unnoticed."""
    path = write_lines(tmp_path, ['{"text": 1}', '{"text": 2}', '{"text": -1}'])
    with pytest.raises(ValueError, match="^line 3: the sample 'text' must be a non-negative integer"):
        load_workload_file(path, samples_per_rank=1, num_ranks=2)
    assert check_workload_file(write_lines(tmp_path, ['{"text": 1}', '', '{"text": 2}'])) == 2


def test_segment_of_a_modality_outside_the_given_ones_names_its_line(tmp_path):
    path = write_lines(tmp_path, ['{"text": 1}', '{"text": 2, "segments": [{"modality": "video", "length": 4, '
                                                 '"tokens": 1}]}'])
    with pytest.raises(ValueError, match="^line 2: segment 0 has modality 'video', which no stage encodes"):
        check_workload_file(path, modalities=("image", "audio"))
    assert check_workload_file(path) == 2


def test_regression_the_readme_s_workload_file_example_line_was_refused(tmp_path):
    """Cause: README's example line put its audio at position 40, inside the image before it (positions 0-256 by
    default), and the reader refused it: the line a user copies could not run (probe7 P7-02)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    line = re.search(r"^One JSON object per line:\n`(\{.*\})`\.$", readme, re.MULTILINE).group(1)
    (tmp_path / "samples.jsonl").write_text((line + "\n") * 4)
    batch = load_workload_file(tmp_path / "samples.jsonl", 2, 2)
    assert batch.num_samples == 4 and batch.sample_llm_length.tolist() == [212 + 256 + 375] * 4
