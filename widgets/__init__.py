"""Textual widgets of the dashboard: they render what the model hands them."""
