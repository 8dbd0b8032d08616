# madtrace — all set-up happens here, so that a fresh clone needs only
# `make demo` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_STAMP := build/.apt-installed
APT_PACKAGES := gcc g++ make valgrind uftrace binutils procps nodejs libdw-dev libxxhash-dev libzstd1 openjdk-17-jre-headless chromium chromium-driver

TEST_SRCS := $(wildcard tests/progs/*.c) $(wildcard tests/progs/*.cc)
TEST_NAMES := $(basename $(notdir $(TEST_SRCS)))
# every test program at -O0 and -O2, PIE and non-PIE
VARIANTS := O0-pie O0-nopie O2-pie O2-nopie
TEST_BINS := $(foreach n,$(TEST_NAMES),$(foreach v,$(VARIANTS),build/tests/$(n)-$(v)))
# a stripped copy of each, for the "stripped binary" paths
STRIPPED_BINS := $(foreach n,$(TEST_NAMES),build/tests/$(n)-O2-pie-stripped)
# static executables (no loader; the C library sets the thread pointer itself)
STATIC_NAMES := data_globals data_alloc calls_recursion threads
STATIC_BINS := $(foreach n,$(STATIC_NAMES),build/tests/$(n)-O2-static build/tests/$(n)-O2-static-pie)
EXAMPLE_SRCS := $(wildcard examples/*.c)
EXAMPLE_BINS := $(patsubst examples/%.c,build/examples/%,$(EXAMPLE_SRCS))

CFLAGS_COMMON := -g -Wall -Wno-unused-result -fno-omit-frame-pointer -pthread

.PHONY: all setup deps venv bytecode programs injector native analysis-native demo example-reports docs check test soak parity bench clean distclean

all: setup

setup: deps venv bytecode programs

# apt packages the tests use as oracles (valgrind, uftrace) and to build.
deps: $(APT_STAMP)
$(APT_STAMP): Makefile
	@mkdir -p build
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@

venv: $(STAMP)
$(STAMP): pyproject.toml constraints.txt
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(VPY) -m pip install -q -c constraints.txt -e '.[test,bench]'
	@touch $@

# madtrace's modules compiled once: every madtrace command starts a Python process,
# and where PYTHONDONTWRITEBYTECODE is set (CI machines) each would compile every
# module it imports again (daemon modules: 0.36 s to import, 0.26-0.31 s compiled)
PYC_STAMP := build/.bytecode
bytecode: $(PYC_STAMP)
$(PYC_STAMP): $(shell find madtrace -name '*.py') $(STAMP)
	@mkdir -p build
	@$(VPY) -m compileall -q madtrace
	@touch $@

# libraries the test programs load with dlopen
TEST_LIBS := $(patsubst tests/progs/lib/%.c,build/tests/libmt%.so,$(wildcard tests/progs/lib/*.c))
# and a copy of each stripped of every symbol but the dynamic ones (internal functions
# then have only their .eh_frame entry)
TEST_LIBS += $(patsubst tests/progs/lib/%.c,build/tests/libmt%-stripped.so,$(wildcard tests/progs/lib/*.c))

programs: $(TEST_BINS) $(STRIPPED_BINS) $(STATIC_BINS) $(TEST_LIBS) $(EXAMPLE_BINS) injector native analysis-native

# the code that runs inside the target: trampoline templates + shared layout
INJECTOR_OUT := build/injector/templates.json
injector: $(INJECTOR_OUT)
$(INJECTOR_OUT): injector/trampolines.S injector/layout.h injector/build_templates.py $(STAMP)
	@mkdir -p $(@D)
	gcc -c -Iinjector -o build/injector/trampolines.o injector/trampolines.S
	$(VPY) injector/build_templates.py build/injector/trampolines.o injector/layout.h $@

# the data engine's hot loop (tracer side, C, loaded with ctypes)
NATIVE_OUT := build/native/libmtloop.so
# the drain of the function-tracing rings (tracer side, C, loaded with ctypes)
DRAIN_OUT := build/native/libmtdrain.so
# the frame rules of the call records, the access pass and the report kinds' counters (offline
# side: trace/segmentation.py, trace/access_pass.py, analysis/access_counters.py)
REPLAY_OUT := build/native/libmtreplay.so
# the allocation tracker's block index (tracer side, C, loaded with ctypes)
BLOCKS_OUT := build/native/libmtblocks.so
# the DWARF reader (a program, libdw): variables, types, line tables for the symbol cache
DWARF_OUT := build/native/mtdwarf
# the client of the resident process that starts without Python (madtrace/cli/madtrace_ctl.c)
CTL_OUT := build/bin/madtrace-ctl
native: $(NATIVE_OUT) $(DRAIN_OUT) $(REPLAY_OUT) $(BLOCKS_OUT) $(DWARF_OUT) $(CTL_OUT)
$(NATIVE_OUT): madtrace/process/fault_loop.c madtrace/data/data_expand.c injector/layout.h
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -shared -fPIC -Iinjector -o $@ madtrace/process/fault_loop.c \
	    madtrace/data/data_expand.c
# the capture container's constants for the drain, from the one definition (trace/format.py)
CAPTURE_HEADER_H := build/native/capture_format.h
$(CAPTURE_HEADER_H): madtrace/trace/format.py madtrace/trace/capture_file.py $(STAMP)
	@mkdir -p $(@D)
	$(VPY) -m madtrace.trace.capture_file > $@.tmp && mv $@.tmp $@
$(DRAIN_OUT): madtrace/rings/ring_drain.c madtrace/rings/drain_thread.c injector/layout.h \
	    $(CAPTURE_HEADER_H) | $(APT_STAMP)
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -shared -fPIC -pthread -Iinjector -Ibuild/native -o $@ \
	    madtrace/rings/ring_drain.c madtrace/rings/drain_thread.c -lxxhash
$(REPLAY_OUT): madtrace/trace/replay.c madtrace/trace/access_pass.c madtrace/trace/parquet_pages.c madtrace/analysis/access_counters.c \
	    madtrace/trace/access_pass.h
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -shared -fPIC -o $@ $(filter %.c,$^)
$(BLOCKS_OUT): madtrace/data/heap/block_index.c
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -shared -fPIC -o $@ $<
$(DWARF_OUT): madtrace/binary/dwarf_reader.c | $(APT_STAMP)
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -o $@ $< -ldw -lelf
$(CTL_OUT): madtrace/cli/madtrace_ctl.c Makefile
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -DMADTRACE_PYTHON='"$(abspath $(VPY))"' \
	    -DMADTRACE_PACKAGE='"$(abspath madtrace)"' -o $@ $<

# the analyses' cores (analysis side, C, loaded with ctypes): the footprint; the
# cache simulation, sharing and reuse distances
FOOTPRINT_OUT := build/native/libmtfootprint.so
MEMSIM_OUT := build/native/libmtmemsim.so
analysis-native: $(FOOTPRINT_OUT) $(MEMSIM_OUT)
$(FOOTPRINT_OUT): madtrace/analysis/footprint.c
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -shared -fPIC -o $@ $<
$(MEMSIM_OUT): madtrace/analysis/memory_sim.c
	@mkdir -p $(@D)
	gcc -O2 -g -Wall -Wextra -shared -fPIC -o $@ $<

build/tests/%-O0-pie: tests/progs/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O0 -fPIE -pie -o $@ $<
build/tests/%-O0-pie: tests/progs/%.cc
	@mkdir -p $(@D)
	g++ $(CFLAGS_COMMON) -O0 -fPIE -pie -o $@ $<
build/tests/%-O0-nopie: tests/progs/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O0 -fno-pie -no-pie -o $@ $<
build/tests/%-O0-nopie: tests/progs/%.cc
	@mkdir -p $(@D)
	g++ $(CFLAGS_COMMON) -O0 -fno-pie -no-pie -o $@ $<
build/tests/%-O2-pie: tests/progs/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O2 -fPIE -pie -o $@ $<
build/tests/%-O2-pie: tests/progs/%.cc
	@mkdir -p $(@D)
	g++ $(CFLAGS_COMMON) -O2 -fPIE -pie -o $@ $<
build/tests/%-O2-nopie: tests/progs/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O2 -fno-pie -no-pie -o $@ $<
build/tests/%-O2-nopie: tests/progs/%.cc
	@mkdir -p $(@D)
	g++ $(CFLAGS_COMMON) -O2 -fno-pie -no-pie -o $@ $<
build/tests/%-O2-static: tests/progs/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O2 -fno-pie -static -o $@ $<
build/tests/%-O2-static-pie: tests/progs/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O2 -fPIE -static-pie -o $@ $<
build/tests/libmt%.so: tests/progs/lib/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O1 -shared -fPIC -o $@ $<
build/tests/libmt%-stripped.so: build/tests/libmt%.so
	strip --strip-all -o $@ $<
build/tests/%-O2-pie-stripped: build/tests/%-O2-pie
	strip -o $@ $<
build/examples/%: examples/%.c
	@mkdir -p $(@D)
	gcc $(CFLAGS_COMMON) -O0 -o $@ $<

demo: setup
	$(VENV)/bin/madtrace record --force --data -o build/demo.data -- build/examples/demo
	$(VENV)/bin/madtrace summary build/demo.data
	$(VENV)/bin/madtrace report build/demo.data --kind calls
	@echo; echo "== the function-segmented trace: each call with its data accesses, in order"
	$(VENV)/bin/madtrace report build/demo.data --kind segments --top 4
	@echo; echo "== the page heat map (MadT's Fig. 1); see also examples/demo-heatmap.png and demo-report.html"
	$(VENV)/bin/madtrace report build/demo.data --kind heatmap

# the example outputs kept in examples/ (regenerate after changing the reports)
example-reports: setup
	$(VENV)/bin/madtrace record -q --force --data -o build/demo.data -- build/examples/demo
	$(VENV)/bin/madtrace report build/demo.data --kind heatmap --png examples/demo-heatmap.png --force
	$(VENV)/bin/madtrace report build/demo.data --html examples/demo-report.html --force

# the command reference and the manual page, made from the commands' option definitions (tests/test_docs.py
# fails when the committed page differs)
docs: setup
	$(VPY) -m madtrace.cli.reference docs/commands.md
	$(VPY) -m madtrace.cli.reference --man docs/man/madtrace.1

# lint, layers and types (pyproject.toml has their settings); the format check covers the
# modules listed in FORMATTED (the rest is formatted once the concurrent branches have landed)
FORMATTED := madtrace/trace/format.py madtrace/kinds madtrace/exports madtrace/arch/x86_64/encode.py \
	tests/test_offline.py tests/test_registry.py madtrace/api.py madtrace/analysis/cache.py \
	madtrace/analysis/sharing.py madtrace/analysis/reuse.py madtrace/analysis/access_stream.py \
	madtrace/analysis/memory_sim.py madtrace/analysis/diff.py madtrace/analysis/access_counters.py \
	madtrace/analysis/shared_pass.py tests/test_shared_pass.py madtrace/report/memory_text.py \
	madtrace/report/memory_html.py madtrace/report/memory_png.py madtrace/report/diff_text.py \
	madtrace/cli/cmd_diff.py tests/test_memory_analyses.py tests/test_api.py tests/test_diff.py \
	madtrace/flight madtrace/live/commands/snapshot.py tests/test_flight.py
check: setup
	$(VENV)/bin/ruff check madtrace tests bench injector
	$(VENV)/bin/ruff format --check $(FORMATTED)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# two workers, each test file on one of them (--dist loadfile): most tests wait on
# ptrace stops and child processes, so two cores run them ~1.7x faster
test: setup check
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile tests

# every offline output of the working tree against REF's, byte for byte (not part of make test)
REF ?= main
# the stateful test of live commands, thousands of sessions (make test runs a few hundred)
SOAK_SESSIONS ?= 3000
soak: setup
	MADTRACE_LIVE_EXAMPLES=$(SOAK_SESSIONS) $(VENV)/bin/python -m pytest -q tests/test_live_transactions.py

parity: setup
	$(VPY) tests/output_parity.py --ref $(REF)

# what bench/ compares madtrace with: Frida (PyPI, the bench extra) and bpftrace
# (Debian); never needed to run madtrace
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(VPY) -m pip install -q -e '.[test,bench]'
	@command -v bpftrace >/dev/null 2>&1 || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq bpftrace >/dev/null || \
	  echo "bpftrace could not be installed: bench_live.py leaves it out"; }
	@touch $@

bench: setup $(BENCH_STAMP)
	$(VENV)/bin/python bench/run_all.py

clean:
	rm -rf build

distclean: clean
	rm -rf $(VENV) *.egg-info
