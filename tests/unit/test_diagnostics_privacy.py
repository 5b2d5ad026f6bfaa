"""What the `ooo_spec` report shows a client of its prediction: its own numbers, and a generic
text for any failure (issue 29, "diagnostics that say nothing about others")."""

from __future__ import annotations

from typing import Any

import pytest

from app.api.chat_service import PREDICTION_FAILED, observe_prediction
from app.speculation.canonical import Invocation
from app.speculation.prediction import Prediction


def clock() -> float:
    return 0.0


async def arrived(prediction: Prediction) -> dict[str, Any]:
    return prediction.model_dump()


@pytest.mark.parametrize("detail", [
    # The router's load gate: how many other calls are pending is other tenants' business.
    "skipped: 7 sidecar calls pending (speculation.load_aware.sidecar_max_pending)",
    # An exception's text can carry paths, hosts and internals.
    "OSError: [Errno 2] No such file or directory: '/srv/models/sidecar/adapter'",
])
async def test_a_failed_prediction_reports_generic_text(detail: str) -> None:
    report = await observe_prediction(arrived(Prediction(error=detail)), clock)
    assert report.error == PREDICTION_FAILED
    shown = report.model_dump_json()
    assert "pending" not in shown and "7" not in shown and "/srv" not in shown


async def test_a_prediction_that_could_not_be_read_reports_generic_text() -> None:
    async def lost() -> dict[str, Any]:
        raise ConnectionError("ray://10.0.0.5:10001 refused")

    report = await observe_prediction(lost(), clock)
    assert report.error == PREDICTION_FAILED and "10.0.0.5" not in report.model_dump_json()


async def test_a_prediction_reports_its_own_passes_and_calls() -> None:
    call = Invocation(name="get_weather", arguments={"city": "Paris"})
    prediction = Prediction(candidates=[[call]], passes=3, elapsed_ms=12.0)
    report = await observe_prediction(arrived(prediction), clock)
    assert report.error is None and report.passes == 3 and report.elapsed_ms == 12.0
    assert report.calls == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
