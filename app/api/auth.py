"""Optional API keys and per-key concurrency limits of the router.

Keys come from the config (`auth.api_keys`) and from an environment variable of the router
(`auth.api_keys_env`, comma-separated). With none the server is open and `authenticate` returns
the anonymous caller; with any, a request needs `Authorization: Bearer <key>` or, as Anthropic's
clients send it, `x-api-key: <key>` (401 otherwise).
Only SHA-256 digests of the keys are kept, compared in constant time; errors and metrics name a
key by its label (`name`, or `key-` and the digest's first 8 hex digits), never by the key.

`ConcurrencyLimiter` admits at most `max_concurrent` engine requests of one key at a time on
this router replica (a request counts its choices and their sidecar requests, app/api/work.py)
and answers the next with 429 and `Retry-After` (with several router replicas the limit holds
per replica). Callers without a key share `auth.max_concurrent_anonymous`, never more than the
router deployment's `max_ongoing_requests` (`anonymous_cap`). Keys may share a tenant
(`auth.api_keys[].tenant`): their per-tenant state and bounds are then one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from app.api.errors import ApiError
from app.config import ROUTER_MAX_ONGOING_REQUESTS, AuthConfig
from app.tenancy import ANONYMOUS_TENANT

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the key's label, its concurrency limit in engine requests (None:
    unlimited) and its tenant: the id that keeps its history and prefix cache apart from other
    keys' (derived from the key's digest, so it is stable, unique per key and reveals nothing
    of the key)."""

    key_id: str
    max_concurrent: int | None
    tenant: str = ANONYMOUS_TENANT


@dataclass(frozen=True)
class _Key:
    digest: bytes
    caller: Caller


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key",
                    headers={"WWW-Authenticate": 'Bearer realm="ooo-spec"'})


def tenant_of(digest: bytes, shared: str | None = None) -> str:
    """A key's tenant: its own (from its digest), or the configured `shared` one that several
    keys may name (from that name), both hashed so a tenant id reveals neither."""
    seed = b"ooo-spec tenant " + (digest if shared is None else b"name " + shared.encode())
    return f"tenant-{hashlib.sha256(seed).hexdigest()[:16]}"


def anonymous_cap(configured: int | None, router_capacity: int) -> int:
    """The anonymous callers' concurrency limit: what the config says, never more than the
    requests the router deployment holds at once (`max_ongoing_requests`), which it is when
    unset. Beyond it Serve queues requests where no limit answers them.

    >>> anonymous_cap(None, 64), anonymous_cap(256, 64), anonymous_cap(8, 64)
    (64, 64, 8)
    """
    return router_capacity if configured is None else min(configured, router_capacity)


class ApiKeys:
    def __init__(self, keys: list[tuple[str, str | None, int | None]], default_limit: int,
                 anonymous_limit: int | None = None,
                 tenants: Mapping[str, str] | None = None) -> None:
        """`keys`: (secret, label or None, own concurrency limit or None); `anonymous_limit`:
        the limit every caller shares while no key is configured (None: unlimited);
        `tenants`: the shared tenant name of a key, by secret (default: its own)."""
        self.anonymous = Caller(ANONYMOUS, anonymous_limit)
        self._keys: list[_Key] = []
        seen: set[bytes] = set()
        for secret, label, limit in keys:
            digest = _digest(secret)
            if digest in seen:
                continue
            seen.add(digest)
            key_id = label or f"key-{digest.hex()[:8]}"
            tenant = tenant_of(digest, (tenants or {}).get(secret))
            self._keys.append(_Key(digest, Caller(key_id, limit or default_limit, tenant)))

    @classmethod
    def from_config(cls, config: AuthConfig, environ: Mapping[str, str],
                    router_capacity: int = ROUTER_MAX_ONGOING_REQUESTS) -> ApiKeys:
        """`router_capacity`: the Router deployment's `max_ongoing_requests`, the most the
        anonymous callers may hold (`anonymous_cap`)."""
        keys: list[tuple[str, str | None, int | None]] = [
            (k.key.get_secret_value(), k.name, k.max_concurrent) for k in config.api_keys
        ]
        tenants = {k.key.get_secret_value(): k.tenant for k in config.api_keys
                   if k.tenant is not None}
        raw = environ.get(config.api_keys_env, "") if config.api_keys_env else ""
        keys.extend((part.strip(), None, None) for part in raw.split(",") if part.strip())
        return cls(keys, config.max_concurrent_per_key,
                   anonymous_cap(config.max_concurrent_anonymous, router_capacity), tenants)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def authenticate(self, authorization: str | None, api_key: str | None = None) -> Caller:
        """The caller of an `Authorization` header value, or, without one, of an `x-api-key`
        header value (`api_key`); raises a 401 `ApiError`."""
        if not self._keys:
            return self.anonymous
        if not authorization and api_key and api_key.strip():
            authorization = f"Bearer {api_key.strip()}"
        if not authorization:
            raise _unauthorized(
                "this server needs an API key: send 'Authorization: Bearer <key>' or "
                "'x-api-key: <key>'"
            )
        scheme, _, secret = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise _unauthorized("the Authorization header must be 'Bearer <key>'")
        digest = _digest(secret.strip())
        found: Caller | None = None
        for key in self._keys:  # every key is compared, so timing does not tell which matched
            if hmac.compare_digest(digest, key.digest):
                found = key.caller
        if found is None:
            raise _unauthorized("the API key is not valid")
        return found


class Slot:
    """The engine requests one admitted request holds of its caller's limit."""

    def __init__(self, limiter: ConcurrencyLimiter, caller: Caller) -> None:
        self._limiter = limiter
        self.caller = caller
        self.held = 0

    def resize(self, wanted: int) -> None:
        """Hold `wanted` engine requests instead (a 429 `ApiError` with `Retry-After` when the
        caller's other requests leave too few). A request wanting more than the whole limit
        is held as the whole limit: it runs only while the caller has nothing else in flight."""
        self._limiter.resize(self, wanted)

    def release(self) -> None:
        """Give everything back (safe to call more than once)."""
        self._limiter.resize(self, 0)


class ConcurrencyLimiter:
    """Engine requests in flight per key on this replica."""

    def __init__(self, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        self._in_flight: dict[str, int] = {}

    def in_flight(self, key_id: str) -> int:
        return self._in_flight.get(key_id, 0)

    def acquire(self, caller: Caller, wanted: int = 1) -> Slot:
        """A slot of `wanted` engine requests of `caller`'s limit (see `Slot.resize`)."""
        slot = Slot(self, caller)
        slot.resize(wanted)
        return slot

    def resize(self, slot: Slot, wanted: int) -> None:
        caller = slot.caller
        limit = caller.max_concurrent
        if limit is not None:
            wanted = min(wanted, limit)
        others = self._in_flight.get(caller.key_id, 0) - slot.held
        if limit is not None and wanted > slot.held and others + wanted > limit:
            raise ApiError(
                429,
                f"API key '{caller.key_id}' already has {others} engine requests in flight and "
                f"this request needs {wanted} (its choices and their sidecar requests); the "
                f"limit is {limit}. Retry after the running ones finish.",
                code="concurrency_limit_exceeded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        total = others + wanted
        if total > 0:
            self._in_flight[caller.key_id] = total
        else:
            self._in_flight.pop(caller.key_id, None)
        slot.held = wanted
