"""Whether the sidecar is worth calling for a request: sources that do not pay are skipped.

The sidecar costs a second model's compute (on a CPU, the cores the main model decodes on) and
router work; it pays only by drafted tokens the main model accepts that no other source (the
tool schemas, the tenant's earlier outputs, prompt lookup) would have drafted at the same
steps: the sidecar's `gain_tokens` (app/drafting/draft_choice.py). Deep in an agent conversation
the suffix source often drafts the same tokens sooner, and a late prediction drafts nothing.
Where the sidecar computes on the main model's cores, a prediction in flight also slows every
main pass of the turn: a called turn's gain is counted less `cost_per_pass` times its main
passes (0 where the sidecar has accelerators of its own).

So the router keeps, per tenant and tool set, the sidecar's net gain over its last `window`
calls. While fewer than `min_samples` are known it calls (`measuring`); then it calls while
their mean is at least `min_gain_tokens` (`pays`) and skips otherwise (`does_not_pay`), except
every `probe_every`-th request, which calls it again (`probe`) so a workload that changes is
noticed. A tool set the tenant has not sent (or not measured) yet is decided by the tenant's
calls over all its tool sets: where those do not pay it is skipped and probed in the same way,
so a tenant whose agents send many tool sets does not pay `min_samples` calls on each. With
`measure_new` off, a tenant not yet measured `min_samples` times is not
measured either: it is skipped and probed every `probe_every`-th request, and called while
what its probes measured pays.
Requests whose prediction does more than draft are always called: pre-execution of server
tools (`pre_execution`) and the benchmark's prediction report (`diagnostics`). The tenant is
part of every key: one tenant's traffic never decides another's calls.

One `SidecarValue` per router replica, used on its event loop only (no lock needed), bounded
to `max_keys` tool sets and as many tenants (least recently used dropped).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from app.config import SidecarValueConfig
from app.openai_models import SidecarDecision, SidecarReason

ValueKey = tuple[str, frozenset[str]]


def value_key(tenant: str, tools: Iterable[str]) -> ValueKey:
    return tenant, frozenset(tools)


@dataclass
class _Record:
    gains: deque[float]
    skipped: int = 0  # requests skipped since the sidecar was last called

    def mean(self) -> float | None:
        return sum(self.gains) / len(self.gains) if self.gains else None


@dataclass
class SidecarValue:
    config: SidecarValueConfig
    _records: OrderedDict[ValueKey, _Record] = field(default_factory=OrderedDict)
    # The same per tenant, over all its tool sets: what decides a tool set not yet measured.
    _tenants: OrderedDict[str, _Record] = field(default_factory=OrderedDict)

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
        >>> value.decide(value_key("t", ["g"])).reason  # the tenant's record decides
        'does_not_pay'
        """
        config = self.config
        if not config.enabled:
            return SidecarDecision(call=True, reason="always")
        record = _lru(self._records, key, self.config)
        tenant = _lru(self._tenants, key[0], self.config)
        if len(record.gains) >= config.min_samples:
            return self._judge(record)
        if len(tenant.gains) >= config.min_samples and not self._pays(tenant):
            return self._judge(tenant)
        if not config.measure_new and len(tenant.gains) < config.min_samples:
            return self._judge(tenant)  # unmeasured: called where a probe found it paying
        return self._call(record, "measuring")

    def observe(self, key: ValueKey, gain_tokens: int, passes: int = 0) -> None:
        """A called sidecar's gain on one request (0 when its prediction came too late), with
        the main passes of its turn (what the prediction in flight slowed)."""
        net = gain_tokens - self.config.cost_per_pass * passes
        _lru(self._records, key, self.config).gains.append(net)
        _lru(self._tenants, key[0], self.config).gains.append(net)

    def _pays(self, record: _Record) -> bool:
        mean = record.mean()
        return mean is not None and mean >= self.config.min_gain_tokens

    def _judge(self, record: _Record) -> SidecarDecision:
        """Call while `record`'s mean pays; else skip, probing every `probe_every`-th."""
        if self._pays(record):
            return self._call(record, "pays")
        if record.skipped + 1 >= self.config.probe_every:
            return self._call(record, "probe")
        record.skipped += 1
        return SidecarDecision(call=False, reason="does_not_pay", gain_tokens=record.mean(),
                               samples=len(record.gains))

    @staticmethod
    def _call(record: _Record, reason: SidecarReason) -> SidecarDecision:
        record.skipped = 0
        return SidecarDecision(call=True, reason=reason, gain_tokens=record.mean(),
                               samples=len(record.gains))


_K = TypeVar("_K")


def _lru(records: OrderedDict[_K, _Record], key: _K, config: SidecarValueConfig) -> _Record:
    """`key`'s record, made the most recent (a new one when absent; the least recent dropped
    past `max_keys`)."""
    record = records.get(key)
    if record is None:
        record = records[key] = _Record(deque(maxlen=config.window))
        if len(records) > config.max_keys:
            records.popitem(last=False)
    else:
        records.move_to_end(key)
    return record
