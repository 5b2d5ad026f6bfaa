"""Collection for `ooo-spec sidecar distill` on the real main engine: BFCL cases of a category
the benchmark does not measure go through `MainModelService` as plain requests, and each
committed call comes back as a sample whose pairs are the sidecar's own slot prompts with the
values the main model wrote."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from app.config import AppConfig
from app.distill.collect import collect, load_cases
from app.distill.pairs import offline_sidecar, render_pairs
from app.engine.main_model import MainModelService
from app.engine.tool_format import parse_forced
from app.spec.validation import validate_arguments

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def main() -> Iterator[MainModelService]:
    service = MainModelService(AppConfig())
    service.start()
    yield service
    service.engine.stop()


def test_collected_calls_are_the_main_models_and_render_as_slot_pairs(
    main: MainModelService,
) -> None:
    cases = load_cases(["bfcl:parallel", "bfcl:live_simple"], 2)
    samples = asyncio.run(collect(main, cases, concurrency=2))
    assert samples, "no committed call in four cases"
    by_id = {c.id: c for c in cases}
    sidecar = offline_sidecar(AppConfig(), main.engine.tokenizer)
    decode = main.engine.tokenizer.decode
    for sample in samples:
        case = by_id[sample.case_id]
        # What the main model wrote, parsed as the server parses a forced call.
        parsed = parse_forced(sample.text, None).calls
        assert [(c.name, c.arguments) for c in parsed] == [
            (c.name, c.arguments) for c in sample.calls]
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case.tools}
        call = sample.calls[0]
        assert validate_arguments(call.arguments, schemas[call.name]) == []
        slots = [p for p in render_pairs(sample, sidecar) if p.kind == "slot"]
        assert [p.key for p in slots] == [k for k in schemas[call.name]["properties"]
                                          if k in call.arguments]
        for p in slots:
            assert p.key is not None
            value = json.dumps(call.arguments[p.key], ensure_ascii=False)
            assert decode(p.target_ids).strip().rstrip(",") == value
