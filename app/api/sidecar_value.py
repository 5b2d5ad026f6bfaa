"""Whether the sidecar is worth calling for a request: sources that do not pay are skipped.

The sidecar costs a second model's compute (on a CPU, the cores the main model decodes on) and
router work; it pays only by drafted tokens the main model accepts that no other source (the
tool schemas, the tenant's earlier outputs, prompt lookup) would have drafted at the same
steps: the sidecar's `gain_tokens` (app/drafting/draft_choice.py). Deep in an agent conversation
the suffix source often drafts the same tokens sooner, and a late prediction drafts nothing.

So the router keeps, per tenant and tool set, the sidecar's gain over its last `window` calls.
While fewer than `min_samples` are known it calls (`measuring`); then it calls while their mean
is at least `min_gain_tokens` (`pays`) and skips otherwise (`does_not_pay`), except every
`probe_every`-th request, which calls it again (`probe`) so a workload that changes is noticed.
Requests whose prediction does more than draft are always called: pre-execution of server
tools (`pre_execution`) and the benchmark's prediction report (`diagnostics`). The tenant is
part of the key: one tenant's traffic never decides another's calls.

One `SidecarValue` per router replica, used on its event loop only (no lock needed), bounded
to `max_keys` tool sets (least recently used dropped).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.config import SidecarValueConfig
from app.openai_models import SidecarDecision, SidecarReason

ValueKey = tuple[str, frozenset[str]]


def value_key(tenant: str, tools: Iterable[str]) -> ValueKey:
    return tenant, frozenset(tools)


@dataclass
class _Record:
    gains: deque[int]
    skipped: int = 0  # requests skipped since the sidecar was last called


@dataclass
class SidecarValue:
    config: SidecarValueConfig
    _records: OrderedDict[ValueKey, _Record] = field(default_factory=OrderedDict)

    def decide(self, key: ValueKey) -> SidecarDecision:
        """Whether this request calls the sidecar, and why (counts the skip when it does not).

        >>> value = SidecarValue(SidecarValueConfig(min_samples=1, min_gain_tokens=2,
        ...                                         probe_every=2))
        >>> key = value_key("t", ["f"])
        >>> value.decide(key).reason
        'measuring'
        >>> value.observe(key, 0)
        >>> [value.decide(key).reason for _ in range(3)]
        ['does_not_pay', 'probe', 'does_not_pay']
        """
        config = self.config
        record = self._record(key)
        gains = record.gains
        mean = sum(gains) / len(gains) if gains else None
        if not config.enabled:
            return self._call(record, "always", mean)
        if len(gains) < config.min_samples:
            return self._call(record, "measuring", mean)
        assert mean is not None
        if mean >= config.min_gain_tokens:
            return self._call(record, "pays", mean)
        if record.skipped + 1 >= config.probe_every:
            return self._call(record, "probe", mean)
        record.skipped += 1
        return SidecarDecision(call=False, reason="does_not_pay", gain_tokens=mean,
                               samples=len(gains))

    def observe(self, key: ValueKey, gain_tokens: int) -> None:
        """A called sidecar's gain on one request (0 when its prediction came too late)."""
        self._record(key).gains.append(gain_tokens)

    def _record(self, key: ValueKey) -> _Record:
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = _Record(deque(maxlen=self.config.window))
            if len(self._records) > self.config.max_keys:
                self._records.popitem(last=False)
        else:
            self._records.move_to_end(key)
        return record

    @staticmethod
    def _call(record: _Record, reason: SidecarReason, mean: float | None) -> SidecarDecision:
        record.skipped = 0
        return SidecarDecision(call=True, reason=reason, gain_tokens=mean,
                               samples=len(record.gains))
