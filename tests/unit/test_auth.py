"""API keys and per-key concurrency limits (app.api.auth)."""

from __future__ import annotations

import pytest

from app.api.auth import ANONYMOUS, ApiKeys, Caller, ConcurrencyLimiter
from app.api.errors import ApiError
from app.config import AuthConfig


def keys(**config: object) -> ApiKeys:
    return ApiKeys.from_config(AuthConfig.model_validate(config), {})


def test_no_keys_means_open_with_the_anonymous_cap() -> None:
    open_server = keys(max_concurrent_anonymous=12)
    assert not open_server.enabled
    for header in (None, "", "Bearer anything", "garbage"):
        assert open_server.authenticate(header) == Caller(ANONYMOUS, 12)


@pytest.mark.parametrize(
    ("header", "needle"),
    [(None, "needs an API key"), ("", "needs an API key"), ("Basic abc", "Bearer <key>"),
     ("Bearer", "Bearer <key>"), ("Bearer   ", "Bearer <key>"),
     ("Bearer wrong-key-123", "not valid"), ("Bearer secret-one-x", "not valid")],
)
def test_bad_or_missing_key_is_401(header: str | None, needle: str) -> None:
    server = keys(api_keys=["secret-one"])
    with pytest.raises(ApiError) as caught:
        server.authenticate(header)
    err = caught.value
    assert err.status == 401 and needle in err.message
    assert err.headers["WWW-Authenticate"].startswith("Bearer")
    assert "secret-one" not in err.message


def test_config_and_env_keys_with_labels_and_limits() -> None:
    config = AuthConfig.model_validate({
        "api_keys": ["plain-key-1", {"key": "named-key-2", "name": "ci", "max_concurrent": 2}],
        "api_keys_env": "MY_KEYS",
        "max_concurrent_per_key": 5,
    })
    server = ApiKeys.from_config(config, {"MY_KEYS": " env-key-3 ,, env-key-4", "OTHER": "x"})
    named = server.authenticate("Bearer named-key-2")
    assert (named.key_id, named.max_concurrent) == ("ci", 2)
    assert server.authenticate("bearer  env-key-4 ").max_concurrent == 5
    plain = server.authenticate("Bearer plain-key-1")
    assert plain.key_id.startswith("key-") and "plain" not in plain.key_id
    assert server.authenticate("Bearer env-key-3").key_id != plain.key_id
    with pytest.raises(ApiError):
        server.authenticate("Bearer OTHER")


def test_each_key_is_its_own_tenant_and_the_tenant_hides_the_key() -> None:
    server = ApiKeys.from_config(
        AuthConfig.model_validate({"api_keys": [{"key": "key-aaaa-1111", "name": "same"},
                                                {"key": "key-bbbb-2222", "name": "same"}]}),
        {})
    first = server.authenticate("Bearer key-aaaa-1111")
    second = server.authenticate("Bearer key-bbbb-2222")
    assert first.tenant != second.tenant  # even under one label
    assert first.tenant == server.authenticate("Bearer key-aaaa-1111").tenant  # stable
    assert "aaaa" not in first.tenant and first.tenant.startswith("tenant-")
    assert ApiKeys.from_config(AuthConfig(max_concurrent_anonymous=7), {}).authenticate(
        None) == Caller("anonymous", 7, "anonymous")  # anonymous callers share a cap


def test_env_var_can_be_switched_off() -> None:
    config = AuthConfig.model_validate({"api_keys_env": None})
    assert not ApiKeys.from_config(config, {"OOO_SPEC_API_KEYS": "k-123456"}).enabled


def test_short_keys_are_a_config_error() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        AuthConfig.model_validate({"api_keys": ["short"]})


def test_concurrency_limit_is_per_key_with_retry_after() -> None:
    limiter = ConcurrencyLimiter(retry_after_s=3)
    a, b = Caller("a", 2), Caller("b", 1)
    a1 = limiter.acquire(a)
    limiter.acquire(a)
    limiter.acquire(b)  # another key's slots are its own
    with pytest.raises(ApiError) as caught:
        limiter.acquire(a)
    err = caught.value
    assert err.status == 429 and err.headers == {"Retry-After": "3"}
    assert "'a'" in err.message and "2" in err.message
    a1.release()
    a1.release()  # a second release must not free someone else's slot
    assert limiter.in_flight("a") == 1
    limiter.acquire(a)
    with pytest.raises(ApiError):
        limiter.acquire(a)


def test_anonymous_callers_are_not_limited() -> None:
    limiter = ConcurrencyLimiter(retry_after_s=1)
    slots = [limiter.acquire(Caller(ANONYMOUS, None)) for _ in range(100)]
    for slot in slots:
        slot.release()
    assert limiter.in_flight(ANONYMOUS) == 0


def test_the_limit_counts_engine_requests() -> None:
    limiter = ConcurrencyLimiter(retry_after_s=1)
    key = Caller("k", 10)
    first = limiter.acquire(key)  # admitted on one engine request, before the body is read
    first.resize(6)  # its checked request: 2 choices x (main + 2 sidecar slots)
    second = limiter.acquire(key)
    with pytest.raises(ApiError) as caught:
        second.resize(5)  # 6 + 5 > 10
    assert caught.value.status == 429 and "6 engine requests" in caught.value.message
    assert limiter.in_flight("k") == 7  # the refused one still holds its first request
    second.resize(4)
    assert limiter.in_flight("k") == 10
    with pytest.raises(ApiError):
        limiter.acquire(key)
    first.release()
    second.release()
    assert limiter.in_flight("k") == 0
    # A request that needs more than the whole limit runs alone, as the whole limit.
    alone = limiter.acquire(key)
    alone.resize(50)
    assert limiter.in_flight("k") == 10
    with pytest.raises(ApiError):
        limiter.acquire(key)
    alone.release()
    other = limiter.acquire(key)
    with pytest.raises(ApiError):
        limiter.acquire(key).resize(50)
    other.release()


def test_the_anonymous_cap_is_clamped_to_the_routers_capacity() -> None:
    """Unset, it is what the Router deployment holds at once; set higher, it is clamped to
    that (the router reads its own `max_ongoing_requests` at start)."""
    assert AuthConfig().max_concurrent_anonymous is None
    assert ApiKeys.from_config(AuthConfig(), {}).anonymous.max_concurrent == 64
    clamped = ApiKeys.from_config(AuthConfig(max_concurrent_anonymous=256), {}, 32)
    assert clamped.anonymous.max_concurrent == 32
    assert ApiKeys.from_config(AuthConfig(max_concurrent_anonymous=8), {}, 32).anonymous \
        .max_concurrent == 8


def test_keys_may_share_a_tenant() -> None:
    """`auth.api_keys[].tenant`: a client's keys are one tenant (one share of every per-tenant
    bound); keys without one are tenants of their own, as before."""
    config = AuthConfig.model_validate({"api_keys": [
        {"key": "first-key-acme", "tenant": "acme"}, {"key": "second-key-acme", "tenant": "acme"},
        {"key": "a-lone-key"}, {"key": "another-key"}]})
    keys = ApiKeys.from_config(config, {})
    tenants = [keys.authenticate(f"Bearer {k}").tenant
               for k in ("first-key-acme", "second-key-acme", "a-lone-key", "another-key")]
    assert tenants[0] == tenants[1]
    assert len(set(tenants)) == 3 and "acme" not in tenants[0]
    assert keys.authenticate("Bearer first-key-acme").key_id != keys.authenticate(
        "Bearer second-key-acme").key_id  # each key keeps its own concurrency limit
