# `make demo` and `make test` set everything up on a fresh machine: a
# virtualenv with torch and the build tools, GoogleTest from the system
# packages, then the build.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC ?= torch==2.13.0
# Empty for the per-version targets below: torch's own wheel pins its Triton.
TRITON_SPEC ?= triton==3.6.0
# Set by the per-version targets: the venv's torch must be exactly this
# release (a CUDA or CPU build of it), otherwise TORCH_SPEC is installed.
TORCH_VERSION ?=
# scikit-build-core's build directory for the opforge._C extension. It is
# also the build ctest runs (the unit tests are built into it when
# BUILD_TESTS is ON, as `make test` sets it): the core and the torch layer
# compile once for both.
PY_BUILD ?= build/py
CPP_BUILD = $(PY_BUILD)
BUILD_TESTS ?= OFF
# The newest torch release and the one before it; `make test-torch-latest`
# and `make test-torch-previous` test against them (docs/versions.md).
TORCH_LATEST ?= 2.15.0
TORCH_PREVIOUS ?= 2.14.1
# The newest patch release on PyPI of every supported release line:
# `make test-torch-2.9` tests 2.9.1, `make test-torch-all` tests each.
TORCH_RELEASES ?= 2.9.1 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0
SAN_BUILD ?= build/sanitize
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: all setup gtest build demo test cpp-test py-test gpu-test gpu-bench bench sanitize tsan clean \
	test-torch-latest test-torch-previous test-torch-all wheel-smoke test-stable-abi

all: test

$(VENV)/.opforge-deps: pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@$(PY) -c "import sys, torch; sys.exit('$(TORCH_VERSION)' not in ('', torch.__version__.split('+')[0]))" \
	  2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake pytest pytest-xdist hypothesis pyyaml numpy $(TRITON_SPEC)
	# opforge's tvm-ffi extra (docs/tvm_ffi.md), so the suite runs its TVM-FFI tests.
	$(PIP) install -q "apache-tvm-ffi>=0.1.15,<0.2"
	@touch $@

setup: $(VENV)/.opforge-deps gtest

gtest:
	@if [ ! -f /usr/include/gtest/gtest.h ]; then \
	  echo "Installing GoogleTest (libgtest-dev)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || command -v sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q libgtest-dev; \
	fi

build: setup
	$(PIP) install -q --no-build-isolation --no-deps --config-settings=build-dir="$(PY_BUILD)" \
	  --config-settings=cmake.define.OPFORGE_BUILD_TESTS=$(BUILD_TESTS) -e .

# The test targets build the unit tests too (a target's variable reaches its prerequisites).
test cpp-test py-test: BUILD_TESTS = ON
cpp-test: build
	ctest --test-dir $(CPP_BUILD) --output-on-failure

# pytest runs on PYTEST_JOBS workers (pytest-xdist), a test file on one
# worker (its module fixtures build and load once); the test libraries each
# build once per run under a lock (tests/python/cpp_ext.py). The slowest
# tests are printed at the end, so growth shows.
PYTEST_JOBS ?= 2
PYTEST_FLAGS ?= -q -n $(PYTEST_JOBS) --dist loadfile --durations=15
py-test: build
	$(PY) -m pytest tests/python $(PYTEST_FLAGS)
	@echo "The example kernel library again, built on torch's stable ABI (docs/stable_abi.md):"
	OPFORGE_KERNELS=stable $(PY) -m pytest tests/python/test_kernel_library.py tests/python/test_deploy.py $(PYTEST_FLAGS)

test: cpp-test py-test

# GPU tests, with the Python that already has torch with CUDA (nothing is
# downloaded). liger-kernel (tests/gpu/test_liger.py) and flag-gems with
# sqlalchemy, which it imports (tests/gpu/test_flaggems.py), come from wheels
# in .whl/ (`pip download --no-deps -d .whl/ liger-kernel flag-gems==5.0.2
# sqlalchemy==2.0.48` for the GPU machine's Python where there is network);
# without them those tests skip.
gpu-test:
	$(PYTHON) -m pip install -q --no-index --no-deps --find-links .whl liger-kernel \
	  || echo "no liger-kernel wheel in .whl/: tests/gpu/test_liger.py will skip"
	$(PYTHON) -m pip install -q --no-index --no-deps --find-links .whl flag-gems sqlalchemy \
	  || echo "no flag-gems and sqlalchemy wheels in .whl/: tests/gpu/test_flaggems.py will skip"
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	$(PYTHON) -m pytest tests/gpu -v -rs

# The Liger-Kernel ports against Liger's own Functions, eager with grad
# (docs/performance.md); after gpu-test has installed the wheels.
gpu-bench:
	$(PYTHON) benchmarks/bench_liger.py

demo: build
	$(VENV)/bin/opforge demo

bench: build
	$(VENV)/bin/opforge bench

# The core's unit tests (fuzz test included) under ASan and UBSan.
sanitize: setup
	cmake -S . -B $(SAN_BUILD) -G Ninja -DOPFORGE_BUILD_TESTS=ON -DOPFORGE_BUILD_PYTHON=OFF -DOPFORGE_BUILD_TORCH=OFF \
	  -DOPFORGE_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug > /dev/null
	cmake --build $(SAN_BUILD)
	ctest --test-dir $(SAN_BUILD) --output-on-failure

# The handle table and struct registry tests under ThreadSanitizer.
tsan: setup
	cmake -S . -B build/tsan -G Ninja -DOPFORGE_BUILD_TESTS=ON -DOPFORGE_BUILD_PYTHON=OFF -DOPFORGE_BUILD_TORCH=OFF \
	  -DOPFORGE_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug > /dev/null
	cmake --build build/tsan --target test_handles test_structs
	ctest --test-dir build/tsan --output-on-failure -R "test_handles|test_structs"

# The CPU suite against another torch from PyPI, each in its own venv and
# build directories (PyPI's Linux torch brings several GB of CUDA packages).
# `make test-torch-2.14.0` works for any release; CI runs `make test`.
test-torch-latest: test-torch-$(TORCH_LATEST)
test-torch-previous: test-torch-$(TORCH_PREVIOUS)
# One after another: each builds opforge anew (an hour or more on two cores).
test-torch-all: $(addprefix test-torch-,$(TORCH_RELEASES))
# A release line names its newest patch release: pip reads torch==2.9 as 2.9.0.
$(foreach release,$(TORCH_RELEASES),$(eval test-torch-$(basename $(release)): test-torch-$(release)))
test-torch-%:
	$(MAKE) test VENV=.venv-torch-$* TORCH_VERSION=$* TORCH_SPEC="torch==$*" TRITON_SPEC= \
	  PY_BUILD=build/torch-$*/py

# One stable-ABI build of the example kernel library, made here with this
# torch (targeting 2.10), and the very same file tested under each torch of
# STABLE_ABI_TORCH, each in its own venv with opforge built for it
# (docs/stable_abi.md#one-build-every-torch).
STABLE_ABI_TORCH ?= 2.10.0 2.12.1 $(TORCH_PREVIOUS) $(TORCH_LATEST)
STABLE_ABI_DIR ?= build/stable-abi
test-stable-abi: build
	rm -rf $(STABLE_ABI_DIR) && mkdir -p $(STABLE_ABI_DIR)
	OPFORGE_KERNELS=stable $(PY) -m pytest tests/python/test_kernel_library.py -q -s
	cp build/torch-$$($(PY) -c "import torch; print(torch.__version__.split('+')[0])")/kernel_library_stable/libopforge_kernels.so \
	  $(STABLE_ABI_DIR)/libopforge_kernels.so
	sha256sum $(STABLE_ABI_DIR)/libopforge_kernels.so
	set -e; for v in $(STABLE_ABI_TORCH); do \
	  $(MAKE) build VENV=.venv-torch-$$v TORCH_VERSION=$$v TORCH_SPEC="torch==$$v" TRITON_SPEC= \
	    PY_BUILD=build/torch-$$v/py; \
	  echo "== the same stable build under torch $$v"; \
	  OPFORGE_KERNELS=$(abspath $(STABLE_ABI_DIR))/libopforge_kernels.so \
	    .venv-torch-$$v/bin/python -m pytest tests/python/test_kernel_library.py -q -s; \
	done
	sha256sum $(STABLE_ABI_DIR)/libopforge_kernels.so

# `pip wheel --no-build-isolation --no-deps .`, then the wheel installed in a
# fresh venv that shares this torch: import, ops, --version, find_package
# (tests/wheel_smoke.py). A full build: minutes, so not part of `make test`.
WHEEL_DIR ?= build/wheel
wheel-smoke: setup
	rm -rf $(WHEEL_DIR)/dist
	$(PIP) wheel -q --no-build-isolation --no-deps --config-settings=build-dir="$(WHEEL_DIR)/{wheel_tag}" \
	  -w $(WHEEL_DIR)/dist .
	$(PY) tests/wheel_smoke.py $(WHEEL_DIR)

clean:
	rm -rf build
