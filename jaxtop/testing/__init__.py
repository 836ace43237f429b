"""Helpers for tests and benchmarks: synthetic streams that look like an agent's (:mod:`.synthetic`)."""
