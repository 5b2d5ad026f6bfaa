"""Who a request is for: the tenant names every layer shares.

The router derives the tenant from the API key (`app/api/auth.py`); the main replica keeps
history per tenant, the sidecar salts its prefix cache with it, and the tool worker runs each
call in its tenant's context (`app/tools/call_context.py`). Here, below all of them, so each
may import it; with `TenantLru`, the bounded per-tenant cache their shared structures use (the
grammar-verdict cache), so that no tenant can evict another's entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

ANONYMOUS_TENANT = "anonymous"
# The key of the router's payload to the main replica and the sidecar that carries the tenant
# (set by the router after validation; a client's body cannot hold it: unknown keys are a 400).
TENANT_KEY = "_tenant"


class TenantLru(Generic[K, V]):
    """A cache kept per tenant: each tenant holds at most `per_tenant` entries (its own least
    recently used go first), all tenants together at most `total`, and when that is full the
    tenant holding the most loses its least recently used entry. So one tenant's flood of
    entries evicts its own, never another tenant's while that one holds less. Not
    thread-safe: each user calls it from one thread (an event loop).

    >>> cache: TenantLru[str, int] = TenantLru(per_tenant=2, total=3)
    >>> cache.put("a", "x", 1); cache.put("b", "x", 2)
    >>> for i in range(5): cache.put("flood", str(i), i)
    >>> cache.get("a", "x"), cache.get("b", "x"), cache.held("flood")
    (1, 2, 1)
    """

    def __init__(self, per_tenant: int, total: int) -> None:
        if not 1 <= per_tenant <= total:
            raise ValueError("a tenant cache needs 1 <= per_tenant <= total")
        self.per_tenant = per_tenant
        self.total = total
        self._tenants: OrderedDict[str, OrderedDict[K, V]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def held(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))

    def items(self) -> list[tuple[str, K, V]]:
        """(tenant, key, value) of every entry, each tenant's least recently used first."""
        return [(t, k, v) for t, entries in self._tenants.items() for k, v in entries.items()]

    def get(self, tenant: str, key: K) -> V | None:
        entries = self._tenants.get(tenant)
        if entries is None or key not in entries:
            return None
        entries.move_to_end(key)
        self._tenants.move_to_end(tenant)
        return entries[key]

    def put(self, tenant: str, key: K, value: V) -> None:
        entries = self._tenants.setdefault(tenant, OrderedDict())
        self._tenants.move_to_end(tenant)
        if key not in entries:
            self._size += 1
        entries[key] = value
        entries.move_to_end(key)
        if len(entries) > self.per_tenant:
            entries.popitem(last=False)
            self._size -= 1
        while self._size > self.total:
            # The least recently used of the tenants holding the most (`max` keeps the first).
            largest = max(self._tenants, key=lambda t: len(self._tenants[t]))
            self._tenants[largest].popitem(last=False)
            self._size -= 1
            if not self._tenants[largest]:
                del self._tenants[largest]
