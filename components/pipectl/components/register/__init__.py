"""The `register` step (see core.py)."""
