"""Drafting: the vLLM proposer, candidate store and channel, alignment, the draft sources."""
