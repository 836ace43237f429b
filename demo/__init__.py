"""Built-in JAX workloads for ``jaxtop demo`` and examples for ``jaxtop run``."""
