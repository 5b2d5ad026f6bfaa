"""The per-tenant cache every shared structure of a replica uses (app/tenancy.py `TenantLru`)."""

from __future__ import annotations

import pytest

from app.tenancy import TenantLru


def test_each_tenant_keeps_its_own_least_recently_used_within_its_share() -> None:
    cache: TenantLru[str, int] = TenantLru(per_tenant=3, total=100)
    for i in range(5):
        cache.put("a", f"k{i}", i)
    assert cache.held("a") == 3 and len(cache) == 3
    assert cache.get("a", "k0") is None and cache.get("a", "k4") == 4
    assert cache.get("b", "k4") is None  # never another tenant's entry


def test_a_full_cache_takes_from_the_tenant_holding_the_most() -> None:
    cache: TenantLru[str, int] = TenantLru(per_tenant=4, total=6)
    cache.put("victim", "v", 1)
    cache.put("other", "o", 2)
    for flooder in range(3):  # several tenants (several keys) flooding together
        for i in range(10):
            cache.put(f"flooder-{flooder}", str(i), i)
    assert len(cache) == 6
    assert cache.get("victim", "v") == 1 and cache.get("other", "o") == 2
    # The flooders share what is left, each down to its newest entries.
    assert sum(cache.held(f"flooder-{f}") for f in range(3)) == 4


def test_the_share_must_fit_the_total() -> None:
    with pytest.raises(ValueError):
        TenantLru(per_tenant=5, total=4)
