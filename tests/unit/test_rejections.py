"""vLLM's refusals as the client's 400 naming the field (app/engine/rejections.py)."""

from __future__ import annotations

import pytest
from vllm import SamplingParams

from app.engine.rejections import engine_rejection, rejected_field
from app.engine.vllm_engine import RequestRejected


def refusal(**options: object) -> Exception:
    with pytest.raises(Exception) as caught:
        SamplingParams(**options)  # type: ignore[arg-type]
    return caught.value


@pytest.mark.parametrize(("options", "field"), [
    ({"stop": [""]}, "stop"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_sampling_params_refusals_name_the_field(options: dict[str, object],
                                                 field: str) -> None:
    error = engine_rejection(refusal(**options))
    assert error is not None, options
    assert error.param == field and error.code == "rejected_by_engine"
    assert field in error.message


def test_a_refusal_at_the_engines_add_keeps_its_field() -> None:
    try:
        try:
            raise refusal(stop=[""])
        except Exception as exc:
            raise RequestRejected(str(exc)) from exc
    except RequestRejected as wrapped:
        error = engine_rejection(wrapped)
    assert error is not None and error.param == "stop"
    prompt = engine_rejection(RequestRejected("The decoder prompt cannot be empty"))
    assert prompt is not None and prompt.param == "prompt"
    schema = engine_rejection(RequestRejected("grammar backend failed"))
    assert schema is not None and schema.param is None and "grammar" in schema.message


def test_a_replica_failure_is_not_a_refusal() -> None:
    assert engine_rejection(RuntimeError("engine step loop died")) is None
    assert engine_rejection(KeyError("x")) is None
    assert rejected_field("the weather is fine", None) is None


def test_a_chat_template_refusal_names_the_messages() -> None:
    import jinja2

    template = jinja2.Environment().from_string(
        "{% if messages[0] != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}")

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    with pytest.raises(jinja2.TemplateError) as caught:
        template.render(messages=["assistant"], raise_exception=raise_exception)
    error = engine_rejection(caught.value)
    assert error is not None and error.param == "messages"
    assert "roles must alternate" in error.message
