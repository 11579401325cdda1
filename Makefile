# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: demo test lint typecheck unit crd bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# LMCache's own config class validates the configs we generate; its wheel pulls CUDA, so no deps.
	$(BIN)/python -m pip install --quiet --no-deps lmcache==0.5.6
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(BIN)/inferencepool demo

test: $(STAMP)
	$(BIN)/ruff check operator tests
	$(BIN)/ruff format --check operator tests
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest

crd: $(STAMP)
	$(BIN)/inferencepool crd --write crds/

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
