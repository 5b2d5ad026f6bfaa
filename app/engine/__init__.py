"""Model engines: vLLM wrapper, embedded model, candidate proposer and store."""
