"""The strict pydantic base every config section derives from."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator


class Strict(BaseModel):
    """Unknown keys are refused, assignments validated, attribute docstrings reach the schema.

    ``removed`` maps a field a section no longer has to what replaced it: a config that
    still sets one is refused with that reason instead of pydantic's bare "extra inputs
    are not permitted"."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )
    removed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in sorted(cls.removed.keys() & data.keys()):
                raise ValueError(f"{key!r} is no longer a setting: {cls.removed[key]}")
        return data
