"""Locust load test: OpenAI-style chat completions with tools drawn from BFCL.

Each simulated user picks BFCL cases at random (its own seeded stream, so a run is repeatable)
and posts them to `/v1/chat/completions` with `tool_choice: "required"` (`parallel_tool_calls`
for the parallel categories), as the local default's clients do. A request counts as failed
unless it is a 200 `chat.completion` with the `ooo_spec` report and either tool calls or a
`length` finish (max_tokens cut the call short: still a valid answer).

Run it headless and bounded with `make loadtest` (load_tests/loadtest.sh); by hand:

    locust -f load_tests/locustfile.py --headless -u 16 -r 4 -t 2m --host http://127.0.0.1:8000

Settings from the environment: OOO_SPEC_LOAD_CATEGORIES (default
`simple_python,multiple,parallel,parallel_multiple`), OOO_SPEC_LOAD_LIMIT (first N cases of each,
default 100), OOO_SPEC_LOAD_MODES (`ooo`, `plain` or both, comma-separated; default `ooo`),
OOO_SPEC_LOAD_MAX_TOKENS (default 256). At the end one line gives throughput, p50/p95/p99 and
the error count, and the exit code is 1 if any request failed.
"""

from __future__ import annotations

import itertools
import random
import sys
from typing import Any

from locust import FastHttpUser, between, events, task

# Locust imports this file by path: run it with the repository root on PYTHONPATH (as
# load_tests/loadtest.sh does) so that `load_tests` is importable.
from load_tests.bfcl import BfclCase, load_bfcl
from load_tests.load_requests import (
    REQUEST_TIMEOUT_S,
    check_completion,
    request_body,
    settings,
    summary_line,
)

_CASES: list[BfclCase] = []
_SEEDS = itertools.count(1)


@events.init.add_listener
def _load_cases(environment: Any, **_: Any) -> None:
    config = settings()
    for category in config["categories"]:
        _CASES.extend(load_bfcl(category, config["limit"]))
    if not _CASES:
        raise SystemExit("no BFCL cases to send: check OOO_SPEC_LOAD_CATEGORIES")


class ToolCallingUser(FastHttpUser):
    wait_time = between(0.0, 1.0)
    network_timeout = REQUEST_TIMEOUT_S
    connection_timeout = 30.0

    def on_start(self) -> None:
        self.rng = random.Random(next(_SEEDS))
        self.config = settings()

    @task
    def chat_completion(self) -> None:
        case = self.rng.choice(_CASES)
        mode = self.rng.choice(self.config["modes"])
        body = request_body(case, mode, self.config["max_tokens"])
        with self.client.post(
            "/v1/chat/completions", json=body, catch_response=True,
            name=f"chat.completions [{case.category}, {mode}]",
        ) as response:
            # `error` exists only on replies that failed below HTTP (refused, reset, timeout).
            problem = check_completion(response.status_code, response.text or "",
                                       getattr(response, "error", None))
            if problem is None:
                response.success()
            else:
                response.failure(problem)


@events.quitting.add_listener
def _summary(environment: Any, **_: Any) -> None:
    total = environment.stats.total
    if total.num_requests == 0:
        print("loadtest: no request was sent", file=sys.stderr)
        environment.process_exit_code = 1
        return
    line = summary_line(
        total.num_requests, total.num_failures,
        max(total.last_request_timestamp - total.start_time, 1e-9),
        {q: total.get_response_time_percentile(q) for q in (0.5, 0.95, 0.99)},
        total.max_response_time,
    )
    print(line, file=sys.stderr, flush=True)
    environment.process_exit_code = 1 if total.num_failures else 0
