# Quanta's front door. `make test` and `make demo` work on a fresh Debian 12 machine as
# root: they install what is missing, configure into build/, build, then run.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

# With ccache installed, a fresh clone reuses earlier compiles of the same sources: paths are
# hashed relative to the checkout, so clones in different folders share the cache.
ifneq ($(shell command -v ccache 2>/dev/null),)
export CMAKE_C_COMPILER_LAUNCHER ?= ccache
export CMAKE_CXX_COMPILER_LAUNCHER ?= ccache
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
endif

.PHONY: all deps configure build test test-asan test-tsan test-fuzz fuzz demo demo-containers bench gpu-kit clean format

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	scripts/run-tests.sh $(BUILD)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DQUANTA_SANITIZE=ON -DQUANTA_BUILD_BPF=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	scripts/run-tests.sh $(ASAN_BUILD) -L 'unit|integration'

# ThreadSanitizer: the unit tests (arbiter, common, shim data structures) and the arbiter
# daemon suites, whose quanta-arbiter then runs instrumented with its helper threads.
# setarch -R: TSan's shadow memory needs the address layout without randomisation.
TSAN_TARGETS = quanta_unit_tests quanta_arbiter_unit_tests quanta_config_unit_tests quanta_ctl_unit_tests quanta_hosted_unit_tests quanta_shim_units \
	quanta_arbiter_service_tests quanta_arbiter_observer_tests quanta_arbiter_admin_service_tests quanta_arbiter_daemon_tests quanta_arbiter_isolation_tests quanta-arbiter quantactl quanta-tenant
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQUANTA_TSAN=ON -DQUANTA_BUILD_BPF=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TARGETS)
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch $$(uname -m) -R scripts/run-tests.sh $(TSAN_BUILD) -L unit
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" setarch $$(uname -m) -R scripts/run-tests.sh $(TSAN_BUILD) -R '^Arbiter(Daemon|Isolation|Enforce)'

# libFuzzer targets (clang), each run for FUZZ_SECONDS over its seed corpus: `test-fuzz`
# from a fixed seed per target (CI), `fuzz` from a new one each time (looking further).
FUZZ_SECONDS ?= 20
test-fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DQUANTA_FUZZ=ON -DQUANTA_FUZZ_EXPLORE=OFF -DQUANTA_BUILD_BPF=OFF -DQUANTA_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CMAKE_ARGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target quanta_fuzzers
	scripts/run-tests.sh $(FUZZ_BUILD) -L fuzz

fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DQUANTA_FUZZ=ON -DQUANTA_FUZZ_EXPLORE=ON -DQUANTA_BUILD_BPF=OFF -DQUANTA_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CMAKE_ARGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target quanta_fuzzers
	scripts/run-tests.sh $(FUZZ_BUILD) -L fuzz

demo: build
	scripts/demo.sh $(BUILD)

# Two annotated pods in real runc containers, Quanta brought in by its CDI spec (root).
demo-containers: build
	scripts/demo-containers.sh $(BUILD)

bench: build
	scripts/bench.sh $(BUILD)

gpu-kit: build
	scripts/gpu-kit.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.c')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
