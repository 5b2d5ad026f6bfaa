"""Compare what the main model committed with what was predicted: the request's outcome."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from app.speculation.canonical import Invocation, multiset_match

Outcome = Literal["hit", "partial", "miss", "no_call", "disabled", "sidecar_error", "sidecar_late",
                  "sidecar_skipped"]


def classify_outcome(
    *,
    speculated: bool,
    sidecar_status: str,
    sidecar_no_call: bool,
    candidates: Sequence[tuple[Invocation, bool]],
    committed: Sequence[Invocation],
    schemas: Mapping[str, Mapping[str, Any] | None],
) -> Outcome:
    """`candidates` are the reported candidate calls with whether each was valid, `committed`
    the main model's calls. Equality is canonical (defaults filled, key order ignored,
    1 == 1.0); parallel calls match as a multiset (`multiset_match`)."""
    if not speculated:
        return "disabled"
    if sidecar_status == "skipped":  # not worth calling lately (app/api/sidecar_value.py)
        return "sidecar_skipped"
    if sidecar_status == "error":
        return "sidecar_error"
    if sidecar_status in ("late", "pending"):
        return "sidecar_late"
    valid = [call for call, ok in candidates if ok]
    if not committed:
        return "no_call" if (sidecar_no_call or not valid) else "miss"
    if not valid:
        return "miss"
    match = multiset_match(valid, committed, schemas)
    if not match.unmatched_committed:
        return "hit"
    names = {c.name for c in valid}
    if match.pairs or any(call.name in names for call in committed):
        return "partial"
    return "miss"
