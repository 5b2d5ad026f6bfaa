"""The bench's modes: a name plus the request extras that select it, in the registry `MODES`
(`register_mode`), which `--modes` and `--help` read; the order of the modes for each case."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from load_tests.bench.datasets import AGENT_SOURCES

BASELINE = "plain"
# The second baseline every ratio is also given against, when the run has it.
PEER = "ngram"
SUFFIX = "suffix"  # vLLM's suffix decoding: the other peer ratios are given against
PEERS = (PEER, SUFFIX)
SIDECAR = "sidecar"
SIDECAR_VERIFY = "sidecar+verify"
SIDECAR_BASE = "sidecar:base"  # the sidecar without its LoRA adapter (sidecar.lora)
DRAFTS = "drafts"


@dataclass(frozen=True)
class Mode:
    """A decoding mode: the extra request body (merged into `extra_body`) that selects it."""

    name: str
    extra_body: Mapping[str, Any]
    description: str = ""
    sources: frozenset[str] | None = None  # dataset sources it runs on; None = all

    def applies_to(self, source: str) -> bool:
        return self.sources is None or source in self.sources


MODES: dict[str, Mode] = {}


def register_mode(
    name: str,
    extra_body: Mapping[str, Any],
    description: str = "",
    sources: Iterable[str] | None = None,
) -> Mode:
    """Add (or replace) a mode; `--modes` then accepts `name`."""
    if not name or "," in name or name != name.strip():
        raise ValueError(f"bad mode name {name!r}")
    mode = Mode(name, dict(extra_body), description,
                frozenset(sources) if sources is not None else None)
    MODES[name] = mode
    return mode


register_mode(BASELINE, {"ooo_spec": {"enabled": False}}, "plain decoding (the baseline)")
register_mode(PEER, {"ooo_spec": {"enabled": False, "baseline": "ngram"}},
              "vLLM's own n-gram (prompt lookup) speculation on the second main engine")
# vLLM's suffix decoding at its defaults, what a team serving an agent would run instead.
register_mode(SUFFIX, {"ooo_spec": {"enabled": False, "baseline": SUFFIX}},
              "vLLM's own suffix decoding (arctic-inference) on a further main engine")
register_mode("ooo", {"ooo_spec": {"enabled": True, "pre_execute": False}},
              "out-of-order semantic speculation, no tool pre-execution")
# What the sidecar adds: the same drafting from the tool schemas and prompt lookup, no sidecar.
register_mode(DRAFTS, {"ooo_spec": {"enabled": True, "pre_execute": False, "sidecar": False}},
              "speculation without the sidecar: schema drafts and prompt lookup only")
register_mode("ooo+tools", {"ooo_spec": {"enabled": True, "pre_execute": True}},
              "speculation plus pre-execution of predicted server-known tools",
              sources=AGENT_SOURCES)
# What re-alignment after a divergence is worth: drafting stops at the first mismatch.
register_mode("ooo:no-realign",
              {"ooo_spec": {"enabled": True, "pre_execute": False,
                            "diagnostics": {"realign": False}}},
              "speculation without re-alignment (prefix-only drafting)", sources=["bfcl"])
# What sizing drafts by their worth is worth: `ooo` with every draft run to the budget. Sizing
# is off by default, so the server must turn it on for the two to differ.
register_mode("ooo:budget",
              {"ooo_spec": {"enabled": True, "pre_execute": False,
                            "diagnostics": {"draft_worth": False}}},
              "as `ooo`, every draft run to its budget (drafts not sized by their worth; the "
              "same as `ooo` unless the server sets speculation.draft_worth.enabled)")
# What stopping schema drafts at the values is worth: `ooo` with them drafted through.
register_mode("ooo:through",
              {"ooo_spec": {"enabled": True, "pre_execute": False,
                            "diagnostics": {"value_stops": False}}},
              "as `ooo`, drafts from the schemas run on through the values they leave open")
# The sidecar's own numbers: the response waits for its prediction, even a late one, so its
# readiness and agreement with plain's call are measured on every case (latency not comparable).
register_mode(SIDECAR, {"ooo_spec": {"enabled": True, "pre_execute": False,
                                     "diagnostics": {"await_prediction": True}}},
              "speculation, reporting the sidecar's prediction whenever it arrives",
              sources=["bfcl"])
register_mode(SIDECAR_VERIFY, {"ooo_spec": {"enabled": True, "pre_execute": False,
                                            "diagnostics": {"await_prediction": True,
                                                            "verify_prediction": True}}},
              "as `sidecar`, the sidecar verifying its slots in one drafted pass",
              sources=["bfcl"])
register_mode(SIDECAR_BASE, {"ooo_spec": {"enabled": True, "pre_execute": False,
                                          "diagnostics": {"await_prediction": True,
                                                          "sidecar_adapter": False}}},
              "as `sidecar`, the sidecar's base model without its LoRA adapter",
              sources=["bfcl"])
# What the adapter does end to end: `ooo` with the sidecar's base model.
register_mode("ooo:base", {"ooo_spec": {"enabled": True, "pre_execute": False,
                                        "diagnostics": {"sidecar_adapter": False}}},
              "as `ooo`, the sidecar's base model without its LoRA adapter")


def parse_modes(spec: str) -> list[Mode]:
    """`"plain,ooo"` -> the registered modes, in that order (no duplicates)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError("no mode given")
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(
            f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"mode listed twice in {spec!r}")
    return [MODES[n] for n in names]


def mode_order(modes: Sequence[Mode], index: int) -> list[Mode]:
    """The modes for the `index`-th case, rotated by `index` (cancels warm/cold bias)."""
    if not modes:
        return []
    shift = index % len(modes)
    return [*modes[shift:], *modes[:shift]]
