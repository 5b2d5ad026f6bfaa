from app.drafting.history import (
    InvocationHistory,
    request_text,
    similarity,
    tenant_to_evict,
    words,
)
from app.speculation.prediction import PredictedCall


def call(name: str, **arguments: object) -> PredictedCall:
    return PredictedCall(name=name, arguments=dict(arguments))


def test_similar_request_gets_the_past_call() -> None:
    history = InvocationHistory(max_entries=8, min_similarity=0.5)
    assert history.record("What is the weather in Paris today?", [call("weather", city="Paris")])
    found = history.candidates("what is the weather in Paris today", {"weather", "time"})
    assert found == [[call("weather", city="Paris")]]


def test_dissimilar_request_or_uncallable_tool_gets_nothing() -> None:
    history = InvocationHistory(max_entries=8, min_similarity=0.5)
    history.record("What is the weather in Paris today?", [call("weather", city="Paris")])
    assert history.candidates("convert 3 miles to km", {"weather"}) == []
    assert history.candidates("What is the weather in Paris today?", {"time"}) == []


def test_private_tools_are_never_recorded_or_offered() -> None:
    history = InvocationHistory(max_entries=8, min_similarity=0.0, private_tools={"diary"})
    assert not history.record("note this", [call("diary", text="secret")])
    assert len(history) == 0
    assert history.candidates("note this", {"diary"}) == []


def test_bounded_newest_first_and_distinct() -> None:
    history = InvocationHistory(max_entries=2, min_similarity=0.0)
    history.record("a b", [call("f", x=1)])
    history.record("a b", [call("f", x=2)])
    history.record("a b", [call("f", x=2)])  # pushes x=1 out (bound 2); same call twice
    assert len(history) == 2
    assert history.candidates("a b", {"f"}) == [[call("f", x=2)]]


def test_request_text_is_the_last_user_message() -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
        {"role": "tool", "content": "42"},
    ]
    assert request_text(messages) == "second"
    assert request_text([]) == ""
    assert similarity(words("A b"), words("a B")) == 1.0


def test_tenants_never_see_each_others_calls() -> None:
    history = InvocationHistory(max_entries=8, min_similarity=0.5)
    text = "Book a flight for John Smith, passport X1234567, to Paris on 12 May"
    history.record(text, [call("book_flight", passport="X1234567")], tenant="key-a")
    assert history.candidates("book a flight for to paris on may", {"book_flight"},
                              tenant="key-b") == []
    assert history.candidates(text, {"book_flight"}, tenant="key-b") == []
    assert history.candidates(text, {"book_flight"}) == []  # nor the anonymous tenant
    assert history.candidates(text, {"book_flight"}, tenant="key-a") == [
        [call("book_flight", passport="X1234567")]]


def test_a_tenant_cannot_flush_another_tenants_entries() -> None:
    history = InvocationHistory(max_entries=8, min_similarity=0.5, max_entries_per_tenant=4)
    kept = "What is the weather in Paris today?"
    history.record(kept, [call("weather", city="Paris")], tenant="key-b")
    for i in range(100):  # a flood of key-a's own calls
        history.record(f"look up order {i}", [call("order", id=i)], tenant="key-a")
    assert history.held_by("key-a") == 4  # its share, newest kept
    assert history.candidates(f"look up order {99}", {"order"}, tenant="key-a")[0] == [
        call("order", id=99)]
    assert history.candidates(kept, {"weather"}, tenant="key-b") == [
        [call("weather", city="Paris")]]


def test_a_full_history_evicts_from_the_tenant_holding_the_most() -> None:
    history = InvocationHistory(max_entries=6, min_similarity=0.0, max_entries_per_tenant=4)
    for i in range(4):
        history.record("a", [call("f", x=i)], tenant="big")
    for i in range(2):
        history.record("b", [call("f", x=i)], tenant="small")
    assert len(history) == 6
    history.record("c", [call("f", x=0)], tenant="new")  # total full: `big` gives one up
    assert len(history) == 6
    assert (history.held_by("big"), history.held_by("small"), history.held_by("new")) == (3, 2, 1)
    assert [call("f", x=0)] not in history.candidates("a", {"f"}, limit=8, tenant="big")


def test_eviction_choice_spares_smaller_tenants() -> None:
    assert tenant_to_evict({"a": 3, "b": 5}, recording="a") == "b"
    assert tenant_to_evict({"a": 4, "b": 4}, recording="a") == "a"  # a tie: its own
    assert tenant_to_evict({"a": 5, "b": 2}, recording="b") == "a"
