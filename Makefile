# Thin entry points; the work is done by `phyfarm` (pipeline/) and the tests.
# `make run` is the main job end to end; `make test` is what CI runs.

PHYFARM_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/phyfarm
export PHYFARM_CACHE
VENV := $(PHYFARM_CACHE)/venv
CARGO ?= cargo
PHYFARM := target/debug/phyfarm
# Runs a command and prints how long it took ("I: phase NAME: 1m05s").
PHASE := bash containers/phase.sh

.PHONY: setup phyfarm run images kernel lint unit integration farm test bench selftest fixtures

setup:
	$(PHASE) setup bash containers/host-setup.sh

phyfarm:
	$(PHASE) cargo-build $(CARGO) build --workspace --bins

images: setup phyfarm
	$(PHYFARM) images

kernel: setup phyfarm
	$(PHYFARM) build --variant rust
	$(PHYFARM) build --variant c

# The shipped series end to end: v7 as posted (it does not apply to 6.12:
# exit 1, "changes requested", is its honest result), then v8 with the farm,
# then the dashboard as static pages showing both.
SHIPPED := patches/rust-phy-enum-check
SITE := $(PHYFARM_CACHE)/site

run: setup phyfarm
	$(PHYFARM) images
	$(PHYFARM) run $(SHIPPED)/v7 --no-farm || test $$? -eq 1
	$(PHYFARM) run $(SHIPPED)/v8
	$(PHYFARM) dashboard export $(SITE)
	@echo "I: dashboard: file://$(SITE)/index.html (or run: $(PHYFARM) serve)"

lint: setup
	$(PHASE) lint/rustfmt $(CARGO) fmt --all -- --check
	$(PHASE) lint/clippy $(CARGO) clippy --workspace --all-targets -- -D warnings
	$(PHASE) lint/ruff $(VENV)/bin/ruff check .
	$(PHASE) lint/ruff-format $(VENV)/bin/ruff format --check .
	$(PHASE) lint/zizmor $(VENV)/bin/zizmor --offline --persona auditor --config .github/zizmor.yml .github/workflows

# The store tests also run against a real PostgreSQL on loopback, started
# here and stopped afterwards, pass or fail. The verdict's property tests
# run apart, so the seed of their 10 000 generated histories is printed
# (PHYFARM_VERDICT_SEED=<seed> replays them).
unit: setup
	@url=$$(bash containers/postgres-test.sh start) || exit 2; \
	trap 'bash containers/postgres-test.sh stop' EXIT; \
	PHYFARM_TEST_POSTGRES="$$url" $(PHASE) unit $(CARGO) test --workspace -- --skip verdict::properties
	$(PHASE) unit/verdict-properties $(CARGO) test -p phyfarm --lib verdict::properties -- --nocapture

# The workflow scenarios run against SQLite and a real PostgreSQL (started
# here as for `make unit`, and stopped afterwards, pass or fail).
# The farm's checks (pytest-tests/farm) run in the pipeline phase, through
# the real path: the shipped v8 through `phyfarm run`, on the patched kernels
# and on the base (the base's results reused when an earlier run had the same
# kernels, farm and plan), with the Rust doctests (KUnit) of both.
# The harness's own tests (harness/tests: its units, interrupted runs, hung
# guests) boot guests too: two at a time, in their own run.
# pytest-tests/gadget runs the probe, link-flap and throughput checks on the
# forwarded-gadget path (the model as a USB gadget in an exporter guest,
# exported by the real usbredirect) beside the emulated path; its guest plan
# builds the exporter kernel as `make exporter-kernel` does (incrementally).
integration: setup phyfarm
	@url=$$(bash containers/postgres-test.sh start) || exit 2; \
	trap 'bash containers/postgres-test.sh stop' EXIT; \
	PHYFARM_TEST_POSTGRES="$$url" $(PHASE) integration/pipeline $(VENV)/bin/python -m pytest --durations=12 pytest-tests --ignore=pytest-tests/farm --ignore=pytest-tests/gadget
	$(PHASE) integration/harness $(VENV)/bin/python -m pytest --durations=8 harness/tests -n 2
	$(PHASE) integration/gadget $(VENV)/bin/python -m pytest pytest-tests/gadget -s
	$(PHASE) integration/selftest $(PHYFARM) selftest --quick

# The exporter guest's kernel for the forwarded-gadget farm checks: the c
# variant with qemu-farm/guest/exporter.config (dummy_hcd, configfs gadgets,
# FunctionFS). `phyfarm guest plan --build-exporter-kernel` builds the same.
EXPORTER_OUT := $(PHYFARM_CACHE)/out/exporter
.PHONY: exporter-kernel
exporter-kernel: setup phyfarm
	$(PHYFARM) build --variant c --kconfig-fragment qemu-farm/guest/exporter.config -o $(EXPORTER_OUT)

# Test fixtures that are outputs of real runs, refreshed from what
# `make run` and `phyfarm selftest --case doctest-fails` left in the cache.
fixtures:
	bash pipeline/tests/fixtures/real-run/regenerate.sh
	bash harness/tests/fixtures/regenerate.sh

# Every seeded fault of patches/selftest through `phyfarm run`: each must be
# caught with its verdict and evidence (README, "What phyfarm catches").
selftest: setup phyfarm
	$(PHYFARM) images
	$(PHYFARM) selftest

# The farm on the default build outputs (<cache>/out/{rust,c}, and the Rust
# doctests' KUnit kernel in <cache>/out/rust-kunit), with a summary table.
KUNIT_OUT := $(PHYFARM_CACHE)/out/rust-kunit
farm: setup phyfarm
	$(PHYFARM) build --variant rust -K CONFIG_RUST_KERNEL_DOCTESTS=y -K CONFIG_KUNIT_DEFAULT_ENABLED=y -o $(KUNIT_OUT)
	$(PHYFARM) test --artifacts $(PHYFARM_CACHE)/out -n 2

# Each phase prints its time as it ends, the pytest phases their slowest
# tests; the table of all the phases comes last.
test: export PHYFARM_PHASE_LOG := $(PHYFARM_CACHE)/test-phases.tsv
test: test-phases-start lint unit integration
	@echo "I: make test phases:" >&2
	@awk -F'\t' '{t += $$2; printf "  %-26s %3dm%02ds\n", $$1, $$2 / 60, $$2 % 60} END {printf "  %-26s %3dm%02ds\n", "total", t / 60, t % 60}' "$(PHYFARM_PHASE_LOG)" >&2

.PHONY: test-phases-start
test-phases-start:
	@mkdir -p "$(PHYFARM_CACHE)" && rm -f "$(PHYFARM_PHASE_LOG)"

.PHONY: dashboard
dashboard: phyfarm
	$(PHYFARM) serve

bench: setup phyfarm
	bash bench/emu-bulk.sh
	bash bench/emu-latency.sh
	bash bench/guest-throughput.sh
	bash bench/boot-vs-vng.sh --build
	$(VENV)/bin/python bench/revision-to-verdict.py
	$(VENV)/bin/python bench/farm-fanout.py
	$(VENV)/bin/python bench/throughput-power.py
	bash bench/farm-scaling.sh

# Mutation testing of the emulator crates with cargo-mutants (installed
# here when missing). Slow (about two hours on two cores), so never part
# of `make test`. MUTANTS_ARGS narrows or resumes it, e.g.
# MUTANTS_ARGS="--file qemu-farm/ax88772/src/pending.rs", or
# MUTANTS_ARGS=--iterate to test only what the last run did not catch or
# did not reach. Two mutants at a time: the emulator's tests wait more
# than they compute. Results in target/mutants/mutants.out/ (caught.txt,
# missed.txt, timeout.txt, unviable.txt, outcomes.json).
MUTANTS_JOBS ?= 2
.PHONY: mutants
mutants:
	$(CARGO) mutants --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-mutants@27.1.0
	mkdir -p target/mutants
	CARGO_PROFILE_DEV_DEBUG=0 $(CARGO) mutants -p usbredir -p ax88772 -j $(MUTANTS_JOBS) --timeout 40 --output target/mutants $(MUTANTS_ARGS)
