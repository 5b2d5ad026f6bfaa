"""The first-class tool-call families: the chat template ooo-spec ships for each (written for
the project in the family's own call format, app/formats/templates/) and the markers the
family's tokenizer holds as single tokens.

The templates stand in for the real models' templates in tests and benchmarks (the real ones
come with the weights, which tests cannot download): the embedded model, given a family's
template and its markers as added tokens, writes that family's calls when they are forced.
A deployment of the real model uses the model's own template.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"

_KIMI = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_end|>", "<|tool_call_argument_begin|>")
_DEEPSEEK = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
             "<｜tool▁call▁end｜>", "<｜tool▁sep｜>")
_HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>",
            "<|return|>")
_XML = ("<tool_call>", "</tool_call>")


@dataclass(frozen=True)
class Family:
    tool_parser: str
    template: str  # file name under app/formats/templates/
    markers: tuple[str, ...] = ()  # single tokens in the family's tokenizer

    def template_text(self) -> str:
        return (TEMPLATES_DIR / self.template).read_text(encoding="utf-8")


FAMILIES: dict[str, Family] = {f.tool_parser: f for f in (
    Family("hermes", "hermes.jinja", _XML),
    Family("qwen3_json", "hermes.jinja", _XML),
    Family("qwen3_coder", "qwen3_coder.jinja", _XML),
    Family("qwen3_xml", "qwen3_coder.jinja", _XML),
    Family("openai", "openai.jinja", _HARMONY),
    Family("glm45", "glm45.jinja", _XML),
    Family("glm47", "glm47.jinja", _XML),
    Family("kimi_k2", "kimi_k2.jinja", _KIMI),
    Family("deepseek_v31", "deepseek_v31.jinja", _DEEPSEEK),
    Family("minimax_m2", "minimax_m2.jinja", ("<minimax:tool_call>", "</minimax:tool_call>")),
    Family("mistral", "mistral.jinja", ("[TOOL_CALLS]", "[ARGS]")),
)}


def template_path(name: str) -> Path | None:
    """A shipped template by family name (`qwen3_coder`) or file name; None when unknown."""
    family = FAMILIES.get(name)
    path = TEMPLATES_DIR / (family.template if family else name)
    return path if path.is_file() else None


def load_chat_template(value: str) -> str:
    """`main.engine.chat_template`: a shipped family template by name, or a Jinja file."""
    path = template_path(value) or Path(value)
    if not path.is_file():
        raise ValueError(f"chat template {value!r}: neither a template ooo-spec ships "
                         f"({', '.join(sorted(FAMILIES))}) nor a file")
    return path.read_text(encoding="utf-8")
