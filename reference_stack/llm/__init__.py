"""The inference server's LLM mode: OpenAI-compatible completions served by an
iteration-level (continuous-batching) scheduler over a per-sequence KV cache."""
