"""The slot-filling sidecar on the real engine: the tool it picks is the one the grammar-
constrained greedy generation of the name writes, and every prediction is a call of an offered
tool whose arguments fit its schema."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from app.config import AppConfig, SidecarConfig
from app.openai_models import ChatCompletionRequest
from app.sidecar import slot_filling
from app.sidecar.service import SidecarService
from app.speculation.validation import validate_arguments
from tests.integration.test_lossless import PROMPTS, TOOLS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sidecar() -> Iterator[SidecarService]:
    service = SidecarService(AppConfig(sidecar=SidecarConfig(waves=2)))
    service.start()
    yield service
    service.engine.stop()


def request(prompt: str, tool_choice: object = "required") -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": prompt}],
        "tools": TOOLS, "tool_choice": tool_choice, "temperature": 0,
    })


def test_choose_stops_early_on_the_name_the_constrained_generation_writes(
    sidecar: SidecarService,
) -> None:
    names = [t["function"]["name"] for t in TOOLS]
    encode = sidecar.engine.tokenizer.encode
    for prompt in PROMPTS[:4]:
        head = sidecar.slot_prompt(request(prompt)) + encode(
            slot_filling.name_prefix("required"), add_special_tokens=False
        )
        chosen = asyncio.run(sidecar.choose(head, names))
        written = asyncio.run(sidecar.engine.generate(head, {
            "max_tokens": 48, "temperature": 0.0,
            "structured_regex": slot_filling.names_regex(names),
        }))
        assert written.text == chosen + '"', prompt


@pytest.mark.parametrize("prompt", [PROMPTS[0], PROMPTS[2], PROMPTS[4]])
def test_predictions_are_calls_of_offered_tools_that_fit_their_schema(
    sidecar: SidecarService, prompt: str
) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    prediction = asyncio.run(sidecar.predict(request(prompt)))
    assert prediction.error is None and prediction.candidates
    for [call] in prediction.candidates:
        assert call.name in schemas
        assert validate_arguments(call.arguments, schemas[call.name]) == []
    # Named: that tool's call, whatever the question asks.
    named = {"type": "function", "function": {"name": "search_flights"}}
    prediction = asyncio.run(sidecar.predict(request(prompt, named)))
    assert {c.name for [c] in prediction.candidates} == {"search_flights"}


def test_the_verifying_pass_answers_one_call_of_the_chosen_tool(sidecar: SidecarService) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    checked = request(PROMPTS[2])
    checked.ooo_spec.diagnostics.verify_prediction = True
    prediction = asyncio.run(sidecar.predict(checked))
    assert prediction.error is None
    [[call]] = prediction.candidates
    assert validate_arguments(call.arguments, schemas[call.name]) == []
    # The passes it reports are its own requests' (pass_ledger.py): verifying adds sequential ones.
    slots_only = asyncio.run(sidecar.predict(request(PROMPTS[2])))
    assert 0 < slots_only.passes < prediction.passes


@pytest.mark.parametrize(("prompt", "mode"), [
    ("How warm is it in Tokyo right now, in fahrenheit?", "required"),
    ("What's the weather in Paris?", "named"),
    ("Find me a flight from SFO to JFK on 2026-12-24 for 2 people.", "named"),
])
def test_the_call_with_optional_keys_leads_when_the_model_goes_on(
    sidecar: SidecarService, prompt: str, mode: str
) -> None:
    named = "search_flights" if "flight" in prompt else "get_weather"
    req = request(prompt, {"type": "function", "function": {"name": named}}
                  if mode == "named" else "required")
    prediction = asyncio.run(sidecar.predict(req))
    assert prediction.error is None and prediction.candidates
    [first] = prediction.candidates[0]
    tools = req.tool_schemas()
    parameters = tools[first.name]
    required = set(parameters["required"])
    filled = {k: v for [c] in prediction.candidates for k, v in c.arguments.items()}
    head = sidecar.slot_prompt(req)
    more = asyncio.run(sidecar.writes_optional(head, mode, first.name, parameters, filled))
    assert more is not None  # every tool here has its optional keys after the required ones
    # The one token is the model's own next token whenever that is a comma or a newline.
    upto = slot_filling.required_prefix(mode, first.name, parameters, filled)
    assert upto is not None
    free = asyncio.run(sidecar.engine.generate(
        head + sidecar.engine.tokenizer.encode(upto, add_special_tokens=False),
        {"max_tokens": 1, "temperature": 0.0}))
    if free.text.startswith((",", "\n")):
        assert more == free.text.startswith(",")
    # The prediction leads with the call with the optional keys exactly when the call goes on.
    assert (set(first.arguments) != required) == (more and len(prediction.candidates) > 1)
