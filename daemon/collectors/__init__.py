"""Collectors: each turns one source (kernel maps, NVML, /proc, a service's own
/metrics) into one Sample per service per collection interval."""
