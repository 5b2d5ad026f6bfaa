"""Redeploying the running app (issue #14): an edit to a `deployments:` entry of the Serve config
(replicas, autoscaling, max_ongoing_requests) is applied to the running replicas, with no request
lost, while an edit to `args` (what the app does: here an engine setting) restarts them.

The session app is redeployed the way deployments/local.py deploys it, through Serve's
declarative API (the one KubeRay's serveConfigV2 goes through), and put back as it was at the
end. Replicas are told apart by their Ray actor ids.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import GOOD, serve_details, serves_normally, settled, wait_for

pytestmark = pytest.mark.e2e

KEPT = ("MainModel", "Sidecar", "Router")
SCALED_MAX_ONGOING = 12
RESTART_TIMEOUT_S = 600


def running_actors() -> dict[str, set[str]]:
    """Actor ids of each deployment's RUNNING replicas."""
    deployments = serve_details()["deployments"]
    return {name: {r["actor_id"] for r in d["replicas"] if r["state"] == "RUNNING"}
            for name, d in deployments.items()}


def entry(config: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [d for d in config["applications"][0]["deployments"] if d["name"] == name]
    assert isinstance(found, dict)
    return found


class Traffic:
    """Requests sent back to back from two threads until stopped; every status is kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[int | str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                r = httpx.post(f"{self.url}/v1/chat/completions", json=GOOD, timeout=120)
                self.results.append(r.status_code)
            except httpx.HTTPError as exc:
                self.results.append(repr(exc))

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)

    def wait_answers(self, count: int, timeout_s: float = 120) -> None:
        target = len(self.results) + count
        wait_for(f"{count} more answers", lambda: len(self.results) >= target, timeout_s)


def test_scaling_edit_keeps_replicas_and_engine_edit_restarts_them(
    app_url: str, serve_config: dict[str, Any]
) -> None:
    from deployments import local

    wait_for("the session app settled", settled, 300)
    before = running_actors()
    for name in KEPT:
        assert len(before[name]) == 1, before

    # 1. Only the main model's autoscaling and max_ongoing_requests change.
    scaled = copy.deepcopy(serve_config)
    main = entry(scaled, "MainModel")
    # Still one replica (the two cores are taken), scaling out at another load, more slowly.
    main["autoscaling_config"] = {**main["autoscaling_config"], "target_ongoing_requests": 4,
                                  "upscale_delay_s": 5, "downscale_delay_s": 60}
    main["max_ongoing_requests"] = SCALED_MAX_ONGOING
    assert scaled["applications"][0]["args"] == serve_config["applications"][0]["args"]

    def applied() -> bool:
        held = serve_details()["deployments"]["MainModel"]["deployment_config"]
        return (held["max_ongoing_requests"] == SCALED_MAX_ONGOING
                and held["autoscaling_config"]["target_ongoing_requests"] == 4 and settled())

    try:
        with Traffic(app_url) as traffic:
            traffic.wait_answers(2)  # requests are flowing before the redeploy
            started = len(traffic.results)
            local.deploy(scaled)
            wait_for("the new options held by Serve", applied, 120, every_s=0.2)
            traffic.wait_answers(4)  # and keep flowing after it
        during = traffic.results[started:]
        assert traffic.results and all(code == 200 for code in traffic.results), traffic.results
        assert len(during) >= 4, during
        after = running_actors()
        for name in KEPT:
            assert after[name] == before[name], (name, before[name], after[name])

        # 2. An engine setting is part of `args`: every replica restarts with the new config.
        engine_edit = copy.deepcopy(scaled)
        engine = engine_edit["applications"][0]["args"]["main"]["engine"]
        engine["max_num_seqs"] = engine["max_num_seqs"] // 2
        local.deploy(engine_edit)

        def restarted() -> bool:
            now = running_actors()
            return settled() and all(now[n] and not now[n] & before[n] for n in KEPT)

        wait_for("main and sidecar restarted", restarted, RESTART_TIMEOUT_S, every_s=1)
        serves_normally(app_url)
    finally:
        # Put the session app back as the other tests expect it (a restart again).
        restored_from = running_actors()
        local.deploy(serve_config)

        def restored() -> bool:
            now = running_actors()
            held = serve_details()["deployments"]["MainModel"]["deployment_config"]
            return (settled() and held["max_ongoing_requests"] == 16
                    and (now["MainModel"] != restored_from["MainModel"]
                         or restored_from["MainModel"] == before["MainModel"]))

        wait_for("the session config restored", restored, RESTART_TIMEOUT_S, every_s=1)
        local.wait_ready(app_url)
