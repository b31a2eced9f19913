"""Default loopback ports of the stack's processes; each can be moved with
SLOTUNE_STACK_<NAME>_PORT (e.g. SLOTUNE_STACK_GATEWAY_PORT=9080) or a flag."""
from __future__ import annotations

import os

DEFAULTS = {"gateway": 8080, "inference": 8100, "sidecar": 8443, "sidecar_admin": 8444, "redis": 6390,
            "search": 8201, "calculator": 8202, "weather": 8203}


def port(name: str) -> int:
    env = f"SLOTUNE_STACK_{name.upper()}_PORT"
    value = os.environ.get(env)
    if value is None:
        return DEFAULTS[name]
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise SystemExit(f"{env}={value!r} is not a TCP port; set it to a number in 1..65535 or unset it")
    return int(value)
