# Thin entry points; the work is done by `phyfarm` (pipeline/) and the tests.
# `make run` is the main job end to end; `make test` is what CI runs.

PHYFARM_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/phyfarm
export PHYFARM_CACHE
VENV := $(PHYFARM_CACHE)/venv
CARGO ?= cargo
PHYFARM := target/debug/phyfarm

.PHONY: setup phyfarm run images kernel lint unit integration test bench

setup:
	bash containers/host-setup.sh

phyfarm:
	$(CARGO) build --workspace --bins

images: setup phyfarm
	$(PHYFARM) images

kernel: setup phyfarm
	$(PHYFARM) build --variant rust
	$(PHYFARM) build --variant c

run: setup phyfarm
	$(PHYFARM) images
	$(PHYFARM) run

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

unit: setup
	$(CARGO) test --workspace

integration: setup phyfarm
	$(VENV)/bin/python -m pytest pytest-tests

test: lint unit integration

bench: setup
	bash bench/run.sh
