"""The sidecar service: predicts a tool call with its own engine (slots or the whole call)."""
