// quanta-bench-launch-loop: times cuLaunchKernel and cuMemAlloc+cuMemFree in a tight loop
// in one process, so `quanta-bench launch-cost` can run it with and without libquanta.so
// preloaded and report what the shim's fast path adds. Entry points are taken from the
// global scope after loading libcuda.so.1, exactly as a program linked against it would
// bind them (a preloaded library comes first). With --threads N, N threads launch at once,
// each on a stream of its own, and each round is timed by the thread's own CPU clock (wall
// time would count the time a thread waits for a core). Prints one JSON object.
#include <dlfcn.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

// The tenant's spin kernel: busy-waits on %globaltimer for its parameter's nanoseconds;
// simgpu models every quanta_spin* kernel by that parameter.
const char kSpinPtx[] = R"(
.version 7.0
.target sm_52
.address_size 64
.visible .entry quanta_spin(.param .u64 quanta_spin_param_0)
{
	.reg .pred %p<2>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [quanta_spin_param_0];
	mov.u64 %rd2, %globaltimer;
$L__spin:
	mov.u64 %rd3, %globaltimer;
	sub.s64 %rd4, %rd3, %rd2;
	setp.lt.u64 %p1, %rd4, %rd1;
	@%p1 bra $L__spin;
	ret;
}
)";

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;

struct Driver {
  CUresult (*Init)(unsigned int);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*StreamCreate)(CUstream*, unsigned int);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
};

struct Failure {
  std::string message;
};

template <typename Function>
void resolve(Function& target, const char* name) {
  target = reinterpret_cast<Function>(dlsym(RTLD_DEFAULT, name));
  if (target == nullptr) throw Failure{std::string("libcuda.so.1 has no ") + name};
}

void check(CUresult result, const char* call) {
  if (result != 0)
    throw Failure{std::string(call) + " failed: CUresult " + std::to_string(result)};
}

uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Options {
  int rounds = 200;
  int per_round = 100;
  int alloc_rounds = 100;
  int allocs_per_round = 20;
  std::string bytes_text = "1048576";
  int threads = 1;
};

// The driver's entry points, bound from the global scope as a program linked against
// libcuda.so.1 binds them.
Driver load_driver() {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == nullptr)
    throw Failure{std::string("dlopen failed: ") + dlerror()};
  Driver d{};
  resolve(d.Init, "cuInit");
  resolve(d.DeviceGet, "cuDeviceGet");
  resolve(d.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  resolve(d.CtxSetCurrent, "cuCtxSetCurrent");
  resolve(d.ModuleLoadData, "cuModuleLoadData");
  resolve(d.ModuleGetFunction, "cuModuleGetFunction");
  resolve(d.StreamCreate, "cuStreamCreate");
  resolve(d.StreamSynchronize, "cuStreamSynchronize");
  resolve(d.LaunchKernel, "cuLaunchKernel");
  resolve(d.MemAlloc, "cuMemAlloc_v2");
  resolve(d.MemFree, "cuMemFree_v2");
  return d;
}

// Device 0's primary context, current on this thread, and the spin kernel loaded in it.
struct Kernel {
  CUcontext context = nullptr;
  CUfunction spin = nullptr;
};

Kernel load_kernel(const Driver& d) {
  check(d.Init(0), "cuInit");
  CUdevice device = 0;
  check(d.DeviceGet(&device, 0), "cuDeviceGet");
  Kernel kernel;
  check(d.DevicePrimaryCtxRetain(&kernel.context, device), "cuDevicePrimaryCtxRetain");
  check(d.CtxSetCurrent(kernel.context), "cuCtxSetCurrent");
  CUmodule module = nullptr;
  check(d.ModuleLoadData(&module, kSpinPtx), "cuModuleLoadData");
  check(d.ModuleGetFunction(&kernel.spin, module, "quanta_spin"), "cuModuleGetFunction");
  return kernel;
}

// One launching thread's rounds on a stream of its own, each timed by `clock`: the
// nanoseconds per launch of each round.
void launch_rounds(const Driver& d, const Kernel& kernel, const Options& options,
                   clockid_t clock, std::vector<double>* launch_ns) {
  unsigned long long duration_ns = 0;  // empty kernels: only the call is of interest
  void* parameters[] = {&duration_ns};
  check(d.CtxSetCurrent(kernel.context), "cuCtxSetCurrent");
  CUstream stream = nullptr;
  check(d.StreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
  auto launch = [&] {
    check(d.LaunchKernel(kernel.spin, 1, 1, 1, 1, 1, 1, 0, stream, parameters, nullptr),
          "cuLaunchKernel");
  };
  // Warm-up: the first launch takes the grant (slow path) and faults in code and data.
  for (int i = 0; i < 20; ++i) {
    for (int k = 0; k < options.per_round; ++k) launch();
    check(d.StreamSynchronize(stream), "cuStreamSynchronize");
  }
  for (int round = 0; round < options.rounds; ++round) {
    uint64_t t0 = clock_ns(clock);
    for (int k = 0; k < options.per_round; ++k) launch();
    uint64_t t1 = clock_ns(clock);
    launch_ns->push_back(static_cast<double>(t1 - t0) / options.per_round);
    check(d.StreamSynchronize(stream), "cuStreamSynchronize");
  }
}

// Every thread's rounds: one thread by the wall clock, several each by its own CPU clock.
std::vector<double> time_launches(const Driver& d, const Kernel& kernel, const Options& options) {
  std::vector<double> launch_ns;
  if (options.threads == 1) {
    launch_rounds(d, kernel, options, CLOCK_MONOTONIC, &launch_ns);
    return launch_ns;
  }
  const auto threads = static_cast<size_t>(options.threads);
  std::vector<std::vector<double>> per_thread(threads);
  std::vector<std::string> failures(threads);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        launch_rounds(d, kernel, options, CLOCK_THREAD_CPUTIME_ID, &per_thread[t]);
      } catch (const Failure& failure) {
        failures[t] = failure.message;
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  for (const std::string& failure : failures) {
    if (!failure.empty()) throw Failure{failure};
  }
  for (const auto& of_thread : per_thread)
    launch_ns.insert(launch_ns.end(), of_thread.begin(), of_thread.end());
  return launch_ns;
}

// Nanoseconds per cuMemAlloc+cuMemFree pair of each round, after five rounds of warm-up.
std::vector<double> time_alloc_pairs(const Driver& d, const Options& options, size_t bytes) {
  std::vector<double> pair_ns;
  std::vector<CUdeviceptr> pointers(static_cast<size_t>(options.allocs_per_round));
  for (int round = -5; round < options.alloc_rounds; ++round) {
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    for (auto& pointer : pointers) {
      check(d.MemAlloc(&pointer, bytes), "cuMemAlloc");
      check(d.MemFree(pointer), "cuMemFree");
    }
    uint64_t t1 = clock_ns(CLOCK_MONOTONIC);
    if (round >= 0) pair_ns.push_back(static_cast<double>(t1 - t0) / options.allocs_per_round);
  }
  return pair_ns;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "quanta-bench-launch-loop: per-call cost of cuLaunchKernel and cuMemAlloc+cuMemFree"};
  Options options;
  app.add_option("--rounds", options.rounds, "timed rounds of launches")
      ->check(CLI::Range(1, 100000));
  app.add_option("--per-round", options.per_round,
                 "launches per round (synchronised between rounds)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--alloc-rounds", options.alloc_rounds, "timed rounds of allocation pairs")
      ->check(CLI::Range(0, 100000));
  app.add_option("--bytes", options.bytes_text, "bytes per allocation");
  app.add_option("--allocs-per-round", options.allocs_per_round,
                 "cuMemAlloc+cuMemFree pairs per round")
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", options.threads,
                 "threads launching at once, each on its own stream (CPU time per launch)")
      ->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);

  nlohmann::json report = {{"ok", false}};
  try {
    const Driver d = load_driver();
    const Kernel kernel = load_kernel(d);
    const std::vector<double> launch_ns = time_launches(d, kernel, options);
    const size_t bytes = std::stoull(options.bytes_text);
    const std::vector<double> pair_ns = time_alloc_pairs(d, options, bytes);

    report["ok"] = true;
    report["threads"] = options.threads;
    report["launches"] = static_cast<int64_t>(options.rounds) * options.per_round * options.threads;
    report["launch_ns"] = median(launch_ns);
    report["launch_ns_min_round"] =
        launch_ns.empty() ? 0.0 : *std::min_element(launch_ns.begin(), launch_ns.end());
    report["alloc_free_pairs"] =
        static_cast<int64_t>(options.alloc_rounds) * options.allocs_per_round;
    report["alloc_free_ns"] = median(pair_ns);
    report["alloc_bytes"] = bytes;
    std::cout << report.dump() << std::endl;
    return 0;
  } catch (const Failure& failure) {
    report["error"] = failure.message;
    std::cout << report.dump() << std::endl;
    std::cerr << "quanta-bench-launch-loop: " << failure.message << "\n";
    return 1;
  }
}
