"""Prompts through a chat template that renders tools are the bytes vLLM's OpenAI server
renders for the same request (its own code: `parse_chat_messages`, `safe_apply_chat_template`,
`ChatCompletionRequest.build_chat_params`), and templates that ignore tools keep the format's
fallback prompt.

The embedded SmolLM2 template ignores tools, so a copy of the model folder (tokenizer and
config only) gets a small tools-aware template in Qwen's style."""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from app.api.errors import api_error
from app.config import AppConfig
from app.formats import chat_prompt
from app.formats.tool_formats import get_format
from app.main_model.service import MainModelService
from app.openai_models import ChatCompletionRequest
from app.speculation.turn import TurnError

TOOLS_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are helpful.' }}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' %}<|im_start|>assistant
{%- if message.reasoning_content %}
<think>
{{ message.reasoning_content }}
</think>
{%- endif %}
{{ message.content }}
{%- for tc in message.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response id="{{ message.tool_call_id }}">
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{%- if enable_thinking is defined and enable_thinking is false %}
<think>

</think>
{%- endif %}
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
BARE = {"type": "function", "function": {"name": "ping"}}  # no description, no parameters

BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Weather"},
                                               {"type": "text", "text": "in Oslo?"}]}],
     "tools": [WEATHER, BARE], "tool_choice": "required",
     "chat_template_kwargs": {"enable_thinking": False, "unused_by_template": 1}},
    {"messages": [
        {"role": "user", "content": "Weather in Rome, then ping."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
    ], "tools": [WEATHER, BARE], "tool_choice": "auto"},
    {"messages": [{"role": "user", "content": "Just talk."}], "tools": [WEATHER],
     "tool_choice": "none"},
    {"messages": [{"role": "user", "content": "No tools at all."}]},
    # Reasoning in history (issue 41): under vLLM's old name and its new one.
    {"messages": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "reasoning_content": "Rome: call the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "21 degrees.", "reasoning": "Answer briefly."},
        {"role": "user", "content": "And Oslo?"},
    ], "tools": [WEATHER]},
]


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    source = Path(resolve_model_path("embedded"))
    folder = tmp_path_factory.mktemp("tools-model")
    for name in ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    (folder / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return folder


@cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def vllm_prompt(model: Path, body: dict[str, Any]) -> str:
    """What `vllm serve` renders for `body` (vllm/renderers/hf.py `HfRenderer.render_messages`
    and online_renderer's tool_dicts, step by step)."""
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest as VllmRequest,
    )
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template

    tokenizer = _tokenizer(str(model))
    config = ModelConfig(model=str(model))
    request = VllmRequest(model="m", **body)
    params = request.build_chat_params(None, "auto")
    tools = None if request.tools is None else [t.model_dump() for t in request.tools]
    content_format = resolve_chat_template_content_format(
        chat_template=None, tools=tools, given_format="auto", tokenizer=tokenizer,
        model_config=config,
    )
    conversation, _, _ = parse_chat_messages(request.messages, config, content_format)
    kwargs = params.get_apply_chat_template_kwargs()
    kwargs.pop("return_dict", None)
    return str(safe_apply_chat_template(
        config, tokenizer, conversation, tools=tools, tokenize=False, **kwargs))


class _Engine:
    """The engine surface the prompt needs: its tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.speculation = None

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def service(model: Path, tool_format: str = "hermes") -> MainModelService:
    config = AppConfig.model_validate({"main": {"engine": {"tool_format": tool_format}}})
    return MainModelService(config, engine=_Engine(_tokenizer(str(model))))  # type: ignore[arg-type]


@pytest.mark.parametrize("index", range(len(BODIES)))
def test_prompt_is_vllms_byte_for_byte(tools_model: Path, index: int) -> None:
    body = BODIES[index]
    expected = vllm_prompt(tools_model, body)
    main = service(tools_model)
    assert main.template[0] is True
    request = ChatCompletionRequest.model_validate(body)
    tools = request.tool_dicts() if request.effective_tool_choice != "none" else []
    ids = main.prompt_ids(request, tools)
    tokenizer = _tokenizer(str(tools_model))
    assert tokenizer.decode(ids) == expected
    assert ids == list(tokenizer.encode(expected, add_special_tokens=False))


def test_thinking_switch_reaches_the_template(tools_model: Path) -> None:
    body = {**BODIES[0], "chat_template_kwargs": {"enable_thinking": False}}
    main = service(tools_model)
    request = ChatCompletionRequest.model_validate(body)
    text = _tokenizer(str(tools_model)).decode(main.prompt_ids(request, request.tool_dicts()))
    assert text.endswith("<think>\n\n</think>")


def test_reserved_template_kwargs_are_a_400(tools_model: Path) -> None:
    request = ChatCompletionRequest.model_validate(
        {**BODIES[0], "chat_template_kwargs": {"tokenize": True}})
    with pytest.raises(TurnError) as err:
        service(tools_model).prompt_ids(request, request.tool_dicts())
    assert err.value.param == "chat_template_kwargs" and "tokenize" in err.value.message
    assert api_error(err.value).status == 400


def test_template_that_ignores_tools_gets_the_format_prompt() -> None:
    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    model = Path(resolve_model_path("embedded"))
    tokenizer = _tokenizer(str(model))
    assert chat_prompt.template_renders_tools(tokenizer) is False
    request = ChatCompletionRequest.model_validate(BODIES[0])
    for name in ("hermes", "pythonic"):
        main = service(model, name)
        text = tokenizer.decode(main.prompt_ids(request, request.tool_dicts()))
        assert get_format(name).system_prompt(request.tool_dicts()) in text


def test_probe_detects_tools_aware_template(tools_model: Path) -> None:
    assert chat_prompt.template_renders_tools(_tokenizer(str(tools_model))) is True


def test_mismatch_between_template_and_format_is_reported(tools_model: Path) -> None:
    tokenizer = _tokenizer(str(tools_model))
    assert "<tool_call>" in (chat_prompt.template_call_text(tokenizer) or "")
    assert chat_prompt.format_mismatch(tokenizer, get_format("hermes")) is None
    for name in ("mistral", "pythonic"):
        warning = chat_prompt.format_mismatch(tokenizer, get_format(name))
        assert warning is not None and repr(name) in warning


def test_no_mismatch_for_a_template_that_ignores_tools() -> None:
    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    tokenizer = _tokenizer(resolve_model_path("embedded"))
    for name in ("hermes", "llama3_json", "mistral", "pythonic"):
        assert chat_prompt.format_mismatch(tokenizer, get_format(name)) is None


def test_config_check_reports_the_prompt_and_a_format_mismatch(tools_model: Path) -> None:
    from app.config import EngineConfig
    from app.config_check import DeploymentReport, check_tool_format

    agreeing = DeploymentReport(name="MainModel", actor={}, actor_from="test")
    check_tool_format(agreeing, EngineConfig(model=str(tools_model), tool_format="hermes"))
    assert agreeing.tool_format == "hermes; the chat template renders tools"
    assert agreeing.warnings == [] and agreeing.errors == []
    wrong = DeploymentReport(name="MainModel", actor={}, actor_from="test")
    check_tool_format(wrong, EngineConfig(model=str(tools_model), tool_format="pythonic"))
    assert len(wrong.warnings) == 1 and "'pythonic'" in wrong.warnings[0]


def test_config_check_judges_the_configured_chat_template() -> None:
    """`main.engine.chat_template` is the template the engine renders with, so the check reads
    that one: the embedded model's own ignores tools, a family's template renders them in
    the family's format, and a format that template does not write is warned about."""
    from app.config import EngineConfig
    from app.config_check import DeploymentReport, check_tool_format
    from app.engine.embedded_model import is_prepared

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")

    def report(**engine: str) -> DeploymentReport:
        dep = DeploymentReport(name="MainModel", actor={}, actor_from="test")
        check_tool_format(dep, EngineConfig(model="embedded", **engine))
        return dep

    assert report(tool_format="qwen3_xml").tool_format == (
        "qwen3_xml; the template ignores tools: the format's own tool prompt")
    for name, template in (("qwen3_xml", "qwen3_coder"), ("openai", "openai")):
        agreeing = report(tool_format=name, chat_template=template)
        assert agreeing.tool_format == f"{name}; the chat template renders tools"
        assert agreeing.warnings == [], agreeing.warnings
    wrong = report(tool_format="qwen3_xml", chat_template="openai")
    assert len(wrong.warnings) == 1 and "'qwen3_xml'" in wrong.warnings[0]


def test_reasoning_in_history_reaches_a_template_that_reads_it(tools_model: Path) -> None:
    """The earlier turns' thinking is in the prompt of a template that renders
    `reasoning_content` (the bytes vLLM renders: `test_prompt_is_vllms_byte_for_byte`), and a
    template that ignores it (the embedded SmolLM2's, through the format's fallback) drops it."""
    body = BODIES[-1]
    tokenizer = _tokenizer(str(tools_model))
    request = ChatCompletionRequest.model_validate(body)
    text = tokenizer.decode(service(tools_model).prompt_ids(request, request.tool_dicts()))
    assert "<think>\nRome: call the tool.\n</think>" in text
    assert "<think>\nAnswer briefly.\n</think>" in text
    plain = chat_prompt.template_messages(request.message_dicts())
    assert [m.get("reasoning_content") for m in plain] == [
        None, "Rome: call the tool.", None, "Answer briefly.", None]
    fallback = get_format("hermes").prepare_messages(request.message_dicts(), None)
    assert not any("Rome: call the tool." in m["content"] for m in fallback)


class _JinjaTokenizer:
    """A chat template alone (the ChatTokenizer surface the probes use)."""

    def __init__(self, template: str) -> None:
        import jinja2

        self.chat_template = template
        self._template = jinja2.Environment().from_string(template)

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        kwargs.pop("tokenize", None)
        return self._template.render(messages=conversation, **kwargs)


def test_a_template_that_never_renders_calls_is_warned_about() -> None:
    """Issue 41: a template that lists tools but drops past calls (the probe call's name never
    appears) would leave the model without its own format: warned about, whatever the format;
    the same template writing the calls is not."""
    drops = ("{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
             "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    writes = drops.replace("{{ m.content }}", "{{ m.content }}{% for c in m.tool_calls or [] %}"
                           '<tool_call>{"name": "{{ c.function.name }}"}</tool_call>'
                           "{% endfor %}")
    for name in ("hermes", "pythonic"):
        warning = chat_prompt.format_mismatch(_JinjaTokenizer(drops), get_format(name))
        assert warning is not None and "never renders a past tool call" in warning
    assert chat_prompt.format_mismatch(_JinjaTokenizer(writes), get_format("hermes")) is None
