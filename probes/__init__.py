"""Probes: each reads one source (jax, stderr guard lines, psutil, NVML,
jax.monitoring, warnings) and returns plain dicts. None imports Textual, so
``import jaxtop.probes`` works in a job that has only jax installed."""
