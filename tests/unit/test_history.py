from app.engine.history import InvocationHistory, request_text, similarity, words
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
