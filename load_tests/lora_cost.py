"""What vLLM's LoRA costs the sidecar per pass, by which layers the engine wraps.

One sidecar engine per setting, built in a fresh process each (vLLM's parallel state is
process-global), timing the same slot-shaped requests: `--batch` prompts from the
distillation's `pairs.jsonl` at once (slots are submitted together), `--tokens` tokens each.

    python -m load_tests.lora_cost --adapter distill_out/adapter --pairs distill_out/pairs.jsonl

Settings: `none` (no LoRA), `all` (`sidecar.lora.modules: all`, every layer vLLM supports),
`adapter` (`modules: adapter`, the adapter's own layers). Prints the median time of a batch
per setting and its ratio to `none`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = ("none", "all", "adapter")


def measure(setting: str, adapter: str, pairs_file: Path, batch: int, tokens: int,
            rounds: int) -> list[float]:
    """Milliseconds per batch, in this process (one engine)."""
    from app.config import EngineConfig, SidecarLoraConfig
    from app.engine.vllm_engine import VllmEngine

    lora = None if setting == "none" else SidecarLoraConfig(path=adapter, modules=setting)
    engine = VllmEngine(EngineConfig(model="embedded", max_model_len=2048, kv_cache_gib=0.5,
                                     block_size=32), lora=lora)
    engine.start()
    lines = pairs_file.read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(line)["prompt_ids"] for line in lines[: batch * rounds]]
    sampling = {"max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}

    async def run() -> list[float]:
        times = []
        for start in range(0, len(prompts), batch):
            began = time.perf_counter()
            await asyncio.gather(*(engine.generate(p, sampling)
                                   for p in prompts[start:start + batch]))
            times.append((time.perf_counter() - began) * 1000)
        return times

    try:
        return asyncio.run(run())
    finally:
        engine.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--adapter", required=True, help="the LoRA adapter's folder")
    parser.add_argument("--pairs", required=True, type=Path, help="pairs (JSON Lines) to time")
    parser.add_argument("--batch", type=int, default=5, help="requests per batch")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per request")
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds per setting")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="settings compared, comma-separated")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one setting
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.adapter, args.pairs, args.batch, args.tokens,
                                 args.rounds)))
        return 0
    medians: dict[str, float] = {}
    for setting in args.settings.split(","):
        child = subprocess.run(
            [sys.executable, "-m", "load_tests.lora_cost", "--one", setting,
             "--adapter", args.adapter, "--pairs", str(args.pairs), "--batch", str(args.batch),
             "--tokens", str(args.tokens), "--rounds", str(args.rounds)],
            capture_output=True, text=True, check=True,
        )
        times = json.loads(child.stdout.strip().splitlines()[-1])
        medians[setting] = statistics.median(times)
        base = medians.get("none")
        ratio = f"  {medians[setting] / base:.2f}x of none" if base else ""
        print(f"{setting:8} median {medians[setting]:7.0f} ms per batch of {args.batch} "
              f"({len(times)} batches){ratio}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
