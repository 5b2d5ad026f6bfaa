"""The draft sources and what each one earned: drafted and accepted tokens per source.

Every draft the main model verifies comes from exactly one source:

- `sidecar`: the sidecar's predicted call (validated, rendered in the main model's format);
- `history`: a past committed call of the same tenant (app/drafting/history.py);
- `schema`: the offered tools' keys and punctuation with placeholder values;
- `suffix`: the tenant's own earlier outputs and the request's own tokens, matched on their
  longest common suffix with the output so far (app/drafting/suffix_index.py);
- `lookup`: prompt lookup, vLLM's `ngram` method on the request's own tokens.

The proposer counts per source what it drafted, what the main model accepted, and how many of
those accepted tokens no other source's draft at the same step would have had accepted (`gain`):
what the source adds over the others, which is what decides whether the sidecar is worth
calling (app/api/sidecar_value.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DraftSource = Literal["sidecar", "history", "schema", "suffix", "lookup"]
# Their order breaks ties between equally good drafts: a prediction made for this request
# first, then past calls, schemas, and the token-level matchers.
DRAFT_SOURCES: tuple[DraftSource, ...] = ("sidecar", "history", "schema", "suffix", "lookup")


class SourceTally(BaseModel):
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    # Accepted tokens beyond what the best other source's draft at the same steps would have
    # had accepted (as far as the committed tokens show); negative where another source would
    # have done better than the one chosen.
    gain_tokens: int = 0

    def add(self, other: SourceTally) -> None:
        self.drafted_tokens += other.drafted_tokens
        self.accepted_tokens += other.accepted_tokens
        self.gain_tokens += other.gain_tokens


class SourceTallies(BaseModel):
    """One `SourceTally` per source (`ooo_spec.main.sources` on the wire)."""

    # `schema` would shadow BaseModel's own attribute: the field is `schema_`, `schema` on
    # the wire.
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    sidecar: SourceTally = Field(default_factory=SourceTally)
    history: SourceTally = Field(default_factory=SourceTally)
    schema_: SourceTally = Field(default_factory=SourceTally, alias="schema")
    suffix: SourceTally = Field(default_factory=SourceTally)
    lookup: SourceTally = Field(default_factory=SourceTally)

    def of(self, source: DraftSource) -> SourceTally:
        tally: SourceTally = getattr(self, "schema_" if source == "schema" else source)
        return tally

    def add(self, other: SourceTallies) -> None:
        for source in DRAFT_SOURCES:
            self.of(source).add(other.of(source))
