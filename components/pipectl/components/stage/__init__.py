"""The `stage` step (see core.py)."""
