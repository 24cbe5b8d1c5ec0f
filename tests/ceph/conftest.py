"""Ceph fixtures live in tests/conftest.py (shared with the integration tests)."""
