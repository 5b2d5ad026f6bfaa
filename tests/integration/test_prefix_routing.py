"""`PrefixAffinityRouter` on real Ray Serve (issue 31): two replicas of a stand-in deployment
that answers with its replica id (no engine: what is tested is where Serve sends each request),
the router set through `request_router_config` as configs/*.yaml set it, and multi-turn
conversations of several tenants sent through a deployment handle, as the Router sends them to
the MainModel. With the router, a follow-up turn lands where the previous turn ran; with
Serve's default router the same traffic is printed for comparison (two runs: 24/24 follow-ups
on the previous turn's replica with the router both times, 11/24 and 12/24 with Serve's
default). Then a redeploy to one replica (`serve.run` of the app again: a new version, so both
replicas are replaced) while the same handle goes on: its router drops the replicas that left,
and every request is answered by the new one.

The Ray instance runs in a subprocess (this module run with `-m`), like test_serve_options.py,
so it neither meets nor disturbs the session app of the e2e tests. About 25 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ROUTER = "deployments.prefix_router:PrefixAffinityRouter"
TENANTS = 6
TURNS = 5
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}}}}]


def conversation(tenant: int, turn: int) -> dict[str, Any]:
    """The payload of `tenant`'s turn `turn`: its question, then a call and a result per turn.
    Every tenant asks the same question: only the tenant keeps them apart."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look up a, b, c and d."}]
    for i in range(turn):
        messages += [{"role": "assistant", "tool_calls": [{"id": f"c{i}", "type": "function",
                      "function": {"name": "lookup", "arguments": f'{{"key": "{i}"}}'}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": f"value {i} " * 20}]
    return {"messages": messages, "tools": TOOLS, "_tenant": f"tenant-{tenant}"}


def _probe(out: Path) -> None:
    import ray
    from ray import serve

    from app.tenancy import TENANT_KEY

    assert TENANT_KEY == "_tenant"

    class StandIn:
        def generate(self, payload: dict[str, Any], call_sidecar: bool) -> str:
            return str(serve.get_replica_context().replica_id.unique_id)

    replica: Any = serve.deployment(StandIn, name="Replica",
                                    ray_actor_options={"num_cpus": 0}, max_ongoing_requests=8)

    def run(handle: Any) -> list[list[str]]:
        """Each tenant's turns in order, the tenants interleaved at random; per tenant, the
        replica of each turn."""
        rng = random.Random(7)
        order = [t for t in range(TENANTS) for _ in range(TURNS)]
        rng.shuffle(order)
        seen: list[list[str]] = [[] for _ in range(TENANTS)]
        for tenant in order:
            payload = conversation(tenant, len(seen[tenant]))
            seen[tenant].append(handle.generate.remote(payload, False).result(timeout_s=60))
        return seen

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             namespace=f"ooo-spec-prefix-routing-{uuid.uuid4().hex[:8]}",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        serve.start(proxy_location="Disabled")
        affinity = {"request_router_class": ROUTER,
                    "request_router_kwargs": {"min_match_chars": 100}}
        result: dict[str, Any] = {}
        handles: dict[str, Any] = {}
        for name, config in (("affinity", affinity), ("default", None)):
            options: dict[str, Any] = {"num_replicas": 2}
            if config is not None:
                options["request_router_config"] = config
            handles[name] = serve.run(replica.options(**options).bind(), name=name,
                                      route_prefix=None)
            result[name] = run(handles[name])
        # Redeploy the affinity app with one replica (a new version: both are replaced). The
        # same handle (its router holds every tenant's prefixes) goes on: nothing fails.
        serve.run(replica.options(num_replicas=1, request_router_config=affinity).bind(),
                  name="affinity", route_prefix=None)
        result["after_redeploy"] = run(handles["affinity"])
        out.write_text(json.dumps(result))
    finally:
        ray.shutdown()


def follow_ups_on_previous(seen: list[list[str]]) -> tuple[int, int]:
    same = sum(1 for turns in seen for a, b in zip(turns, turns[1:], strict=False) if a == b)
    return same, sum(len(turns) - 1 for turns in seen)


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("prefix_routing") / "routed.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "tests.integration.test_prefix_routing",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and out.exists(), (
        f"probe failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_follow_up_turns_land_where_their_previous_turn_ran(routed: dict[str, Any]) -> None:
    same, total = follow_ups_on_previous(routed["affinity"])
    default_same, _ = follow_ups_on_previous(routed["default"])
    print(f"follow-ups on the previous turn's replica: affinity {same}/{total}, "
          f"Serve's default router {default_same}/{total}")
    assert same >= 0.9 * total, routed["affinity"]
    # Both replicas served: affinity did not pin every tenant to one.
    assert len({r for turns in routed["affinity"] for r in turns}) == 2, routed["affinity"]


def test_replicas_that_left_are_never_chosen_and_no_request_fails(
    routed: dict[str, Any],
) -> None:
    after = routed["after_redeploy"]
    assert all(len(turns) == TURNS for turns in after)  # every request answered
    serving = {r for turns in after for r in turns}
    gone = {r for turns in routed["affinity"] for r in turns}
    assert len(serving) == 1 and not serving & gone, after


if __name__ == "__main__":
    _probe(Path(sys.argv[1]))
