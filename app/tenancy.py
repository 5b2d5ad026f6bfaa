"""Who a request is for: the tenant names every layer shares.

The router derives the tenant from the API key (`app/api/auth.py`); the main replica keeps
history per tenant, the sidecar salts its prefix cache with it, and the tool worker runs each
call in its tenant's context (`app/tools/call_context.py`). Here, below all of them, so each
may import it.
"""

from __future__ import annotations

ANONYMOUS_TENANT = "anonymous"
# The key of the router's payload to the main replica and the sidecar that carries the tenant
# (set by the router after validation; a client's body cannot hold it: unknown keys are a 400).
TENANT_KEY = "_tenant"
