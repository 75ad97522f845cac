# `make demo` and `make test` set everything up on a fresh machine: a
# virtualenv with torch and the build tools, GoogleTest from the system
# packages, then the build.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC ?= torch==2.13.0
CPP_BUILD ?= build/cpp
SAN_BUILD ?= build/sanitize
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: all setup gtest build demo test cpp-test py-test gpu-test bench sanitize tsan clean

all: test

$(VENV)/.opforge-deps: pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake pytest hypothesis pyyaml numpy "triton==3.6.0"
	@touch $@

setup: $(VENV)/.opforge-deps gtest

gtest:
	@if [ ! -f /usr/include/gtest/gtest.h ]; then \
	  echo "Installing GoogleTest (libgtest-dev)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || command -v sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q libgtest-dev; \
	fi

build: setup
	$(PIP) install -q --no-build-isolation --no-deps -e .

cpp-test: setup
	cmake -S . -B $(CPP_BUILD) -G Ninja -DOPFORGE_BUILD_TESTS=ON -DOPFORGE_BUILD_PYTHON=OFF -DOPFORGE_BUILD_TORCH=ON \
	  -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
	cmake --build $(CPP_BUILD)
	ctest --test-dir $(CPP_BUILD) --output-on-failure

py-test: build
	$(PY) -m pytest tests/python -q

test: cpp-test py-test

# GPU tests, with the Python that already has torch with CUDA (nothing is
# downloaded). liger-kernel, which tests/gpu/test_liger.py needs, comes from a
# wheel in .whl/ (`pip download liger-kernel --no-deps -d .whl/` where there is
# network); without one that test skips.
gpu-test:
	$(PYTHON) -m pip install -q --no-index --no-deps --find-links .whl liger-kernel \
	  || echo "no liger-kernel wheel in .whl/: tests/gpu/test_liger.py will skip"
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	$(PYTHON) -m pytest tests/gpu -v -rs

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

clean:
	rm -rf build
