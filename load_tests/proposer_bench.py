"""Microbenchmark of `CandidateProposer.propose`: microseconds per row per engine step.

At GPU batch sizes an engine step of an 8B model takes a few milliseconds; the proposer runs on
the engine's step thread between steps, so its cost per step must stay well below that. This
drives the real proposer with the embedded model's tokenizer and a fake model runner (only the
batch bookkeeping vLLM's runner gives the proposer: request ids and prompt lengths), on rows
that decode realistic forced calls: BFCL-like tools with several parameters, the schema's
placeholder candidates for every offered tool plus a sidecar prediction, each in every
whitespace style the main model is seen to use. Rows advance 1 to 4 tokens per step as
accepted drafts do; some follow the prediction, some leave it (another value), so both the
prefix path and re-alignment are timed.

    python -m load_tests.proposer_bench            # batches 1, 16, 64, 256
    python -m load_tests.proposer_bench --rows 64 --steps 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from app.drafting.candidate_proposer import CandidateProposer
from app.drafting.candidate_store import CandidateStore
from app.formats.tool_format import ParsedCall, placeholder_call, render_forced_variants

MAX_MODEL_LEN = 4096
PROMPT_LEN = 300
K = 16


def _tool(name: str, params: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": params, "required": required}}}


TOOLS = [
    _tool("get_weather_forecast", {
        "city": {"type": "string"}, "country_code": {"type": "string"},
        "days": {"type": "integer"}, "units": {"type": "string", "enum": ["metric", "imperial"]},
    }, ["city", "days"]),
    _tool("book_flight_ticket", {
        "origin": {"type": "string"}, "destination": {"type": "string"},
        "date": {"type": "string"}, "passengers": {"type": "integer"},
        "cabin": {"type": "string", "enum": ["economy", "business"]},
    }, ["origin", "destination", "date"]),
    _tool("calculate_mortgage_payment", {
        "principal": {"type": "number"}, "annual_rate": {"type": "number"},
        "years": {"type": "integer"},
    }, ["principal", "annual_rate", "years"]),
    _tool("search_restaurants", {
        "location": {"type": "string"}, "cuisine": {"type": "string"},
        "max_price": {"type": "integer"}, "open_now": {"type": "boolean"},
    }, ["location"]),
]

PREDICTIONS = [
    ParsedCall("get_weather_forecast", {"city": "San Francisco", "days": 5, "units": "metric"}),
    ParsedCall("book_flight_ticket", {"origin": "Boston", "destination": "Lisbon",
                                      "date": "2026-05-12", "passengers": 2}),
    ParsedCall("calculate_mortgage_payment", {"principal": 350000, "annual_rate": 4.25,
                                              "years": 30}),
    ParsedCall("search_restaurants", {"location": "Chicago, IL", "cuisine": "Thai",
                                      "open_now": True}),
]

# What the model writes instead, on rows that leave the prediction (another value).
DEVIATIONS = [
    ParsedCall("get_weather_forecast", {"city": "San Jose", "days": 7, "units": "metric"}),
    ParsedCall("book_flight_ticket", {"origin": "Boston", "destination": "Porto",
                                      "date": "2026-05-12", "passengers": 2}),
    ParsedCall("calculate_mortgage_payment", {"principal": 350000, "annual_rate": 3.9,
                                              "years": 15}),
    ParsedCall("search_restaurants", {"location": "Chicago", "cuisine": "Thai food",
                                      "open_now": True}),
]


def candidate_texts(prediction: ParsedCall) -> list[str]:
    """What the main replica puts in the store for a `multiple`-style request: the sidecar's
    prediction, then every tool's placeholder call, each in every whitespace style."""
    texts = render_forced_variants([prediction], TOOLS, None)
    for tool in TOOLS:
        texts += render_forced_variants([placeholder_call(tool)], TOOLS, None)
    return texts


@dataclass
class Row:
    req_id: str
    target: list[int]  # the tokens this row will have generated at the end
    prediction: ParsedCall
    done: int = 0
    served: int = 0  # requests this row has finished


def fresh_prediction(call: ParsedCall, serial: int) -> ParsedCall:
    """The sidecar predicts anew for every request: a text the proposer has not seen (the
    schema placeholders, the same for every request with these tools, stay)."""
    arguments = dict(call.arguments)
    arguments["request_serial"] = serial
    return ParsedCall(call.name, arguments)


def make_rows(n: int, tokenizer: Any, rng: random.Random) -> list[Row]:
    rows: list[Row] = []
    for i in range(n):
        which = i % len(PREDICTIONS)
        leaves = i % 3 == 2  # a third of the rows write another value than predicted
        written = (DEVIATIONS if leaves else PREDICTIONS)[which]
        style = rng.choice([{}, {"indent": 4}, {"indent": 2}])
        text = render_forced_variants([written], TOOLS, None)[[{}, {"indent": 4},
                                                                {"indent": 2}].index(style)]
        rows.append(Row(f"req-{i}", tokenizer.encode(text, add_special_tokens=False),
                        PREDICTIONS[which]))
    return rows


def fake_runner(rows: list[Row]) -> Any:
    batch = SimpleNamespace(req_ids=[r.req_id for r in rows],
                            num_prompt_tokens=np.full(len(rows), PROMPT_LEN, dtype=np.int32))
    return SimpleNamespace(input_batch=batch)


def run(n_rows: int, steps: int, tokenizer: Any, seed: int = 0, replica: Any = None,
        reader: Any = None) -> dict[str, Any]:
    """`replica`: where requests and candidates go (a `CandidateStore` by default); `reader`:
    what the proposer reads (the replica itself by default; a `RemoteStore` in
    `channel_bench.py`)."""
    rng = random.Random(seed)
    rows = make_rows(n_rows, tokenizer, rng)
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K),
                             model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN))
    proposer = CandidateProposer(config)
    store = replica if replica is not None else CandidateStore()
    proposer.bind(reader if reader is not None else store, None, tokenizer,
                  prompt_lookup_fallback=True, lookup_min=2, lookup_max=4)
    token_ids = np.zeros((n_rows, MAX_MODEL_LEN), dtype=np.int32)
    prompt = tokenizer.encode("You are a helpful assistant. " * 40, add_special_tokens=False)
    serial = 0

    def admit(row: Row) -> None:
        nonlocal serial
        serial += 1
        row.req_id = f"req-{serial}"
        store.open(row.req_id, enabled=True)
        store.add_candidates(row.req_id, candidate_texts(fresh_prediction(row.prediction,
                                                                          serial)))

    for i, row in enumerate(rows):
        admit(row)
        token_ids[i, :PROMPT_LEN] = (prompt * 10)[:PROMPT_LEN]
    runner = fake_runner(rows)
    proposer.runner = runner
    per_step_us: list[float] = []
    # CPU time of this thread: what one core spends, whatever else the machine runs.
    per_step_cpu_us: list[float] = []
    drafted = 0
    for _ in range(steps):
        num_tokens = np.zeros(n_rows, dtype=np.int32)
        sampled: list[list[int]] = []
        for i, row in enumerate(rows):
            if row.done >= len(row.target):  # finished: a new request takes the row
                row.done = 0
                store.close(row.req_id)
                admit(row)
                runner.input_batch.req_ids[i] = row.req_id
            advance = min(rng.randint(1, 4), len(row.target) - row.done)
            new = row.target[row.done: row.done + advance]
            token_ids[i, PROMPT_LEN + row.done: PROMPT_LEN + row.done + advance] = new
            row.done += advance
            num_tokens[i] = PROMPT_LEN + row.done
            sampled.append(new)
        start, start_cpu = time.perf_counter(), time.thread_time()
        drafts = proposer.propose(sampled, num_tokens, token_ids)
        per_step_cpu_us.append((time.thread_time() - start_cpu) * 1e6)
        per_step_us.append((time.perf_counter() - start) * 1e6)
        drafted += sum(len(d) for d in drafts)
    cpu = statistics.median(per_step_cpu_us)
    return {"rows": n_rows, "steps": steps, "cpu_us_median": cpu,
            "cpu_us_p95": _p95(per_step_cpu_us), "wall_us_median": statistics.median(per_step_us),
            "cpu_us_per_row_step": cpu / n_rows, "drafted_tokens": drafted}


def _p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))]


def load_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from app.engine.embedded_model import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("embedded"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256],
                        help="batch sizes timed")
    parser.add_argument("--steps", type=int, default=100, help="steps per batch size")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer()
    results = [run(n, args.steps, tokenizer) for n in args.rows]
    print("propose() per engine step, CPU time of the calling thread (wall clock beside it)")
    print(f"{'rows':>6} {'CPU µs p50':>11} {'CPU µs p95':>11} {'µs/row':>8} {'wall µs p50':>12}")
    for r in results:
        print(f"{r['rows']:>6} {r['cpu_us_median']:>11.0f} {r['cpu_us_p95']:>11.0f} "
              f"{r['cpu_us_per_row_step']:>8.1f} {r['wall_us_median']:>12.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
