"""What the candidate store across processes costs a tensor-parallel engine per step.

A tensor-parallel main runs its proposer in vLLM's output-rank worker process, away from the
replica's `CandidateStore`; it reads the store through `app/drafting/candidate_channel.py`.
This times `CandidateProposer.propose` on the workload of `proposer_bench.py` (the same rows,
candidates and advances) twice at each batch size: reading an in-process store, and reading a
store that another process (spawned, as vLLM spawns its workers) serves on the channel. The
difference is the channel's cost per engine step. The serving process can keep one thread
spinning in Python the whole time (`--busy`), as the replica's engine thread does while it
polls vLLM's workers: then every answer waits for the interpreter lock.

    python -m load_tests.channel_bench                 # rows 1, 16, 64
    python -m load_tests.channel_bench --busy --steps 100 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import threading
from multiprocessing.connection import Connection
from typing import Any

from load_tests.proposer_bench import load_tokenizer, run


def replica_process(admin: Connection, busy: bool) -> None:
    """The replica: a `CandidateStore` served on the channel, filled on the bench's orders
    (`admin`, outside the timed steps)."""
    from app.drafting.candidate_channel import StoreServer
    from app.drafting.candidate_store import CandidateStore

    store = CandidateStore()
    server = StoreServer(store)
    stop = threading.Event()
    if busy:
        def spin() -> None:  # the engine thread polling its workers
            while not stop.is_set():
                pass

        threading.Thread(target=spin, daemon=True).start()
    admin.send((server.address, server.authkey))
    while True:
        kind, *args = admin.recv()
        if kind == "stop":
            stats = {"exchanges": getattr(server, "exchanges", None)}
            stop.set()
            server.close()
            admin.send(stats)
            return
        getattr(store, kind)(*args)
        admin.send(None)


class ReplicaClient:
    """The bench's handle on the replica's store: opens, fills and closes requests there."""

    def __init__(self, admin: Connection) -> None:
        self._admin = admin

    def _order(self, *message: Any) -> Any:
        self._admin.send(message)
        return self._admin.recv()

    def open(self, request_id: str, enabled: bool, realign: bool = True) -> None:
        self._order("open", request_id, enabled, realign)

    def add_candidates(self, request_id: str, candidates: list[str],
                       source: str = "sidecar") -> bool:
        self._order("add_candidates", request_id, candidates, source)
        return True

    def close(self, request_id: str) -> None:
        self._order("close", request_id)


def remote_run(rows: int, steps: int, tokenizer: Any, busy: bool) -> dict[str, Any]:
    from app.drafting.candidate_channel import RemoteStore

    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    process = spawn.Process(target=replica_process, args=(theirs, busy), daemon=True)
    process.start()
    try:
        address, authkey = ours.recv()
        reader = RemoteStore(address, authkey)
        result = run(rows, steps, tokenizer, replica=ReplicaClient(ours), reader=reader)
        reader.close()
        ours.send(("stop",))
        result.update(ours.recv())
    finally:
        process.join(timeout=30)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64],
                        help="batch sizes timed")
    parser.add_argument("--steps", type=int, default=100, help="steps per batch size")
    parser.add_argument("--busy", action="store_true",
                        help="keep a thread spinning in the serving process (its engine thread)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer()
    results = []
    for rows in args.rows:
        local = run(rows, args.steps, tokenizer)
        remote = remote_run(rows, args.steps, tokenizer, args.busy)
        results.append({"rows": rows, "local": local, "remote": remote,
                        "channel_us_per_step": remote["wall_us_median"]
                        - local["wall_us_median"]})
    print("propose() per engine step, wall µs p50: store in process vs across processes"
          + (" (serving process busy)" if args.busy else ""))
    print(f"{'rows':>6} {'local':>9} {'remote':>9} {'channel':>9} {'exchanges':>10} "
          f"{'drafted (local/remote)':>23}")
    for r in results:
        local, remote = r["local"], r["remote"]
        exchanges = remote.get("exchanges")
        print(f"{r['rows']:>6} {local['wall_us_median']:>9.0f} {remote['wall_us_median']:>9.0f} "
              f"{r['channel_us_per_step']:>9.0f} {exchanges if exchanges is not None else '-':>10} "
              f"{local['drafted_tokens']:>11}/{remote['drafted_tokens']:<11}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
