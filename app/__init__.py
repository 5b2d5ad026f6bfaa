"""ooo-spec: out-of-order semantic speculation for LLM tool calling."""
