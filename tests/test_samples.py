"""Batch input validation (orchestrator/samples.py)."""

import pytest

from orchmllm.orchestrator import Batch


def test_modalities_given_as_one_str_is_rejected_not_split_into_letters():
    with pytest.raises(TypeError, match=r"`modalities` must be a sequence of modality names, not one str; "
                                        r"got 'image' \(write \('image',\) for one modality\)"):
        Batch.from_arrays(num_ranks=1, modalities="image", sample_text=[3], sample_source=[0])
    batch = Batch.from_arrays(num_ranks=1, modalities=("image",), sample_text=[3], sample_source=[0])
    assert batch.modalities == ("image",)
