"""The `evaluate` step (see core.py)."""
