"""Discrete-event simulators that run slotune's tuners in closed loop (bench/tuners.py ranks them)."""
