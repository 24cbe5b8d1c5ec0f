"""The `train` step (see core.py)."""
