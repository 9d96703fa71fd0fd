"""Batch input validation (orchestrator/samples.py)."""

import pytest

from orchmllm.orchestrator import Batch, Sample, Segment


def test_modalities_given_as_one_str_is_rejected_not_split_into_letters():
    with pytest.raises(TypeError, match=r"`modalities` must be a sequence of modality names, not one str; "
                                        r"got 'image' \(write \('image',\) for one modality\)"):
        Batch.from_arrays(num_ranks=1, modalities="image", sample_text=[3], sample_source=[0])
    batch = Batch.from_arrays(num_ranks=1, modalities=("image",), sample_text=[3], sample_source=[0])
    assert batch.modalities == ("image",)


@pytest.mark.parametrize("segments, wrap",
                         [(Segment("image", 8, 4), True), (None, False), (3, False), ("image", False)])
def test_regression_segments_not_a_sequence_is_named(segments, wrap):
    """probe22 P22-07: one Segment instead of a tuple (the likeliest slip), None or an int raised Python's raw
    "'Segment' object is not iterable", naming neither `segments` nor what it takes."""
    hint = r" \(wrap one in a tuple: segments=\(Segment\(\.\.\.\),\)\)" if wrap else ""
    with pytest.raises(TypeError, match=rf"^`segments` must be a sequence of Segment objects{hint}; got "):
        Sample(10, segments)


def test_a_list_of_segments_is_still_taken():
    assert Sample(10, [Segment("image", 8, 4)]).segments == (Segment("image", 8, 4),)
    with pytest.raises(TypeError, match=r"^`segments` must hold Segment objects; got int"):
        Sample(10, [3])
