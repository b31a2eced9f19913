"""slotune: the host daemon that watches services from the kernel and the GPU,
attributes their tail latency to causes, and tunes their settings."""
