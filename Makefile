# qmoe — thin wrapper over CMake. `make demo` runs the main job, `make test` the CPU tests.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CUDA_BUILD ?= build-cuda

.PHONY: all setup configure build demo test gpu-check bench install clean interop

all: build

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/qmoe demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# qmoe against real AMD Quark exports (tests/interop; a venv with torch, transformers, amd-quark).
interop: setup
	bash scripts/interop.sh

# For the H200 machine: build with CUDA, run every CUDA test and the GPU benchmarks, print a table.
gpu-check:
	bash scripts/gpu_check.sh

bench: build
	./$(BUILD)/qmoe bench --device cpu --shape qwen3-30b-a3b --scheme w_mxfp4_a_mxfp4,w_int8_channel_a_int8_dyn_token,nvfp4 --tokens 1,16,128

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),/usr/local)

clean:
	rm -rf $(BUILD) $(CUDA_BUILD)
