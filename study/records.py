"""What the study's flat result records share: their JSON form is their fields."""

from __future__ import annotations

import dataclasses


class FieldsAsJson:
    """Base of a frozen dataclass whose fields are all JSON values (numbers, strings, None, tuples)."""

    def to_json(self) -> dict:
        """The record as JSON-serialisable data (the keys are the field names)."""
        return dataclasses.asdict(self)
