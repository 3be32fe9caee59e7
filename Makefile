# The two set-up commands in README.md are `make demo` and `make test`; both create or reuse .venv.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

.PHONY: venv demo test lint bench bench-peers
venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sandforge demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check sandforge runtime sandbox policies images bench tests
	$(VENV)/bin/mypy sandforge  # follows sandforge/'s links: every module under its installed name
	$(VENV)/bin/lint-imports --no-cache --no-logo  # the import contracts in pyproject.toml ([tool.importlinter])

bench: $(STAMP)
	$(VENV)/bin/python -m bench
	$(VENV)/bin/python bench/bench_serve.py --out bench/results/serve.json

# The peers (llm-sandbox, smolagents) live in their own venv, never in the project's dependencies.
bench-peers: $(STAMP)
	$(VENV)/bin/python -c 'from bench.subjects import ensure_peers_venv; ensure_peers_venv(print)'
