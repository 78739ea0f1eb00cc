# colocate — build, test, demo.  `make demo` and `make test` work on a fresh clone.

# one job per core: nvcc's ~50 programs dominate a fresh build after pip
# (59 s -> 32 s on 2 cores), and they compile while pip installs
# (not with `clean` among the goals: it would delete what the build writes)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
NVCC    ?= nvcc
# the toolkit whose headers we build against (nvcc may be a wrapper script elsewhere)
CUDA_HOME ?= $(firstword $(wildcard /usr/local/cuda) $(patsubst %/bin/nvcc,%,$(realpath $(shell command -v $(NVCC)))))
# sm_90 for the H100/H200 we validate on, plus PTX so newer GPUs JIT it.
NVCC_ARCH ?= -gencode arch=compute_90,code=[sm_90,compute_90]
NVCCFLAGS ?= -O2 -cudart shared $(NVCC_ARCH) -I shim/simgpu -I shim/include -I bench/common
TWINFLAGS := -O2 -g -fPIC -shared -Wall -I shim/simgpu -I bench/common

# every bench/{progs,rodinia}/NAME/main.cu becomes bench/bin/NAME, its twins.c bench/bin/NAME.twins.so
PROGS   := $(notdir $(patsubst %/main.cu,%,$(wildcard bench/progs/*/main.cu bench/rodinia/*/main.cu)))
BINS    := $(addprefix bench/bin/,$(PROGS)) $(addprefix bench/bin/,$(addsuffix .twins.so,$(PROGS)))
TESTPROGS := $(patsubst tests/progs/%.c,bench/bin/test-%,$(wildcard tests/progs/*.c))
# one default-static-cudart build, for the real-GPU check of driver-level hooks
STATIC  := bench/bin/vecadd-static
# real-GPU probes of issue 3 (bench/gpu_pool.py runs them): no simgpu twins
GPUPROBES := $(patsubst bench/gpu/%.cu,bench/bin/gpu-%,$(wildcard bench/gpu/*.cu))
# the driver-API check (tests/drv): C linked with -lcuda against the toolkit's
# stub where it ships one, else simgpu's libcuda.so.1 (built by `native`); no
# rpath, so LD_LIBRARY_PATH picks simgpu's driver or the real one
DRVLIB  ?= $(firstword $(wildcard $(CUDA_HOME)/lib64/stubs/libcuda.so $(CUDA_HOME)/targets/x86_64-linux/lib/stubs/libcuda.so) shim/lib/simgpu/libcuda.so.1)
DRVPROG := bench/bin/drvcheck bench/bin/drvcheck.fatbin bench/bin/drvcheck.twins.so \
	   bench/bin/test-drvapi.fatbin bench/bin/test-drvapi.twins.so

.PHONY: all build native progs pyc test lint format demo clean gpu-wheels
all: build

build: $(VENV)/.installed native progs pyc

# every `colocate` command, app launcher, controller and test helper imports our
# modules: compile them once here, so that a PYTHONDONTWRITEBYTECODE environment
# does not recompile them in each process (about 0.1 s a process)
pyc: native
	$(BIN)/python -m compileall -q controlplane predictors processpool shim bench

# reinstall when a package appears: the editable finder maps packages at install time
$(VENV)/.installed: pyproject.toml setup.py $(wildcard */__init__.py)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel cffi
	$(BIN)/pip install -q --no-build-isolation -e '.[test]'
	touch $@

native: $(VENV)/.installed
	$(BIN)/python -m shim.build
	$(BIN)/python -m predictors.build
	$(BIN)/python -m controlplane.policies.build

# host-only microbenchmarks (bench/micro/NAME.c, plain C): what this machine's
# scheduler adds to simgpu's wall-time figures
MICRO   := $(patsubst bench/micro/%.c,bench/bin/%,$(wildcard bench/micro/*.c))
progs: $(BINS) $(TESTPROGS) $(STATIC) $(GPUPROBES) $(DRVPROG) $(MICRO)

bench/bin/%: bench/micro/%.c
	@mkdir -p bench/bin
	$(CC) -O2 -Wall -pthread -o $@ $<

COMMON_H := $(wildcard bench/common/*.h shim/include/*.h)
# a program also depends on the headers in its own folder ($$* is its name)
.SECONDEXPANSION:
bench/bin/%: bench/progs/%/main.cu $(COMMON_H) $$(wildcard bench/progs/$$*/*.h)
	@mkdir -p bench/bin
	$(NVCC) $(NVCCFLAGS) -o $@ $<

bench/bin/%: bench/rodinia/%/main.cu $(COMMON_H) $$(wildcard bench/rodinia/$$*/*.h)
	@mkdir -p bench/bin
	$(NVCC) $(NVCCFLAGS) -o $@ $<

bench/bin/%.twins.so: bench/progs/%/twins.c shim/simgpu/simgpu_twin.h $$(wildcard bench/progs/$$*/*.h)
	@mkdir -p bench/bin
	$(CC) $(TWINFLAGS) -o $@ $< -lm

bench/bin/%.twins.so: bench/rodinia/%/twins.c shim/simgpu/simgpu_twin.h $(COMMON_H) $$(wildcard bench/rodinia/$$*/*.h)
	@mkdir -p bench/bin
	$(CC) $(TWINFLAGS) -o $@ $< -lm

bench/bin/vecadd-static: bench/progs/vecadd/main.cu
	@mkdir -p bench/bin
	$(NVCC) -O2 $(NVCC_ARCH) -I shim/simgpu -I bench/common -o $@ $<

# driver functions come through cudaGetDriverEntryPointByVersion (dlsym): no -lcuda
bench/bin/gpu-%: bench/gpu/%.cu $(wildcard bench/gpu/*.h)
	@mkdir -p bench/bin
	$(NVCC) $(NVCCFLAGS) -o $@ $< -ldl

# wheels a lent GPU machine (no network, the image's Python 3.12) lacks, for
# bench/gpu_session.sh build: carry .whl there (git-ignored)
gpu-wheels: $(VENV)/.installed
	$(BIN)/pip download -q -d .whl --only-binary=:all: --implementation cp --python-version 3.12 \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    setuptools wheel pyzmq cffi pycparser pytest hypothesis

# (order-only native: without a stub, DRVLIB is simgpu's driver, which `native` builds)
bench/bin/drvcheck: tests/drv/drvcheck.c tests/progs/readfile.h $(wildcard $(DRVLIB)) | native
	@mkdir -p bench/bin
	$(CC) -O2 -Wall -I $(CUDA_HOME)/include -o $@ $< $(DRVLIB) -Wl,-rpath-link,shim/lib/simgpu

bench/bin/drvcheck.fatbin: tests/drv/kernels.cu
	@mkdir -p bench/bin
	$(NVCC) -fatbin $(NVCC_ARCH) -o $@ $<

bench/bin/drvcheck.twins.so: tests/drv/twins.c shim/simgpu/simgpu_twin.h
	@mkdir -p bench/bin
	$(CC) $(TWINFLAGS) -o $@ $<

# the module tests/progs/drvapi.c loads (bench/bin/test-drvapi is the wildcard's)
bench/bin/test-drvapi.fatbin: tests/drv/drvapi_kernels.cu
	@mkdir -p bench/bin
	$(NVCC) -fatbin $(NVCC_ARCH) -o $@ $<

bench/bin/test-drvapi.twins.so: tests/drv/drvapi_twins.c shim/simgpu/simgpu_twin.h
	@mkdir -p bench/bin
	$(CC) $(TWINFLAGS) -o $@ $<

bench/bin/test-%: tests/progs/%.c tests/progs/readfile.h
	@mkdir -p bench/bin
	$(CC) -O2 -Wall -I $(CUDA_HOME)/include -o $@ $< -ldl -lpthread

# Camelot's artifact stages (bench/camelot, `colocate pipeline run`): a CUDA
# library the stage workers load with ctypes, and its twins (found through
# SIMGPU_TWINS: a library has no "<executable>.twins.so")
CAMELOT := bench/bin/libcamelot-stage.so bench/bin/libcamelot-stage.twins.so
progs: $(CAMELOT)

bench/bin/libcamelot-stage.so: bench/camelot/stage.cu
	@mkdir -p bench/bin
	$(NVCC) $(NVCCFLAGS) -shared -Xcompiler -fPIC -o $@ $<

bench/bin/libcamelot-stage.twins.so: bench/camelot/stage_twins.c shim/simgpu/simgpu_twin.h
	@mkdir -p bench/bin
	$(CC) $(TWINFLAGS) -O3 -ffp-contract=off -o $@ $<

# the Tonic services (bench/tonic) add their own targets to `progs`
-include bench/tonic/build.mk

# Camelot's Table I services (bench/camelot/tonic_stage.cu): Tonic networks as
# pipeline stages, a library the stage workers load with ctypes (cuDNN and
# cuBLAS resolved at run time, as tonic-service), and its adapt kernel's twin
CAMELOT_TONIC := bench/bin/libcamelot-tonic.so bench/bin/libcamelot-tonic.twins.so
progs: $(CAMELOT_TONIC)

bench/bin/libcamelot-tonic.so: bench/camelot/tonic_stage.cu bench/camelot/tonic_adapt.h \
		$(filter-out bench/tonic/service.c,$(TONIC_SRC)) bench/tonic/ref.c $(TONIC_DEPS) | native
	@mkdir -p bench/bin
	$(NVCC) $(NVCCFLAGS) -shared -Xcompiler -fPIC -o $@ bench/camelot/tonic_stage.cu \
		$(filter-out bench/tonic/service.c,$(TONIC_SRC)) -L shim/lib/simgpu -lcudnn -lcublas

bench/bin/libcamelot-tonic.twins.so: bench/camelot/tonic_stage_twins.c bench/camelot/tonic_adapt.h \
		shim/simgpu/simgpu_twin.h
	@mkdir -p bench/bin
	$(CC) $(TWINFLAGS) -o $@ $<

# ruff (pyproject.toml's [tool.ruff]) over every Python folder, mypy over the packages
lint: $(VENV)/.installed
	$(BIN)/ruff check controlplane predictors processpool shim bench tests
	$(BIN)/mypy

# C in kernel style (.clang-format) on the lines changed since HEAD, the
# kernel's own habit: the rest of the tree keeps its hand-aligned comments.
# Python: ruff's fixes (imports in order).  Run before a commit.
format: $(VENV)/.installed
	$(BIN)/git-clang-format --binary $(BIN)/clang-format --extensions c,h,cu --force HEAD || test $$? -eq 1  # 1: it changed something
	$(BIN)/ruff check --fix -q controlplane predictors processpool shim bench tests

# the suite in parallel (pytest-xdist: one worker per core, at most 4; a
# file's tests stay together, in order, as their module fixtures expect),
# then the tests marked serial alone: claims that wall time decides (live
# co-locations' tail latencies, processes that must overlap, modelled times
# at a timescale > 0, rates timed by sleeps) -- other tests' load would
# move them
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
# both phases run whatever the first gives, so that one run lists every failure
test: build lint
	@$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not serial"; a=$$?; \
	 [ $$a -eq 2 ] && exit 2; \
	 $(BIN)/python -m pytest -q -m serial; b=$$?; \
	 if [ $$a -ne 0 ] || [ $$b -ne 0 ]; then \
	   echo "make test: FAILED (parallel phase exit $$a, serial phase exit $$b)"; exit 1; fi

demo: build
	$(BIN)/colocate demo

clean:
	rm -rf bench/bin shim/lib shim/_proto*.so predictors/_cinfer*.so controlplane/policies/_knapsack*.so build *.egg-info .pytest_cache
