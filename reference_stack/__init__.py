"""The reference stack slotune ships with and watches: an agent gateway, tool
servers, a TLS sidecar and a batching inference server, each a separate
process started as `python -m reference_stack <service>`, plus a load
generator and `up`/`down` to run them all on loopback."""
