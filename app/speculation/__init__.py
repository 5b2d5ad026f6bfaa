"""Candidates: canonical form, validation, the sidecar's output schema, reconciliation."""
