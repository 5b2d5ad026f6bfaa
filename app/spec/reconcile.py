"""Compare what the main model committed with what was predicted: the request's outcome."""

from __future__ import annotations

from typing import Any, Literal

from app.spec.canonical import Invocation, canonical_invocation

Outcome = Literal["hit", "partial", "miss", "no_call", "disabled", "sidecar_error", "sidecar_late"]


def classify_outcome(
    *,
    speculated: bool,
    sidecar_status: str,
    sidecar_no_call: bool,
    candidates: list[dict[str, Any]],
    committed: list[dict[str, Any]],
    schemas: dict[str, dict[str, Any]],
) -> Outcome:
    """`candidates` are the reported candidate calls (with `valid`), `committed` the main
    model's calls; both `{"name", "arguments"}`. Equality is canonical (defaults filled, key
    order ignored, 1 == 1.0); parallel calls match as a multiset."""
    if not speculated:
        return "disabled"
    if sidecar_status == "error":
        return "sidecar_error"
    if sidecar_status in ("late", "pending"):
        return "sidecar_late"
    valid = [c for c in candidates if c.get("valid")]
    if not committed:
        return "no_call" if (sidecar_no_call or not valid) else "miss"
    if not valid:
        return "miss"

    def key(call: dict[str, Any]) -> str:
        invocation = Invocation(name=call["name"], arguments=call["arguments"])
        return canonical_invocation(invocation, schemas.get(call["name"]))

    remaining = [key(c) for c in valid]
    matched = 0
    for call in committed:
        k = key(call)
        if k in remaining:
            remaining.remove(k)
            matched += 1
    if matched == len(committed):
        return "hit"
    names = {c["name"] for c in valid}
    if matched or any(call["name"] in names for call in committed):
        return "partial"
    return "miss"
