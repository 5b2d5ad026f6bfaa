"""The test-only fault handle methods every deployment with a `FaultPlan` offers.

Reached through Ray handles only (never HTTP); `FaultPlan` refuses to arm unless the config
enables fault injection (app/faults.py)."""

from __future__ import annotations

from typing import Any

from app.faults import FaultPlan


class FaultHandles:
    faults: FaultPlan

    def inject_fault(self, kind: str, seconds: float = 60.0) -> dict[str, Any]:
        self.faults.arm(kind, seconds)
        return self.faults.status()

    def clear_faults(self) -> dict[str, Any]:
        self.faults.clear()
        return self.faults.status()

    def fault_status(self) -> dict[str, Any]:
        return self.faults.status()
