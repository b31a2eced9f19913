"""Many hosts on one machine, each a network namespace with its own stack and slotune
daemon (daemon/demo/fleet_hosts.py, which `slotune demo --fleet N` runs too); by hand
(as root):

    python -m bench.fleet --hosts 3 --slow host2     # up, a row per host every 10 s, Ctrl-C stops
"""
from __future__ import annotations

import sys

from slotune.demo.fleet_hosts import main

if __name__ == "__main__":
    sys.exit(main())
