# textgen — the two entry points of README.md, and the steps they are made of.
#   make run    install dependencies, build, serve the bundled demo model
#   make test   install dependencies, build, run every test (ctest)
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: run test deps configure build check format gpu-pack clean

deps:
	bash tools/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	bash tools/run-tests.sh $(BUILD_DIR)

# Serves the bundled demo model on port 3000 (extra launcher flags: make run ARGS="--port 8080").
run: build
	bash tools/run-demo.sh $(BUILD_DIR) $(ARGS)

format:
	bash tools/format.sh

# Build for the GPU machine and pack the GPU tests and benchmarks into .gpu/ (docs/gpu.md).
gpu-pack: build
	bash tools/gpu-pack.sh $(BUILD_DIR) .gpu

clean:
	rm -rf $(BUILD_DIR)
