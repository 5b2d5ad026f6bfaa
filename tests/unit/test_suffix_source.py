"""The main-model service hands each request its own tenant's suffix index and records its
output there; the per-source tallies reach the turn's report."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from app.main_model.service import MainModelService
from app.speculation.draft_sources import SourceTallies
from tests.unit.fake_engine import FakeEngine
from tests.unit.test_services import CALL, main_service, run
from tests.unit.test_services import chat as weather_chat


async def written(service: MainModelService) -> None:
    """The output's write to the index, which runs off the event loop, has happened."""
    assert service.suffix_writes is not None
    await asyncio.wrap_future(service.suffix_writes)


async def test_a_request_drafts_from_and_feeds_its_own_tenants_index() -> None:
    engine = FakeEngine([CALL[:30], CALL[30:]])
    service = main_service(engine)
    assert service.suffixes is not None
    prepared = service.prepare(weather_chat(), raw_prompt=[1, 2, 3], tenant="key-a")
    prepared.raw_prompt = False
    events = [e async for e in service.run(prepared, None)]
    await written(service)
    [(request_id, index)] = engine.store.suffixes
    assert request_id == "req-0" and index is service.suffixes.of("key-a")
    assert service.suffixes.of("key-a").tokens == 2  # its output: tokens 100, 101
    assert service.suffixes.of("key-b").tokens == 0
    assert isinstance(events[-1].main.sources, SourceTallies)  # type: ignore[union-attr]


async def test_suffix_off_neither_drafts_nor_records() -> None:
    engine = FakeEngine([CALL[:30], CALL[30:]])
    service = main_service(engine)
    await run(service, weather_chat(ooo_spec={"history": False, "suffix": False}))
    assert engine.store.suffixes == []
    assert service.suffixes is not None and service.suffixes.of("anonymous").tokens == 0
    # Plain decoding (ooo_spec.enabled false) teaches nothing either.
    await run(service, weather_chat(ooo_spec={"history": False, "enabled": False}))
    assert service.suffixes.of("anonymous").tokens == 0
    await run(service, weather_chat())
    await written(service)
    assert service.suffixes.of("anonymous").tokens == 2


async def test_the_config_switch_turns_the_source_off() -> None:
    service = main_service(FakeEngine([CALL]), speculation={"suffix": {"enabled": False}})
    assert service.suffixes is None
    await run(service, weather_chat())
    assert service.engine.store.suffixes == []  # type: ignore[attr-defined]


async def test_a_scope_is_a_separate_index_within_the_tenant() -> None:
    engine = FakeEngine([CALL[:30], CALL[30:]])
    service = main_service(engine)
    assert service.suffixes is not None
    scoped = weather_chat(ooo_spec={"history": False,
                                    "diagnostics": {"suffix_scope": "mode-ooo"}})
    prepared = service.prepare(scoped, raw_prompt=[1, 2, 3], tenant="key-a")
    prepared.raw_prompt = False
    [_ async for _ in service.run(prepared, None)]
    await written(service)
    assert service.suffixes.of("key-a", "mode-ooo").tokens == 2
    assert service.suffixes.of("key-a").tokens == 0  # nor the tenant's own index
    assert service.suffixes.tokens("key-a") == 2 and len(service.suffixes) == 1


async def test_the_output_is_indexed_off_the_event_loop() -> None:
    """Indexing a 4,096-token output is ~0.5 s of Python: it runs on the replica's writer
    thread, not on the event loop every other request's stream is served from."""
    service = main_service(FakeEngine([CALL[:30], CALL[30:]]))
    assert service.suffixes is not None
    threads: list[str] = []
    real = service.suffixes.add

    def add(*args: Any) -> None:
        threads.append(threading.current_thread().name)
        real(*args)

    service.suffixes.add = add  # type: ignore[method-assign]
    await run(service, weather_chat())
    await written(service)
    assert len(threads) == 1 and threads[0].startswith("suffix-writer")
    assert threads[0] != threading.current_thread().name
