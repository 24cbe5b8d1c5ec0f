"""The `preprocess` step (see core.py)."""
