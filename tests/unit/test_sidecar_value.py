"""Sources that do not pay are skipped: the sidecar is called per tenant and tool set while its
measured gain over the other draft sources covers its cost, probed again now and then."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from app.api.agent_loop import SidecarStart
from app.api.chat_service import ChatService
from app.api.sidecar_value import SidecarValue, value_key
from app.config import SidecarValueConfig
from app.openai_models import ChatCompletionRequest, MainReport, OooSpecReport
from app.speculation.draft_sources import SourceTallies, SourceTally
from app.speculation.turn import TurnDelta
from app.telemetry import SIDECAR_DECISIONS, SOURCE_ACCEPTED, request_measurements
from tests.unit.turns import turn_result

CONFIG = SidecarValueConfig(min_gain_tokens=2, window=3, min_samples=2, probe_every=4)
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}


def test_it_measures_then_calls_while_it_pays() -> None:
    value = SidecarValue(CONFIG)
    key = value_key("t", ["lookup"])
    assert [value.decide(key).reason for _ in range(2)] == ["measuring", "measuring"]
    value.observe(key, 5)
    assert value.decide(key).reason == "measuring"  # one call measured, two needed
    value.observe(key, 3)
    decision = value.decide(key)
    assert (decision.call, decision.reason, decision.gain_tokens, decision.samples) == (
        True, "pays", 4.0, 2)


def test_it_skips_where_it_does_not_pay_and_probes_every_nth_request() -> None:
    value = SidecarValue(CONFIG)
    key = value_key("t", ["lookup"])
    for gain in (1, 0):
        value.observe(key, gain)
    calls = [value.decide(key) for _ in range(8)]
    assert [c.call for c in calls] == [False, False, False, True] * 2
    assert {c.reason for c in calls} == {"does_not_pay", "probe"}
    assert calls[0].gain_tokens == 0.5
    # The probe finds it paying again: the window's mean follows and it is called.
    for gain in (9, 9):
        value.observe(key, gain)
    assert value.decide(key).reason == "pays"


def test_tenants_and_tool_sets_are_decided_apart() -> None:
    value = SidecarValue(CONFIG)
    poor, rich = value_key("a", ["lookup"]), value_key("a", ["lookup", "other"])
    for _ in range(2):
        value.observe(poor, 0)
        value.observe(rich, 9)
    assert not value.decide(poor).call
    assert value.decide(rich).reason == "pays"
    assert value.decide(value_key("b", ["lookup"])).reason == "measuring"
    assert value_key("a", ["x", "y"]) == value_key("a", ["y", "x"])


def test_a_tool_set_not_yet_measured_goes_by_the_tenants_other_tool_sets() -> None:
    value = SidecarValue(CONFIG)
    for name in ("one", "two"):
        value.observe(value_key("a", [name]), 0)
    # Each tool set has one call measured, too few of its own; the tenant's two do not pay.
    fresh = [value.decide(value_key("a", [f"new{i}"])) for i in range(8)]
    assert [d.call for d in fresh] == [False, False, False, True] * 2
    assert {d.reason for d in fresh} == {"does_not_pay", "probe"}
    assert (fresh[0].gain_tokens, fresh[0].samples) == (0.0, 2)
    # Another tenant is not decided by them.
    assert value.decide(value_key("b", ["new0"])).reason == "measuring"
    # Probes that find the sidecar paying lift the tenant's mean: new tool sets are measured.
    for i in range(3):
        value.observe(value_key("a", [f"probe{i}"]), 12)
    assert value.decide(value_key("a", ["newer"])).reason == "measuring"
    # A tool set with calls of its own enough goes by them, not by the tenant's.
    own = value_key("a", ["one"])
    value.observe(own, 0)
    assert value.decide(own).reason == "does_not_pay"


def test_without_measuring_a_new_tenant_is_probed_and_called_once_it_pays() -> None:
    value = SidecarValue(CONFIG.model_copy(update={"measure_new": False}))
    key = value_key("t", ["lookup"])
    first = [value.decide(key) for _ in range(4)]
    assert [(d.call, d.reason) for d in first] == [(False, "does_not_pay")] * 3 + [
        (True, "probe")]
    assert (first[0].gain_tokens, first[0].samples) == (None, 0)
    value.observe(key, 9)  # the probe found it paying
    assert value.decide(value_key("t", ["other"])).reason == "pays"
    for _ in range(3):
        value.observe(key, 0)
    assert value.decide(key).reason == "does_not_pay"  # its own calls decide now
    assert SidecarValue(CONFIG).decide(key).reason == "measuring"  # the default measures


def test_a_turn_counts_what_the_prediction_in_flight_cost_its_main_passes() -> None:
    shared = SidecarValue(CONFIG.model_copy(update={"cost_per_pass": 0.15}))
    own = SidecarValue(CONFIG)
    key = value_key("t", ["lookup"])
    for value in (shared, own):
        for _ in range(2):
            value.observe(key, 4, passes=20)  # 4 tokens gained, 3 passes' worth of slowing
    assert own.decide(key).reason == "pays"
    decision = shared.decide(key)
    assert (decision.reason, decision.gain_tokens) == ("does_not_pay", 1.0)


def test_bounded_and_switchable() -> None:
    value = SidecarValue(SidecarValueConfig(max_keys=2))
    for name in "abc":
        value.decide(value_key(name, []))
    assert len(value._records) == len(value._tenants) == 2
    off = SidecarValue(SidecarValueConfig(enabled=False, min_samples=1))
    key = value_key("t", [])
    off.observe(key, 0)
    assert off.decide(key).reason == "always"


def request(**ooo_spec: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "look up alpha"}],
        "tools": [TOOL], "tool_choice": "required", "ooo_spec": ooo_spec})


class Calls:
    """A sidecar that answers at once, and a main model whose sidecar drafts gained `gain`."""

    def __init__(self, gain: int) -> None:
        self.gain = gain
        self.sidecar_calls = 0

    async def start_sidecar(self, payload: dict[str, Any]) -> SidecarStart:
        self.sidecar_calls += 1
        return SidecarStart(token="ref", prediction=None)

    async def main_events(self, payload: dict[str, Any], token: Any) -> AsyncIterator[Any]:
        yield TurnDelta("x")
        sources = SourceTallies()
        if token is not None:  # the sidecar was called: its drafts gained `gain`
            sources.sidecar = SourceTally(drafted_tokens=8, accepted_tokens=self.gain,
                                          gain_tokens=self.gain)
        yield turn_result([{"name": "lookup", "arguments": {"key": "alpha"}}], "",
                          main=MainReport(steps=5, completion_tokens=9, sources=sources),
                          sidecar="received" if token is not None else "none",
                          sidecar_ms=0.0, main_ms=1.0)


async def complete(service: ChatService, calls: Calls, req: ChatCompletionRequest,
                   tenant: str = "t") -> OooSpecReport:
    events = [e async for e in service.events(req, calls.start_sidecar, calls.main_events,
                                              tenant=tenant)]
    kind, completion = events[-1]
    assert kind == "final"
    return OooSpecReport.model_validate(completion["ooo_spec"])


async def test_the_router_stops_calling_a_sidecar_that_gains_nothing() -> None:
    service = ChatService("m", sidecar_enabled=True, sidecar_value=CONFIG)
    calls = Calls(gain=0)
    reports = [await complete(service, calls, request()) for _ in range(4)]
    assert calls.sidecar_calls == 2  # measured twice, then skipped
    assert [r.sidecar_decisions[0].reason for r in reports] == [
        "measuring", "measuring", "does_not_pay", "does_not_pay"]
    assert [r.outcome for r in reports[2:]] == ["sidecar_skipped"] * 2
    # The decision and the per-source tallies reach the metrics.
    measured = request_measurements(reports[2], 0, 0, None)
    assert any(m.metric is SIDECAR_DECISIONS and m.tags == {"call": "false",
                                                            "reason": "does_not_pay"}
               for m in measured)
    # Skipped: the sidecar drafted nothing.
    assert not any(m.metric is SOURCE_ACCEPTED for m in measured)
    first = request_measurements(reports[0], 0, 0, None)
    assert any(m.metric is SOURCE_ACCEPTED and m.tags == {"source": "sidecar"} for m in first)
    # Another tenant's requests are measured on their own.
    other = await complete(service, calls, request(), tenant="u")
    assert other.sidecar_decisions[0].reason == "measuring"


async def test_the_router_counts_the_turns_main_passes_against_the_gain() -> None:
    # 6 tokens gained over 5 main passes: it pays, unless each pass it slowed costs a whole one.
    shared = ChatService("m", sidecar_enabled=True,
                         sidecar_value=CONFIG.model_copy(update={"cost_per_pass": 1.0}))
    calls = Calls(gain=6)
    reports = [await complete(shared, calls, request()) for _ in range(3)]
    assert [r.sidecar_decisions[0].reason for r in reports] == [
        "measuring", "measuring", "does_not_pay"]
    assert reports[-1].sidecar_decisions[0].gain_tokens == 1.0


async def test_a_sidecar_that_gains_keeps_being_called() -> None:
    service = ChatService("m", sidecar_enabled=True, sidecar_value=CONFIG)
    calls = Calls(gain=6)
    reports = [await complete(service, calls, request()) for _ in range(4)]
    assert calls.sidecar_calls == 4
    assert reports[-1].sidecar_decisions[0].reason == "pays"
    assert reports[-1].outcome != "sidecar_skipped"


async def test_requests_that_need_the_prediction_for_more_than_drafts_call_it() -> None:
    service = ChatService("m", sidecar_enabled=True, sidecar_value=CONFIG)
    calls = Calls(gain=0)
    for _ in range(3):
        await complete(service, calls, request())
    report = await complete(service, calls, request(diagnostics={"await_prediction": True}))
    assert report.sidecar_decisions[0].reason == "diagnostics"
    # Not wanted at all (sidecar off for the request): no decision is reported.
    report = await complete(service, calls, request(sidecar=False))
    assert report.sidecar_decisions == []
