"""Training pairs rendered exactly as the sidecar's engine requests see them.

One collected sample (a request and the call the main model committed for it) becomes:
- `name`: when the request offers several tools, the slot prompt plus the start of the call up
  to the tool name's opening quote, and as target the name with its closing quote (what
  `SidecarService.choose` generates under the names' grammar);
- `slot`: per argument the main model wrote, the slot prompt plus the call up to that
  argument's value (`SidecarService._slot_tail`), and as target the value as JSON (plus the
  separator the main model wrote after it for numeric slots, whose regex ends with one);
- `refill`: as `slot`, for every argument with required values before it, after those values
  as the main model wrote them: what a slot filled again sees (`sidecar.waves`,
  `refill_repeats`; `SidecarService._refill`), with the sidecar's own values in its place;
- `more`: the slot prompt plus the call up to the end of the main model's required values
  (`slot_filling.required_prefix`), and as target the token the main model wrote next: a
  comma when it went on with optional keys (`SidecarService.writes_optional`);
- `call` (optional): the slot prompt and the main model's whole output (the verifying pass).

The prompt ids come from the sidecar's own functions (`SidecarService.slot_prompt`,
`_slot_tail`, `slot_filling.name_prefix`) on the sidecar's tokenizer, so what is trained is
what is served; nothing here re-implements a prompt.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from app.config import AppConfig
from app.engine.embedded_model import resolve_model_path
from app.openai_models import ChatCompletionRequest
from app.sidecar import slot_filling
from app.sidecar.service import SidecarService

PairKind = Literal["name", "slot", "refill", "more", "call"]
KINDS: tuple[PairKind, ...] = ("name", "slot", "refill", "more", "call")
# `name` pairs only with `sidecar.lora.tool_choice` on: by default the base model chooses.
DEFAULT_KINDS: tuple[PairKind, ...] = ("slot", "more")
# The case id of a question asked with a synthetic tool set (`collect.with_distractors`).
TOOLSETS_PREFIX = "toolsets_"


class CommittedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any]


class Sample(BaseModel):
    """One request of the collection and what the main model committed for it."""

    model_config = ConfigDict(extra="forbid")

    case_id: str
    source: str  # e.g. "bfcl:parallel", "agent"
    request: dict[str, Any]  # the chat completion body, as the server received it
    text: str  # the main model's output, verbatim
    calls: list[CommittedCall]


class Pair(BaseModel):
    """One engine request of the sidecar: its prompt and the tokens the main model implies."""

    model_config = ConfigDict(extra="forbid")

    case_id: str
    kind: PairKind
    key: str | None = None  # the argument of a `slot` or `refill` pair
    prompt_ids: list[int]
    target_ids: list[int]
    # A `name` pair: every offered name as its target would be (the grammar's choices).
    choices: list[list[int]] | None = None


def slot_target(parameters: dict[str, Any], key: str, value: Any, last: bool) -> str:
    """What the sidecar's slot for `key` must generate to give `value`: numeric slots (a regex
    ending with the separator) the number and the separator the main model writes next
    (`,` before another key, a newline after the last one); every other slot the JSON value
    with the space the slot's tail leaves out (see `slot_filling.slot_prefix`)."""
    text = json.dumps(value, ensure_ascii=False)
    if slot_filling.slot_regex(parameters, key) is not None:
        return text + ("\n" if last else ",")
    return " " + text


def more_target(parameters: dict[str, Any], arguments: dict[str, Any]) -> str:
    """What follows the required values in the main model's call: another key, or the end."""
    required = set(parameters.get("required") or [])
    if any(k not in required for k in arguments):
        return ",\n"
    return f"\n{slot_filling.INDENT}}}"


def render_pairs(
    sample: Sample, sidecar: SidecarService, kinds: tuple[PairKind, ...] = DEFAULT_KINDS
) -> list[Pair]:
    """The pairs of one sample (its first committed call: slots mode predicts one call).
    `sidecar` needs only its engine's tokenizer (no engine is started)."""
    if not sample.calls:
        return []
    request = ChatCompletionRequest.model_validate(sample.request)
    mode = request.effective_tool_choice
    if mode not in ("required", "named"):
        return []
    call = sample.calls[0]
    tools = {t.function.name: t.function.parameters or {} for t in request.tools or []}
    if call.name not in tools:
        return []
    encode = sidecar.engine.tokenizer.encode
    prompt = sidecar.slot_prompt(request, call.name)
    pairs: list[Pair] = []
    if "name" in kinds and mode != "named" and len(tools) > 1:
        head = sidecar.choice_head(request, mode, sidecar.slot_prompt(request))
        choices = [list(encode(n + '"', add_special_tokens=False)) for n in tools]
        pairs.append(Pair(case_id=sample.case_id, kind="name", prompt_ids=head,
                          target_ids=list(encode(call.name + '"', add_special_tokens=False)),
                          choices=choices))
    parameters = tools[call.name]
    keys = [k for k in slot_filling.slots(parameters) if k in call.arguments]
    for i, key in enumerate(keys):
        target_ids = list(encode(
            slot_target(parameters, key, call.arguments[key], last=i == len(keys) - 1),
            add_special_tokens=False,
        ))
        # The same private helper the sidecar's own slots use: one rendering, not two.
        if "slot" in kinds:
            tail = sidecar._slot_tail(mode, call.name, parameters, key)
            pairs.append(Pair(case_id=sample.case_id, kind="slot", key=key,
                              prompt_ids=prompt + tail, target_ids=target_ids))
        before = slot_filling.written_before(parameters, call.arguments, key)
        if "refill" in kinds and before:
            tail = sidecar._slot_tail(mode, call.name, parameters, key, before)
            pairs.append(Pair(case_id=sample.case_id, kind="refill", key=key,
                              prompt_ids=prompt + tail, target_ids=target_ids))
    if "more" in kinds:
        upto = slot_filling.required_prefix(mode, call.name, parameters, call.arguments)
        if upto is not None:
            target = more_target(parameters, call.arguments)
            pairs.append(Pair(case_id=sample.case_id, kind="more",
                              prompt_ids=prompt + list(encode(upto, add_special_tokens=False)),
                              target_ids=list(encode(target, add_special_tokens=False))[:1]))
    if "call" in kinds:
        pairs.append(Pair(case_id=sample.case_id, kind="call", prompt_ids=prompt,
                          target_ids=list(encode(sample.text, add_special_tokens=False))))
    return pairs


def is_held_out(case_id: str, share: float, seed: int) -> bool:
    """A case's side of the split, from a hash of its question's id and the seed: the same on
    every run and machine, all pairs of one case on the same side, and a question asked with
    a synthetic tool set on the same side as the question itself."""
    question = case_id.removeprefix(TOOLSETS_PREFIX)
    digest = hashlib.sha256(f"{seed}:{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def split(pairs: list[Pair], share: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held_out) by case."""
    train = [p for p in pairs if not is_held_out(p.case_id, share, seed)]
    held = [p for p in pairs if is_held_out(p.case_id, share, seed)]
    return train, held


def balance_more(pairs: list[Pair], seed: int) -> list[Pair]:
    """`pairs` with as many `more` pairs that go on as that close (a seeded draw from the
    larger side, order kept). How often a call goes on with optional keys depends on the
    sources' tools (85% on BFCL `parallel`, near half on the measured categories); trained
    unbalanced, the adapter learns the mix of sources rather than when the main model goes
    on."""
    more = [i for i, p in enumerate(pairs) if p.kind == "more"]
    sides: dict[int, list[int]] = {}
    for i in more:
        sides.setdefault(pairs[i].target_ids[0], []).append(i)
    if len(sides) != 2:
        return pairs
    keep = min(len(side) for side in sides.values())
    rng = random.Random(seed)
    kept = {i for side in sides.values() for i in rng.sample(side, keep)}
    return [p for i, p in enumerate(pairs) if p.kind != "more" or i in kept]


def offline_sidecar(config: AppConfig, tokenizer: Any | None = None) -> SidecarService:
    """A `SidecarService` whose engine is never started, with the sidecar model's tokenizer
    (the one vLLM loads from the same folder): enough for its prompt functions."""
    sidecar = SidecarService(config)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(config.sidecar.engine.model))
    sidecar.engine.tokenizer = tokenizer
    return sidecar
