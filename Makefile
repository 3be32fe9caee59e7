# The two set-up commands in README.md are `make demo` and `make test`; both create or reuse .venv.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# uv (a dependency anyway) installs the project in seconds where pip takes minutes; pip stays in the venv. uv
# reads the system's certificate store (UV_NATIVE_TLS), the one pip.conf points pip at.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	test -x $(VENV)/bin/uv || $(VENV)/bin/pip install -q uv
	UV_NATIVE_TLS=1 $(VENV)/bin/uv pip install -q --python $(VENV)/bin/python -e '.[dev]'
	touch $(STAMP)

.PHONY: venv demo test lint bench bench-peers
venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sandforge demo

# Tests wait on containers, servers and subprocesses: TEST_WORKERS may exceed the cores. loadgroup keeps a
# file's module-scoped set-up on one worker and --no-loadscope-reorder the slowest files first (tests/durations.py).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check sandforge runtime sandbox policies images bench tests integrations examples
	$(VENV)/bin/mypy sandforge  # follows sandforge/'s links: every module under its installed name
	$(VENV)/bin/lint-imports --no-cache --no-logo  # the import contracts in pyproject.toml ([tool.importlinter])

bench: $(STAMP)
	$(VENV)/bin/python -m bench
	$(VENV)/bin/python bench/bench_serve.py --out bench/results/serve.json

# The peers (llm-sandbox, smolagents) live in their own venv, never in the project's dependencies.
bench-peers: $(STAMP)
	$(VENV)/bin/python -c 'from bench.subjects import ensure_peers_venv; ensure_peers_venv(print)'
