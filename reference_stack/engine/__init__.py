"""A real inference engine for slotune to watch: vLLM's CPU build serving a tiny
Llama made on the machine (tiny_model.py), started and stopped by serve.py."""
