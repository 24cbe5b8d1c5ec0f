"""Benchmarks: pipectl side by side with the tool a user would pick instead.

Not collected by ``pytest`` (``tests/conftest.py`` ignores this folder; files are ``bench_*.py``).
Run with ``make bench`` or ``python -m tests.bench.run [name ...]``.
"""
