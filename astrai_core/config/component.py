"""`{name: ..., **params}`: the shape of every section that selects a component."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ComponentSection(BaseModel):
    """`{name: ..., **params}`: selects a registered component and configures it."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="registered name of the component")

    @property
    def params(self) -> dict[str, Any]:
        """Every key but `name`: the component's own options."""
        return dict(self.model_extra or {})
