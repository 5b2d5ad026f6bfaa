"""Past committed invocations as a second candidate source, ready at time zero.

Agents repeat themselves: the same question to the same tool comes back with the same
arguments. Each main replica keeps its last committed calls (bounded) with the words of the
request that led to them; a new request whose last user message is close enough (Jaccard
similarity of the word sets) gets those calls as candidates before the sidecar has answered.
The sidecar's candidate, when it arrives, goes in front of them (`CandidateStore`), and every
draft is verified by the main model, so a stale entry costs a rejected draft, never an answer.

Arguments can be personal data: calls of tools listed as private are never recorded, the
history lives in the replica's memory only, and every entry belongs to one tenant (the API key
the router authenticated, `ANONYMOUS_TENANT` when keys are off): a request is only ever offered
its own tenant's past calls, so no caller's arguments reach another caller's drafts, response
or accepted-token counts.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from app.speculation.prediction import PredictedCall

_WORD = re.compile(r"\w+")

ANONYMOUS_TENANT = "anonymous"
# The key of the router's payload to the main replica and the sidecar that carries the tenant
# (set by the router after validation; a client's body cannot hold it: unknown keys are a 400).
TENANT_KEY = "_tenant"


def words(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORD.findall(text))


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def request_text(messages: Sequence[dict[str, Any]]) -> str:
    """What a call depends on most: the last user message (empty when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


@dataclass(frozen=True)
class _Entry:
    tenant: str
    words: frozenset[str]
    calls: tuple[PredictedCall, ...]


class InvocationHistory:
    def __init__(
        self, max_entries: int, min_similarity: float, private_tools: Collection[str] = ()
    ) -> None:
        self.min_similarity = min_similarity
        self.private_tools = frozenset(private_tools)
        self._entries: deque[_Entry] = deque(maxlen=max_entries)
        self._lock = threading.Lock()

    def record(
        self, text: str, calls: Sequence[PredictedCall], tenant: str = ANONYMOUS_TENANT
    ) -> bool:
        """Remember `tenant`'s committed call list; False when it is not kept (private tool,
        empty)."""
        if not calls or any(c.name in self.private_tools for c in calls):
            return False
        entry = _Entry(tenant, words(text), tuple(c.model_copy(deep=True) for c in calls))
        with self._lock:
            self._entries.append(entry)
        return True

    def candidates(
        self,
        text: str,
        callable_tools: Collection[str],
        limit: int = 2,
        tenant: str = ANONYMOUS_TENANT,
    ) -> list[list[PredictedCall]]:
        """Up to `limit` distinct past call lists of `tenant` for a request this similar, best
        first (newest first among equals), using only tools the request may call."""
        query = words(text)
        allowed = set(callable_tools) - self.private_tools
        with self._lock:
            entries = list(self._entries)
        scored: list[tuple[float, int, _Entry]] = []
        for age, entry in enumerate(reversed(entries)):
            if entry.tenant != tenant or not all(c.name in allowed for c in entry.calls):
                continue
            score = similarity(query, entry.words)
            if score >= self.min_similarity:
                scored.append((score, -age, entry))
        scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
        found: list[list[PredictedCall]] = []
        for _, _, entry in scored:
            calls = [c.model_copy(deep=True) for c in entry.calls]
            if calls not in found:
                found.append(calls)
            if len(found) == limit:
                break
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
