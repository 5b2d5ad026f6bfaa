"""The router's gate on sidecar calls (app/api/sidecar_gate.py)."""

from app.api.sidecar_gate import SidecarGate


def test_past_the_limit_requests_skip_the_sidecar_until_one_is_released() -> None:
    gate = SidecarGate(limit=2)
    first, second = gate.admit(), gate.admit()
    assert first is not None and second is not None and gate.pending == 2
    assert gate.admit() is None and gate.skipped == 1
    first()
    third = gate.admit()
    assert third is not None and gate.pending == 2


def test_a_release_counts_once() -> None:
    """The prediction's arrival and the turn's end both release the same call."""
    gate = SidecarGate(limit=1)
    release = gate.admit()
    assert release is not None
    release()
    release()
    assert gate.pending == 0
    other = gate.admit()
    assert other is not None and gate.pending == 1
    release()  # a late second release of the first call must not free the second's slot
    assert gate.pending == 1 and gate.admit() is None


def test_no_limit_never_skips() -> None:
    gate = SidecarGate(limit=None)
    assert all(gate.admit() is not None for _ in range(1000))
    assert gate.skipped == 0 and gate.pending == 1000
