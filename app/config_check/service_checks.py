"""The services' own settings: the main model's tool format and reasoning parser against its
chat template, and the sidecar's LoRA adapter and the one a `user_config` swaps in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.config import AppConfig, EngineConfig, SidecarUserConfig, known_model_defaults
from app.config_check.report import DeploymentReport


def sidecar_adapter_errors(config: AppConfig, user_config: Any) -> list[str]:
    """`sidecar.lora` and the adapter a Sidecar `user_config` swaps in (`lora_path`): each
    must be there, within `max_rank`, and a swap needs the engine built with LoRA."""
    lora = config.sidecar.lora
    errors = lora.errors() if lora is not None else []
    if user_config is None:
        return errors
    try:
        update = SidecarUserConfig.model_validate(user_config)
    except ValidationError as exc:
        return errors + [f"Sidecar user_config: {e['msg']}" for e in exc.errors()]
    if update.lora_path is None:
        return errors
    if lora is None:
        return errors + ["Sidecar user_config.lora_path: set sidecar.lora in args too (the "
                         "sidecar's engine is built with LoRA only then)"]
    swapped = lora.model_copy(update={"path": update.lora_path})
    errors += [f"Sidecar user_config: {e}" for e in swapped.errors()]
    if errors or lora.modules == "all":
        return errors
    from app.engine.lora_modules import peft_modules

    configured, swapping = peft_modules(lora.path), peft_modules(swapped.path)
    if configured is None or swapping is None:
        return errors  # weights in another format: the replica checks what vLLM wraps
    extra = sorted(swapping - configured)
    if extra:
        errors.append(
            f"Sidecar user_config.lora_path: the adapter has layers sidecar.lora.path's does not "
            f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}), and the engine wraps "
            "only those for LoRA: set sidecar.lora.modules: all, or deploy it as sidecar.lora.path"
        )
    return errors



# Model families that think before they answer, by a piece of their name, and the parser
# vLLM reads their thoughts with.
THINKING_MODELS = {"qwen3": "qwen3", "deepseek-r1": "deepseek_r1"}


def check_tool_format(dep: DeploymentReport, cfg: EngineConfig) -> None:
    """How the main model's prompt is built with tools, and whether its chat template agrees
    with `main.engine.tool_format` (only for a model whose tokenizer is on this machine); a
    thinking model without `reasoning_parser` is warned about (its thoughts would be content),
    and so is a known model family (`known_model_defaults`) run with other parsers than vLLM's
    recipes give it. How forced calls are constrained (`forced_calls`): the format's
    structural tag, or the JSON fallback where vLLM has none."""
    for piece, parser in THINKING_MODELS.items():
        if piece in cfg.model.lower() and cfg.reasoning_parser is None:
            dep.warnings.append(
                f"{cfg.model} thinks before it answers: set `main.engine.reasoning_parser: "
                f"{parser}`, or its thoughts come back as content and are drafted over"
            )
    dep.warnings += known_model_warnings(cfg)
    from app.formats.structural_tag import engine_tag_model
    from app.formats.tool_formats import get_format as format_named

    tag = engine_tag_model(cfg)
    dep.forced_calls = (
        f"in the model's format, structural tag {tag!r} (tool_strict_level "
        f"{cfg.tool_strict_level})" if tag is not None
        else "JSON fallback (main.engine.tool_structural_tags: false)"
        if not cfg.tool_structural_tags
        else f"JSON fallback (vLLM has no structural tag for "
             f"{format_named(cfg.tool_format).vllm_parser!r})")
    from app.engine.embedded_model import EMBEDDED_MODEL_ALIAS, embedded_model_dir, is_prepared
    from app.formats import chat_prompt
    from app.formats.tool_formats import get_format

    if cfg.model == EMBEDDED_MODEL_ALIAS:
        folder: Path | None = embedded_model_dir() if is_prepared() else None
    else:
        folder = Path(cfg.model) if (Path(cfg.model) / "tokenizer_config.json").is_file() else None
    if folder is None:
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    template = None
    if cfg.chat_template:  # the engine renders with it (VllmEngine.start), so judge that one
        from app.formats.tool_formats.families import load_chat_template

        template = tokenizer.chat_template = load_chat_template(cfg.chat_template)
    fmt = get_format(cfg.tool_format, tokenizer, template)
    native = chat_prompt.template_renders_tools(tokenizer)
    dep.tool_format = f"{fmt.name}; " + (
        "the chat template renders tools" if native
        else "the template ignores tools: the format's own tool prompt")
    mismatch = chat_prompt.format_mismatch(tokenizer, fmt)
    if mismatch:
        dep.warnings.append(mismatch)


def known_model_warnings(cfg: EngineConfig) -> list[str]:
    """A known model family (app/config.py `KNOWN_MODELS`) whose tool format or reasoning
    parser is set to another than vLLM's recipes give it, or whose recipe parser this version
    does not take (the config's default then stays)."""
    known = known_model_defaults(cfg.model) or known_model_defaults(cfg.served_model_name)
    if known is None:
        return []
    warnings: list[str] = []
    tool_format, reasoning = known
    if cfg.tool_format != tool_format:
        warnings.append(
            f"{cfg.model}: vLLM's recipes parse its calls with `--tool-call-parser "
            f"{tool_format}`, but `main.engine.tool_format` is {cfg.tool_format!r}; calls in "
            f"the model's own format may not be read")
    thinking = any(piece in cfg.model.lower() for piece in THINKING_MODELS)
    if reasoning is not None and cfg.reasoning_parser != reasoning and not (
            thinking and cfg.reasoning_parser is None):  # warned about above
        warnings.append(
            f"{cfg.model}: vLLM's recipes read its reasoning with `--reasoning-parser "
            f"{reasoning}`, but `main.engine.reasoning_parser` is {cfg.reasoning_parser!r}")
    return warnings
