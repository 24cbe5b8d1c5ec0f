# pipectl: the two commands of the README are `make demo` and `make test`.
SHELL := /bin/bash
VENV := .venv

.PHONY: setup demo test test-unit render golden clean

setup:
	bash scripts/setup.sh

# Set up, then train and register a model end to end on this machine (embedded S3 + MLflow).
demo: setup
	$(VENV)/bin/pipectl run training

# Set up, then run every test (unit, golden, integration with real local services).
test: setup
	$(VENV)/bin/pytest

test-unit: setup
	$(VENV)/bin/pytest tests/unit tests/golden

render: setup
	$(VENV)/bin/pipectl render training

# Regenerate the checked-in rendered manifests under argo/ (never done silently by tests).
golden: setup
	rm -rf argo && $(VENV)/bin/pipectl render cluster --write argo

clean:
	rm -rf .pipectl .pytest_cache
