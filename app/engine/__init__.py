"""Model engines and their platform: vLLM wrapper, engine arguments, GPU and driver, placement."""
