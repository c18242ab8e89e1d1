# vllm-deploy: bare GPU hosts -> tuned, verified, benchmarked vLLM endpoints.
#   make demo   - a local throwaway test host, the real deploy playbook, sweep results
#   make test   - unit tests, lint and the molecule scenarios
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
APT_PACKAGES := debootstrap systemd-container openssh-client rsync iproute2 python3-venv ca-certificates

.PHONY: setup demo demo-clean test unit lint molecule clean

$(BIN)/.installed: requirements/tools.txt
	@command -v debootstrap >/dev/null && command -v systemd-nspawn >/dev/null && command -v ssh >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements/tools.txt
	$(BIN)/pip install -q --no-deps -e .
	@touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/python scripts/demo.py

demo-clean: setup
	$(BIN)/python scripts/testhost.py destroy vd-demo

unit: setup
	$(BIN)/python -m pytest tests/unit -q

lint: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/ansible-lint

molecule: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python scripts/run_molecule.py

test: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest tests/unit -q
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/ansible-lint
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python scripts/run_molecule.py

clean:
	rm -rf $(VENV) .cache
