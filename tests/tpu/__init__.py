"""Tests that need a TPU chip (skipped with the reason where there is none).

A package so that its conftest.py does not take the name of tests/conftest.py:
pytest imports both, and two top-level modules named ``conftest`` would clash.
"""
