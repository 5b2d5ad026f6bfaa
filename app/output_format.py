"""`response_format` (Chat Completions) and `text.format` (Responses): structured outputs.

As in vLLM's OpenAI server, `json_object` constrains the output to a JSON object and
`json_schema` to its schema (with or without `strict`: vLLM constrains either way); `text` is
free text. The constraint is the main model's bounded-whitespace JSON grammar
(app/formats/json_grammar.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field("response", pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    # `schema` shadows a BaseModel attribute in pydantic, so the field has another name.
    json_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object"}, alias="schema"
    )
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the output is constrained to; None for free text."""
        if self.type == "json_object":
            return {"type": "object"}
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("response_format 'json_schema' needs a 'json_schema' object")
            return self.json_schema.json_schema
        return None
