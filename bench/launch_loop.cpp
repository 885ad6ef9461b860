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
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**);
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
  if (result != 0) throw Failure{std::string(call) + " failed: CUresult " + std::to_string(result)};
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quanta-bench-launch-loop: per-call cost of cuLaunchKernel and cuMemAlloc+cuMemFree"};
  int rounds = 200;
  int per_round = 100;
  int alloc_rounds = 100;
  int allocs_per_round = 20;
  std::string bytes_text = "1048576";
  app.add_option("--rounds", rounds, "timed rounds of launches")->check(CLI::Range(1, 100000));
  app.add_option("--per-round", per_round, "launches per round (synchronised between rounds)")->check(CLI::Range(1, 1000));
  app.add_option("--alloc-rounds", alloc_rounds, "timed rounds of allocation pairs")->check(CLI::Range(0, 100000));
  app.add_option("--bytes", bytes_text, "bytes per allocation");
  app.add_option("--allocs-per-round", allocs_per_round, "cuMemAlloc+cuMemFree pairs per round")->check(CLI::Range(1, 1000));
  int threads = 1;
  app.add_option("--threads", threads, "threads launching at once, each on its own stream (CPU time per launch)")
      ->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);

  nlohmann::json report = {{"ok", false}};
  try {
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == nullptr) throw Failure{std::string("dlopen failed: ") + dlerror()};
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

    check(d.Init(0), "cuInit");
    CUdevice device = 0;
    check(d.DeviceGet(&device, 0), "cuDeviceGet");
    CUcontext context = nullptr;
    check(d.DevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    check(d.CtxSetCurrent(context), "cuCtxSetCurrent");
    CUmodule module = nullptr;
    check(d.ModuleLoadData(&module, kSpinPtx), "cuModuleLoadData");
    CUfunction spin = nullptr;
    check(d.ModuleGetFunction(&spin, module, "quanta_spin"), "cuModuleGetFunction");
    unsigned long long duration_ns = 0;  // empty kernels: only the call is of interest
    void* parameters[] = {&duration_ns};
    // One launching thread: its rounds, each timed by `clock`.
    auto launcher = [&](clockid_t clock, std::vector<double>* launch_ns) {
      check(d.CtxSetCurrent(context), "cuCtxSetCurrent");
      CUstream stream = nullptr;
      check(d.StreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
      auto launch = [&] { check(d.LaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, parameters, nullptr), "cuLaunchKernel"); };
      // Warm-up: the first launch takes the grant (slow path) and faults in code and data.
      for (int i = 0; i < 20; ++i) {
        for (int k = 0; k < per_round; ++k) launch();
        check(d.StreamSynchronize(stream), "cuStreamSynchronize");
      }
      for (int round = 0; round < rounds; ++round) {
        uint64_t t0 = clock_ns(clock);
        for (int k = 0; k < per_round; ++k) launch();
        uint64_t t1 = clock_ns(clock);
        launch_ns->push_back(static_cast<double>(t1 - t0) / per_round);
        check(d.StreamSynchronize(stream), "cuStreamSynchronize");
      }
    };
    std::vector<double> launch_ns;
    if (threads == 1) {
      launcher(CLOCK_MONOTONIC, &launch_ns);
    } else {
      std::vector<std::vector<double>> per_thread(static_cast<size_t>(threads));
      std::vector<std::string> failures(static_cast<size_t>(threads));
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          try {
            launcher(CLOCK_THREAD_CPUTIME_ID, &per_thread[static_cast<size_t>(t)]);
          } catch (const Failure& failure) {
            failures[static_cast<size_t>(t)] = failure.message;
          }
        });
      }
      for (std::thread& thread : pool) thread.join();
      for (const std::string& failure : failures) {
        if (!failure.empty()) throw Failure{failure};
      }
      for (const auto& of_thread : per_thread) launch_ns.insert(launch_ns.end(), of_thread.begin(), of_thread.end());
    }

    size_t bytes = std::stoull(bytes_text);
    std::vector<double> pair_ns;
    std::vector<CUdeviceptr> pointers(static_cast<size_t>(allocs_per_round));
    for (int round = -5; round < alloc_rounds; ++round) {
      uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
      for (auto& pointer : pointers) {
        check(d.MemAlloc(&pointer, bytes), "cuMemAlloc");
        check(d.MemFree(pointer), "cuMemFree");
      }
      uint64_t t1 = clock_ns(CLOCK_MONOTONIC);
      if (round >= 0) pair_ns.push_back(static_cast<double>(t1 - t0) / allocs_per_round);
    }

    report["ok"] = true;
    report["threads"] = threads;
    report["launches"] = static_cast<int64_t>(rounds) * per_round * threads;
    report["launch_ns"] = median(launch_ns);
    report["launch_ns_min_round"] = launch_ns.empty() ? 0.0 : *std::min_element(launch_ns.begin(), launch_ns.end());
    report["alloc_free_pairs"] = static_cast<int64_t>(alloc_rounds) * allocs_per_round;
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
