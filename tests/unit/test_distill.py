"""`ooo-spec sidecar distill` (app/distill/): pairs rendered with the sidecar's own prompt
functions, the seeded split, the training loop on a tiny model (determinism, resume, it
learns), the agreement report, and the serving config (`sidecar.lora`)."""

from __future__ import annotations

import asyncio
import json
import sys
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.config import AppConfig, SidecarLoraConfig
from app.distill import collect
from app.distill.pairs import (
    KINDS,
    CommittedCall,
    Pair,
    Sample,
    balance_more,
    is_held_out,
    offline_sidecar,
    render_pairs,
    slot_target,
    split,
)
from app.distill.report import agreement
from app.distill.train import TrainSettings, adapted_layers, batch_indices, collate
from app.openai_models import ChatCompletionRequest
from app.sidecar import slot_filling

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers",
       "parameters": {"type": "object", "properties": {
           "a": {"type": "integer"}, "b": {"type": "number"}, "note": {"type": "string"}},
           "required": ["a", "b"]}}}
CITY = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TEXT = ('[\n{\n    "name": "add",\n    "arguments": {\n        "a": 3,\n        "b": 4.5\n'
        '    }\n}\n]')


@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from app.engine.embedded_model import is_prepared, resolve_model_path

    if not is_prepared():
        pytest.skip("the embedded model is not prepared (`make model`)")
    return AutoTokenizer.from_pretrained(resolve_model_path("embedded"))


def sample(tools: list[dict[str, Any]], arguments: dict[str, Any], case_id: str = "c1",
           name: str = "add", choice: Any = "required") -> Sample:
    return Sample(case_id=case_id, source="test", text=TEXT,
                  request={"messages": [{"role": "user", "content": "add 3 and 4.5"}],
                           "tools": tools, "tool_choice": choice},
                  calls=[CommittedCall(name=name, arguments=arguments)])


def test_slot_targets_are_what_each_slot_grammar_writes() -> None:
    params = ADD["function"]["parameters"]
    # Numeric slots: a regex that ends with the separator the main model writes next.
    assert slot_target(params, "a", 3, last=False) == "3,"
    assert slot_target(params, "b", 4.5, last=True) == "4.5\n"
    # Other slots: the JSON value, with the space the slot's tail leaves out.
    assert slot_target(params, "note", "héllo", last=True) == ' "héllo"'
    assert slot_filling.slot_regex(params, "note") is None


def test_pairs_are_the_sidecars_own_prompts_and_the_main_models_values() -> None:
    sidecar = offline_sidecar(AppConfig(), tokenizer())
    encode, decode = tokenizer().encode, tokenizer().decode
    s = sample([ADD, CITY], {"a": 3, "b": 4.5})
    pairs = render_pairs(s, sidecar, KINDS)
    request = ChatCompletionRequest.model_validate(s.request)
    prompt = sidecar.slot_prompt(request)
    assert [(p.kind, p.key) for p in pairs] == [
        ("name", None), ("slot", "a"), ("slot", "b"), ("refill", "b"), ("more", None),
        ("call", None)]
    name, a, b, refill, more, call = pairs
    assert name.choices == [encode('add"', add_special_tokens=False),
                            encode('weather"', add_special_tokens=False)]
    assert name.prompt_ids == prompt + encode(slot_filling.name_prefix("required"),
                                              add_special_tokens=False)
    assert decode(name.target_ids) == 'add"'
    params = ADD["function"]["parameters"]
    assert a.prompt_ids == prompt + sidecar._slot_tail("required", "add", params, "a")
    assert decode(a.target_ids) == "3,"
    assert b.prompt_ids == prompt + sidecar._slot_tail("required", "add", params, "b")
    assert decode(b.target_ids) == "4.5\n"
    # Filled again after the values before it, as the main model wrote them (`waves`).
    assert refill.prompt_ids == prompt + sidecar._slot_tail(
        "required", "add", params, "b", {"a": 3})
    assert decode(refill.prompt_ids).endswith('"a": 3,\n        "b": ')
    assert refill.target_ids == b.target_ids
    # After the required values the main model closed the call: no optional keys.
    assert decode(more.prompt_ids).endswith('"a": 3,\n        "b": 4.5')
    assert more.prompt_ids[:len(prompt)] == prompt
    assert more.target_ids == encode("\n    }", add_special_tokens=False)[:1]
    assert decode(more.target_ids).startswith("\n")
    assert call.prompt_ids == prompt and decode(call.target_ids) == TEXT
    # The signature prompt (sidecar.prompt: signatures), not the main model's JSON listing.
    assert "add(a: integer, b: number, note?: string) - Add two numbers" in decode(prompt)


def test_the_name_pair_is_under_the_choices_own_prompt() -> None:
    config = AppConfig.model_validate({"sidecar": {"choice_prompt": "full"}})
    sidecar = offline_sidecar(config, tokenizer())
    s = sample([ADD, CITY], {"a": 3, "b": 4.5})
    request = ChatCompletionRequest.model_validate(s.request)
    [name, *slots] = render_pairs(s, sidecar, ("name", "slot"))
    # The main model's own prompt for the choice, the signatures for the slots.
    full = sidecar.prompt(request, request.tool_dicts())
    assert name.prompt_ids[: len(full)] == full
    assert all(p.prompt_ids[: len(full)] != full for p in slots)
    assert '"name": "weather"' in tokenizer().decode(name.prompt_ids)


def test_slot_pairs_list_the_chosen_tool_alone_under_slot_tools_chosen() -> None:
    config = AppConfig.model_validate({"sidecar": {"slot_tools": "chosen"}})
    sidecar = offline_sidecar(config, tokenizer())
    s = sample([ADD, CITY], {"a": 3, "b": 4.5})
    request = ChatCompletionRequest.model_validate(s.request)
    [name, *slots] = render_pairs(s, sidecar, ("name", "slot", "more"))
    offered, alone = sidecar.slot_prompt(request), sidecar.slot_prompt(request, "add")
    assert "weather" in tokenizer().decode(offered) and "weather" not in tokenizer().decode(alone)
    # The choice is made among every tool; the slots see the main model's tool alone.
    assert name.prompt_ids[: len(offered)] == offered
    assert len(slots) == 3 and all(p.prompt_ids[: len(alone)] == alone for p in slots)


def test_which_pairs_a_sample_makes() -> None:
    sidecar = offline_sidecar(AppConfig(), tokenizer())
    # One tool: no choice to learn; the optional key the main model wrote is a slot too.
    kinds = [(p.kind, p.key) for p in render_pairs(
        sample([ADD], {"a": 1, "b": 2, "note": "x"}), sidecar)]
    assert kinds == [("slot", "a"), ("slot", "b"), ("slot", "note"), ("more", None)]
    [more] = [p for p in render_pairs(sample([ADD], {"a": 1, "b": 2, "note": "x"}), sidecar)
              if p.kind == "more"]
    assert tokenizer().decode(more.target_ids) == ","  # it went on with the optional key
    # A named tool: nothing to choose either, and the call opens without a list.
    named = {"type": "function", "function": {"name": "add"}}
    [pair, _, _] = render_pairs(sample([ADD, CITY], {"a": 1, "b": 2}, choice=named), sidecar)
    assert tokenizer().decode(pair.prompt_ids).endswith('{\n    "name": "add",\n    '
                                                        '"arguments": {\n        "a": ')
    # Nothing to learn from: a call of a tool the request does not offer, auto mode.
    assert render_pairs(sample([ADD], {"a": 1}, name="nope"), sidecar) == []
    assert render_pairs(sample([ADD], {"a": 1}, choice="auto"), sidecar) == []


def pair(case_id: str, prompt: list[int], target: list[int], kind: Any = "slot") -> Pair:
    return Pair(case_id=case_id, kind=kind, prompt_ids=prompt, target_ids=target)


def test_a_name_agrees_when_the_names_grammar_leads_greedy_to_it() -> None:
    import torch

    from app.distill.train import _agrees, allowed_tokens

    choices = [[5, 6, 9], [5, 7, 9], [8, 9]]  # three names' tokens
    assert allowed_tokens(choices, [5, 7, 9], 0) == [5, 8]
    assert allowed_tokens(choices, [5, 7, 9], 1) == [6, 7]
    assert allowed_tokens(choices, [5, 7, 9], 2) == [9]
    name = Pair(case_id="c", kind="name", prompt_ids=[1], target_ids=[5, 7, 9], choices=choices)
    logits = torch.zeros(3, 12)
    logits[0, 3] = logits[0, 5] = logits[1, 7] = 1.0  # token 3 is not a name's: masked out
    logits[1, 2] = 5.0  # neither is 2
    assert _agrees(name, logits)
    assert not _agrees(name.model_copy(update={"choices": None}), logits)  # unconstrained
    logits[1, 6] = 2.0  # the grammar allows 6 there: greedy takes another name
    assert not _agrees(name, logits)


def test_split_keeps_a_case_on_one_side_and_is_seeded() -> None:
    pairs = [pair(f"case{i}", [1], [2]) for i in range(200) for _ in range(3)]
    train, held = split(pairs, 0.2, seed=0)
    assert not {p.case_id for p in train} & {p.case_id for p in held}
    assert 0.1 < len(held) / len(pairs) < 0.3
    assert split(pairs, 0.2, seed=0) == (train, held)
    assert split(pairs, 0.2, seed=1)[1] != held


def test_batches_cover_every_pair_once_per_epoch_in_a_seeded_order() -> None:
    epoch = [i for step in range(3) for i in batch_indices(10, 4, step, seed=0)]
    assert sorted(epoch) == list(range(10))
    assert batch_indices(10, 4, 3, seed=0) != batch_indices(10, 4, 0, seed=0)  # next epoch
    assert batch_indices(10, 4, 1, seed=0) == batch_indices(10, 4, 1, seed=0)
    assert batch_indices(10, 4, 0, seed=0) != batch_indices(10, 4, 0, seed=1)


def test_collate_pads_on_the_right() -> None:
    batch = collate([pair("a", [5, 6, 7], [8]), pair("b", [5], [9, 10])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [5, 9, 10, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_the_adapter_sits_on_the_top_layers() -> None:
    assert adapted_layers(30, 8) == range(22, 30)
    assert adapted_layers(4, None) == adapted_layers(4, 4) == adapted_layers(4, 9) == range(4)
    with pytest.raises(ValueError):
        adapted_layers(30, 0)


def test_agreement_counts_pairs_kinds_and_whole_cases() -> None:
    pairs = [pair("x", [1], [2], "name"), pair("x", [1], [2]), pair("y", [1], [2])]
    result = agreement(pairs, [True, False, True])
    assert (result.pairs_agree, result.names_agree, result.slots_agree) == (0.6667, 1.0, 0.5)
    assert (result.cases, result.cases_agree) == (2, 0.5)
    refilled = agreement([pair("x", [1], [2]), pair("x", [1], [2], "refill")], [True, False])
    assert (refilled.slots_agree, refilled.refills_agree, refilled.cases_agree) == (1.0, 0.0, 0.0)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama (128 tokens; the pairs use ids below that) saved with the
    embedded model's tokenizer (its pad id): the loop in seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def _adapter_weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter" / "adapter_model.safetensors"))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


PAIRS = [pair(f"c{i}", [1, 20 + i, 30, 40], [50 + i, 60]) for i in range(4)]


def _train(model_path: str, out: Path, steps: int, seed: int = 0) -> Any:
    from app.distill.training_run import run_training

    settings = TrainSettings(steps=steps, batch_size=2, learning_rate=3e-2, rank=8, alpha=16,
                             seed=seed, checkpoint_every=2, layers=2)
    return run_training(model_path, PAIRS, PAIRS, out, settings, progress=False)


def test_the_top_layers_on_trunk_states_are_the_whole_model(tiny_model: str) -> None:
    """Training runs only the adapted layers, on states the frozen layers below wrote once:
    the logits must be the whole model's, adapter included, at exactly the target positions."""
    import torch

    from app.distill.train import load_model, target_logits, trunk_states

    model = load_model(tiny_model, TrainSettings(rank=8, alpha=16, layers=2))
    adapted = {n.split(".layers.")[1].split(".")[0] for n, _ in model.named_parameters()
               if "lora_" in n}
    assert adapted == {"2", "3"}
    with torch.no_grad():  # a trained-looking adapter (a fresh one is zero: B = 0)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    model.eval()
    pairs = [pair("a", [1, 5, 6, 7], [8, 9]), pair("b", [1, 5], [10])]
    logits, targets = target_logits(model, pairs, trunk_states(model, pairs, pad_id=0))
    assert targets.tolist() == [8, 9, 10]
    with torch.no_grad():
        whole = model(**collate(pairs, pad_id=0)).logits
        with model.disable_adapter():
            base = model(**collate(pairs, pad_id=0)).logits
    expected = torch.stack([whole[0, 3], whole[0, 4], whole[1, 1]])
    assert torch.allclose(logits, expected, atol=1e-5)
    assert not torch.allclose(whole, base, atol=1e-3), "the adapter changes nothing"


def test_training_is_seeded_resumable_and_learns_the_pairs(tiny_model: str,
                                                            tmp_path: Path) -> None:
    report = _train(tiny_model, tmp_path / "one", steps=40)
    assert report.before.pairs_agree == 0.0  # a random model writes none of the targets
    # It learns: a tiny model gets part of the pairs right in 40 steps (deterministic).
    assert report.after.pairs_agree > 0 and report.after.cases_agree > 0
    assert json.loads((tmp_path / "one" / "report.json").read_text())["steps"] == 40
    adapter = tmp_path / "one" / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8
    # No path of this machine in what may be shipped: the base model's folder name only.
    assert config["base_model_name_or_path"] == Path(tiny_model).name
    assert not (adapter / "README.md").exists()
    # The same seed, stopped after 20 steps and resumed from the checkpoint: the same adapter.
    _train(tiny_model, tmp_path / "two", steps=20)
    assert json.loads((tmp_path / "two" / "checkpoint" / "state.json").read_text())["step"] == 20
    _train(tiny_model, tmp_path / "two", steps=40)
    assert _same(_adapter_weights(tmp_path / "one"), _adapter_weights(tmp_path / "two"))
    # Another seed: another adapter.
    _train(tiny_model, tmp_path / "three", steps=40, seed=1)
    assert not _same(_adapter_weights(tmp_path / "one"), _adapter_weights(tmp_path / "three"))


def test_collection_sends_the_benchmarks_plain_request_and_never_measured_cases() -> None:
    from load_tests.bench import MODES, RequestSettings, build_request
    from load_tests.bfcl import BfclCase

    with pytest.raises(ValueError, match="measured"):
        collect.load_cases(["bfcl:parallel", "bfcl:simple_python"], 1)
    case = BfclCase(id="parallel_0", category="parallel",
                    messages=[{"role": "user", "content": "hi"}], tools=[ADD],
                    ground_truth=[], bfcl_names={"add": "add"})
    bench = build_request(case, MODES["plain"], RequestSettings(model="m"))
    ours = collect.request_body(collect.DistillCase(id=case.id, source="bfcl:parallel",
                                                    messages=case.messages, tools=case.tools))
    for key in ("tool_choice", "temperature", "max_tokens", "messages", "tools"):
        assert ours[key] == bench[key], key
    assert ours["ooo_spec"]["enabled"] is False
    # One call: the bench sends parallel categories with parallel_tool_calls, but the sidecar's
    # slots predict one call (simple_python, multiple), so that is what is collected.
    assert "parallel_tool_calls" not in ours


def test_a_measured_question_is_never_collected() -> None:
    def case(case_id: str, text: str) -> collect.DistillCase:
        return collect.DistillCase(id=case_id, source="bfcl:x", tools=[ADD],
                                   messages=[{"role": "user", "content": text}])

    measured = [[{"role": "system", "content": "s"}, {"role": "user", "content": "Add 3 and 4."}]]
    kept = collect.without_questions([case("a", "add  3 and 4."), case("b", "Add 3 and 5.")],
                                     measured)
    assert [c.id for c in kept] == ["b"]
    # The retired executable categories are a source (Python functions like the measured ones').
    [exec_case] = collect.load_cases(["bfcl:exec_simple"], 1)
    assert exec_case.source == "bfcl:exec_simple" and exec_case.tools


def test_synthetic_tool_sets_add_other_questions_tools() -> None:
    def tool(name: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {}}}

    pool = [tool(n) for n in ("add", "b", "c", "d", "e", "f")]
    cases = [collect.DistillCase(id=f"q{i}", source="toolsets:x", tools=[ADD],
                                 messages=[{"role": "user", "content": str(i)}])
             for i in range(40)]
    mixed = [collect.with_distractors(c, pool) for c in cases]
    for case, synthetic in zip(cases, mixed, strict=True):
        names = [t["function"]["name"] for t in synthetic.tools]
        # Its own tool, kept whole, and 1 to 3 others, never a second one of its name.
        assert synthetic.tools.count(ADD) == 1 and len(set(names)) == len(names)
        assert 2 <= len(names) <= 1 + collect.MAX_DISTRACTORS
        assert synthetic.id == "toolsets_" + case.id and synthetic.messages == case.messages
        # The same case always gets the same set.
        assert collect.with_distractors(case, pool) == synthetic
    assert {len(m.tools) for m in mixed} == {2, 3, 4}
    assert len({m.tools[0]["function"]["name"] for m in mixed}) > 1  # its own tool moves
    # A question and its synthetic tool set fall on one side of the split.
    for i in range(40):
        assert is_held_out(f"q{i}", 0.3, 0) == is_held_out(f"toolsets_q{i}", 0.3, 0)
    [loaded] = collect.load_cases(["toolsets:exec_simple"], 1)
    assert loaded.id.startswith("toolsets_") and len(loaded.tools) >= 2


def test_more_pairs_are_balanced_for_training() -> None:
    def pair(i: int, kind: Any, target: int) -> Pair:
        return Pair(case_id=f"c{i}", kind=kind, prompt_ids=[1], target_ids=[target])

    on, close = 28, 472
    pairs = ([pair(i, "more", on) for i in range(9)] + [pair(i, "slot", 5) for i in range(4)]
             + [pair(i + 9, "more", close) for i in range(3)])
    balanced = balance_more(pairs, 0)
    more = [p.target_ids[0] for p in balanced if p.kind == "more"]
    assert more.count(on) == more.count(close) == 3
    assert [p for p in balanced if p.kind == "slot"] == pairs[9:13]
    assert balanced == [p for p in pairs if p in balanced]  # the order is kept
    assert balance_more(pairs, 0) == balanced and balance_more(pairs, 1) != balanced
    one_sided = [p for p in pairs if p.target_ids != [close]]
    assert balance_more(one_sided, 0) == one_sided


def test_the_collection_runs_from_the_repository_root(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The command runs `python -m app.distill` with its arguments as given, no sys.path edit
    (its datasets are the product's own, app/datasets/)."""
    import subprocess

    from app import cli

    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda command: ran.append(command) or 0)
    path_before = list(sys.path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sidecar", "distill", "--limit", "2", "--out", "x"]) == 0
    assert ran == [[sys.executable, "-m", "app.distill", "--limit", "2", "--out", "x"]]
    assert sys.path == path_before
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "app.distill", "--help"], cwd=root,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "--samples" in done.stdout, done.stderr


def test_the_collection_log_resumes_and_grows(tmp_path: Path) -> None:
    log = collect.CollectionLog(tmp_path / "samples.jsonl")
    assert log.done() == set()
    cases = [collect.DistillCase(id=f"c{i}", source="bfcl:x", tools=[ADD],
                                 messages=[{"role": "user", "content": str(i)}]) for i in range(3)]
    sample = Sample(case_id="c0", source="bfcl:x", request=collect.request_body(cases[0]),
                    text=TEXT, calls=[CommittedCall(name="add", arguments={"a": 3, "b": 4.5})])
    log.add(cases[0], sample)
    log.add(cases[1], None)  # no call committed: not collected again either
    assert log.done() == {"c0", "c1"}
    assert collect.read_samples(log.path) == [sample]
    assert collect.CollectionLog(tmp_path / "samples.jsonl").done() == {"c0", "c1"}


def test_the_adapter_config_and_its_check(tmp_path: Path) -> None:
    from app.engine.engine_args import cpu_launch, with_lora

    lora = SidecarLoraConfig(path=str(tmp_path))
    assert "no adapter_config.json" in lora.errors()[0]
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 32}))
    assert "max_rank" in lora.errors()[0]
    assert SidecarLoraConfig(path=str(tmp_path), max_rank=32).errors() == []
    config = AppConfig.model_validate({"sidecar": {"lora": {"path": str(tmp_path)}}})
    assert config.sidecar.lora is not None and config.main.engine == AppConfig().main.engine
    launch = with_lora(cpu_launch(config.sidecar.engine, "/m"), 16)
    assert launch.kwargs["enable_lora"] is True and launch.kwargs["max_lora_rank"] == 16


def test_a_swapped_adapter_is_checked_like_the_configured_one(tmp_path: Path) -> None:
    from app.config_check import check_application, sidecar_adapter_errors

    first, second = tmp_path / "first", tmp_path / "second"
    for folder, rank in ((first, 8), (second, 32)):
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({"r": rank}))
    with_lora = AppConfig.model_validate({"sidecar": {"lora": {"path": str(first)}}})
    assert sidecar_adapter_errors(with_lora, None) == []
    assert sidecar_adapter_errors(with_lora, {"lora_path": str(first)}) == []
    assert "max_rank" in sidecar_adapter_errors(with_lora, {"lora_path": str(second)})[0]
    assert "no adapter_config.json" in sidecar_adapter_errors(
        with_lora, {"lora_path": str(tmp_path / "none")})[0]
    assert "set sidecar.lora" in sidecar_adapter_errors(AppConfig(), {"lora_path": str(first)})[0]
    assert "Extra inputs" in sidecar_adapter_errors(with_lora, {"lora": str(first)})[0]
    # Read from the Serve config's `deployments:` entry.
    report = check_application({
        "args": {"sidecar": {"lora": {"path": str(first)}}},
        "deployments": [{"name": "Sidecar", "user_config": {"lora_path": str(second)}}],
    })
    [sidecar] = [d for d in report.deployments if d.name == "Sidecar"]
    assert any("max_rank" in e for e in sidecar.errors)


def test_the_sidecar_deployment_swaps_the_adapter_on_reconfigure() -> None:
    from deployments.sidecar import Sidecar

    class Engine:
        swapped: list[str] = []

        def swap_adapter(self, path: str) -> None:
            self.swapped.append(path)

    replica: Any = SimpleNamespace(service=SimpleNamespace(engine=Engine()))
    reconfigure = Sidecar.func_or_class.reconfigure
    reconfigure(replica, {"lora_path": "adapters/v2"})
    reconfigure(replica, {})
    assert Engine.swapped == ["adapters/v2"]
    with pytest.raises(ValueError):
        reconfigure(replica, {"lora_path": ""})


def test_the_command_writes_the_serve_config_that_serves_the_adapter(tmp_path: Path) -> None:
    import yaml

    from app.config_check import check_file
    from app.distill.command import serve_config_with_adapter

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 16}))
    shipped = (Path(__file__).parents[2] / "configs" / "bench.yaml").read_text()
    served = yaml.safe_load(serve_config_with_adapter(shipped, tmp_path, 16))
    args = served["applications"][0]["args"]
    assert args["sidecar"]["lora"] == {"path": str(tmp_path), "max_rank": 16}
    original = yaml.safe_load(shipped)
    args["sidecar"].pop("lora")
    assert served == original  # nothing else changed
    config_file = tmp_path / "served.yaml"
    config_file.write_text(serve_config_with_adapter(shipped, tmp_path, 16))
    assert check_file(config_file).errors == []


def test_the_command_is_registered() -> None:
    from app.cli import build_parser

    args = build_parser().parse_args(["sidecar", "distill", "--steps", "3", "--limit", "2"])
    assert (args.steps, args.limit, args.seed) == (3, 2, 0)


def test_an_engine_whose_adapter_is_missing_does_not_start(tmp_path: Path) -> None:
    from app.config import EngineConfig
    from app.engine.vllm_engine import EngineError, VllmEngine

    engine = VllmEngine(EngineConfig(), lora=SidecarLoraConfig(path=str(tmp_path / "none")))
    with pytest.raises(EngineError, match="adapter_config.json"):
        engine.start()
    assert engine.engine is None


def test_agent_scenarios_are_a_source_over_the_servers_tools() -> None:
    from app.datasets.agent_scenarios import SCENARIOS, SOURCE
    from app.distill.command import load_app_config

    assert collect.AGENT_SOURCE == SOURCE
    with pytest.raises(ValueError, match="tool listing"):
        collect.load_cases([collect.AGENT_SOURCE], None)
    # The bench config's tools: its Python modules and its MCP server, started and closed.
    listing = asyncio.run(collect.tool_listing(load_app_config("configs/bench.yaml")))
    listed = {t["function"]["name"]: t for t in listing}
    assert {"slow_lookup", "calculator", "lookup_capital"} <= set(listed)
    cases = collect.load_cases([collect.AGENT_SOURCE], None, listing)
    assert [c.id for c in cases] == [f"agent_{s.id}" for s in SCENARIOS]
    named = [c for c in cases if c.tool_choice != "required"]
    assert named and all(
        collect.request_body(c)["tool_choice"]["function"]["name"] == c.tools[0]["function"]["name"]
        for c in named)
    # A scenario's tool is the server's schema (narrowed to the conversation's values).
    lookup = next(t for c in cases for t in c.tools if t["function"]["name"] == "slow_lookup")
    assert lookup["function"]["description"] == listed["slow_lookup"]["function"]["description"]
    assert collect.load_cases([collect.AGENT_SOURCE], 2, listing) == cases[:2]
