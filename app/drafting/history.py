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
or accepted-token counts. Capacity is per tenant too: each keeps at most its own share of
entries, and when the replica's total is full the entry that goes is the oldest of the tenant
holding the most (the recording tenant's own on a tie), so no tenant can flush another's
entries by sending many requests.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.speculation.prediction import PredictedCall
from app.tenancy import ANONYMOUS_TENANT

_WORD = re.compile(r"\w+")


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


def tenant_to_evict(sizes: Mapping[str, int], recording: str) -> str:
    """Whose oldest entry goes when the history is full: the tenant holding the most, the
    recording tenant on a tie, so a tenant loses entries to another only while it holds more
    than that one does."""
    return max(sizes, key=lambda tenant: (sizes[tenant], tenant == recording))


class InvocationHistory:
    def __init__(
        self,
        max_entries: int,
        min_similarity: float,
        private_tools: Collection[str] = (),
        max_entries_per_tenant: int | None = None,
    ) -> None:
        """`max_entries`: the replica's total; `max_entries_per_tenant` (default: the total):
        what one tenant may hold of it."""
        self.min_similarity = min_similarity
        self.private_tools = frozenset(private_tools)
        self.max_entries = max_entries
        self.max_entries_per_tenant = min(max_entries_per_tenant or max_entries, max_entries)
        self._entries: dict[str, deque[_Entry]] = {}  # per tenant, oldest first
        self._total = 0
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
            self._entries.setdefault(tenant, deque()).append(entry)
            self._total += 1
            if len(self._entries[tenant]) > self.max_entries_per_tenant:
                self._drop_oldest(tenant)
            elif self._total > self.max_entries:
                sizes = {t: len(entries) for t, entries in self._entries.items()}
                self._drop_oldest(tenant_to_evict(sizes, tenant))
        return True

    def _drop_oldest(self, tenant: str) -> None:
        entries = self._entries[tenant]
        entries.popleft()
        self._total -= 1
        if not entries:
            del self._entries[tenant]

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
            entries = list(self._entries.get(tenant, ()))
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
            return self._total

    def held_by(self, tenant: str) -> int:
        with self._lock:
            return len(self._entries.get(tenant, ()))
