// simgpu's multi-process tests: global memory capacity across processes and its
// recovery from a killed process, native time slicing between two closed-loop processes
// judged from the execution log, MIG instances as independent engines, and NVML agreeing
// with what the CUDA side did.
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "../../../common/nvml_api.h"
#include "tests/simgpu/config.h"
#include "tests/simgpu/shared_state.h"
#include "tests/simgpu/tests/child_process.h"
#include "tests/simgpu/tests/spin.h"

using namespace quanta::simgpu::test;

namespace {

// A one-way signal between processes: the writer closes (or writes), the reader sees it.
struct Pipe {
  int fd[2] = {-1, -1};
  Pipe() {
    if (pipe(fd) != 0) std::abort();
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  void close_read() {
    if (fd[0] >= 0) close(fd[0]);
    fd[0] = -1;
  }
  void close_write() {
    if (fd[1] >= 0) close(fd[1]);
    fd[1] = -1;
  }
  void signal() { [[maybe_unused]] ssize_t n = write(fd[1], "x", 1); }
  bool wait() {
    char c;
    return read(fd[0], &c, 1) == 1;
  }
};

int init_context(CUcontext* ctx, int device = 0) {
  CHILD_CU(cuInit(0));
  CHILD_CU(cuDevicePrimaryCtxRetain(ctx, device));
  CHILD_CU(cuCtxSetCurrent(*ctx));
  return 0;
}

std::string temp_log(const std::string& tag) {
  return "/tmp/simgpu-test-" + tag + "-" + std::to_string(getpid()) + ".log";
}

}  // namespace

TEST(SimgpuCapacity, TwoProcessesTogetherHitOutOfMemoryAtTheCapacity) {
  UniqueState state("capacity");
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}};
  Pipe ready, done;
  Child holder = start_child(env, [&] {
    ready.close_read();
    done.close_write();
    CUcontext ctx;
    if (init_context(&ctx) != 0) return 1;
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 600ull << 20));
    ready.signal();
    done.wait();  // hold the memory until the other process has tried
    return 0;
  });
  ready.close_write();
  done.close_read();
  ASSERT_TRUE(ready.wait());
  ChildResult other = run_child(env, [] {
    CUcontext ctx;
    if (init_context(&ctx) != 0) return 1;
    CUdeviceptr p;
    CHILD_CHECK(cuMemAlloc(&p, 600ull << 20) == CUDA_ERROR_OUT_OF_MEMORY);
    CHILD_CU(cuMemAlloc(&p, 424ull << 20));  // exactly what is left: 1 GiB in total
    CUdeviceptr q;
    CHILD_CHECK(cuMemAlloc(&q, 1) == CUDA_ERROR_OUT_OF_MEMORY);
    size_t free = 1, total = 0;
    CHILD_CU(cuMemGetInfo(&free, &total));
    CHILD_CHECK(free == 0 && total == 1ull << 30);
    return 0;
  });
  done.signal();
  ChildResult held = finish_child(holder);
  EXPECT_EQ(other.exit_code, 0) << other.stderr_text;
  EXPECT_EQ(held.exit_code, 0) << held.stderr_text;
}

TEST(SimgpuCapacity, MemoryOfAKilledProcessReturnsToTheDevice) {
  UniqueState state("killed");
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}};
  Pipe ready;
  Child victim = start_child(env, [&] {
    ready.close_read();
    CUcontext ctx;
    if (init_context(&ctx) != 0) return 1;
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 900ull << 20));
    ready.signal();
    pause();
    return 0;
  });
  ready.close_write();
  ASSERT_TRUE(ready.wait());
  ChildResult before = run_child(env, [] {
    CUcontext ctx;
    if (init_context(&ctx) != 0) return 1;
    CUdeviceptr p;
    CHILD_CHECK(cuMemAlloc(&p, 900ull << 20) == CUDA_ERROR_OUT_OF_MEMORY);
    return 0;
  });
  EXPECT_EQ(before.exit_code, 0) << before.stderr_text;
  kill(victim.pid, SIGKILL);
  ChildResult killed = finish_child(victim);
  EXPECT_EQ(killed.signal, SIGKILL);
  ChildResult after = run_child(env, [] {
    CUcontext ctx;
    if (init_context(&ctx) != 0) return 1;
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 900ull << 20));
    return 0;
  });
  EXPECT_EQ(after.exit_code, 0) << after.stderr_text;
}

TEST(SimgpuRecovery, ProcessKilledHoldingTheDeviceLockDoesNotWedgeTheDevice) {
  UniqueState state("wedge");
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}};
  // A live bystander keeps the shared state in use, so it is recovered, not recreated.
  Pipe attached, release;
  Child bystander = start_child(env, [&] {
    attached.close_read();
    release.close_write();
    CUcontext ctx;
    if (init_context(&ctx) != 0) return 1;
    attached.signal();
    release.wait();
    return 0;
  });
  attached.close_write();
  release.close_read();
  ASSERT_TRUE(attached.wait());
  Pipe ready;
  Child victim = start_child(env, [&] {
    ready.close_read();
    quanta::simgpu::Config cfg;
    std::string error;
    CHILD_CHECK(quanta::simgpu::parse_config([](const char* n) -> const char* { return getenv(n); },
                                             cfg, error));
    quanta::simgpu::SharedState* shared = quanta::simgpu::attach_shared_state(cfg, error);
    CHILD_CHECK(shared != nullptr);
    CHILD_CHECK(pthread_mutex_lock(&shared->devices[0].lock) == 0);
    ready.signal();
    pause();  // dies holding the lock
    return 0;
  });
  ready.close_write();
  ASSERT_TRUE(ready.wait());
  kill(victim.pid, SIGKILL);
  finish_child(victim);
  ChildResult after = run_child(env, [] {
    CUcontext ctx;
    CUfunction spin;
    if (init_context(&ctx) != 0) return 1;
    CHILD_CU(load_spin(&spin));
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 512ull << 20));
    CHILD_CU(launch_spin(spin, 1'000'000));
    CHILD_CU(cuCtxSynchronize());
    return 0;
  });
  EXPECT_EQ(after.exit_code, 0) << after.stderr_text;
  release.signal();
  ChildResult stayed = finish_child(bystander);
  EXPECT_EQ(stayed.exit_code, 0) << stayed.stderr_text;
}

TEST(SimgpuSharedState, LaterProcessGetsTheRunningShapeWithAWarningButItsLogIsKept) {
  UniqueState state("shape");
  const std::string log = temp_log("shape");
  unlink(log.c_str());
  Pipe attached, release;
  Child first = start_child({{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}}, [&] {
    attached.close_read();
    release.close_write();
    CUcontext ctx;
    if (init_context(&ctx) != 0) return 1;
    attached.signal();
    release.wait();
    return 0;
  });
  attached.close_write();
  release.close_read();
  ASSERT_TRUE(attached.wait());
  ChildResult later = run_child(
      {{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "2Gi"}, {"SIMGPU_LOG", log}}, [] {
        CUcontext ctx;
        CUfunction spin;
        if (init_context(&ctx) != 0) return 1;
        size_t total = 0;
        CHILD_CU(cuDeviceTotalMem(&total, 0));
        CHILD_CHECK(total == 1ull << 30);
        CHILD_CU(load_spin(&spin));
        CHILD_CU(launch_spin(spin, 1'000'000));
        CHILD_CU(cuCtxSynchronize());
        return 0;
      });
  release.signal();
  finish_child(first);
  EXPECT_EQ(later.exit_code, 0) << later.stderr_text;
  EXPECT_NE(later.stderr_text.find("in use with another device configuration"), std::string::npos)
      << later.stderr_text;
  const auto slices = read_log(log);
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].end - slices[0].start, 1'000'000u);
  unlink(log.c_str());
}

// Two equal closed-loop processes (2 ms kernels, synchronised one at a time) share one
// device for about 1.5 s; the tests below judge the run from its execution log alone.
class SimgpuTimeSlicing : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    state_ = new UniqueState("slicing");
    log_ = temp_log("slicing");
    unlink(log_.c_str());
    const Env env = {{"SIMGPU_STATE", state_->name()}, {"SIMGPU_LOG", log_}};
    Pipe ready_a, ready_b, go;
    auto tenant = [&](Pipe& ready) {
      return [&] {
        ready.close_read();
        go.close_write();
        CUcontext ctx;
        CUfunction spin;
        if (init_context(&ctx) != 0) return 1;
        CHILD_CU(quanta::simgpu::test::load_spin(&spin));
        ready.signal();
        go.wait();
        const uint64_t end = now_ns() + 1'500'000'000ULL;
        while (now_ns() < end) {
          CHILD_CU(launch_spin(spin, 2'000'000));
          CHILD_CU(cuCtxSynchronize());
        }
        return 0;
      };
    };
    Child a = start_child(env, tenant(ready_a));
    Child b = start_child(env, tenant(ready_b));
    ready_a.close_write();
    ready_b.close_write();
    go.close_read();
    ready_a.wait();
    ready_b.wait();
    go.close_write();  // both start together
    result_a_ = new ChildResult(finish_child(a));
    result_b_ = new ChildResult(finish_child(b));
    slices_ = new std::vector<Slice>(read_log(log_));
  }
  static void TearDownTestSuite() {
    unlink(log_.c_str());
    delete state_;
    delete result_a_;
    delete result_b_;
    delete slices_;
  }
  static inline UniqueState* state_ = nullptr;
  static inline std::string log_;
  static inline ChildResult* result_a_ = nullptr;
  static inline ChildResult* result_b_ = nullptr;
  static inline std::vector<Slice>* slices_ = nullptr;
};

TEST_F(SimgpuTimeSlicing, TwoEqualClosedLoopProcessesGetHalfTheDeviceEach) {
  ASSERT_EQ(result_a_->exit_code, 0) << result_a_->stderr_text;
  ASSERT_EQ(result_b_->exit_code, 0) << result_b_->stderr_text;
  std::map<int, uint64_t> busy_by_pid;
  uint64_t first = UINT64_MAX, last = 0;
  for (const Slice& s : *slices_) {
    busy_by_pid[s.pid] += s.end - s.start;
    first = std::min(first, s.start);
    last = std::max(last, s.end);
  }
  ASSERT_EQ(busy_by_pid.size(), 2u);
  uint64_t total = 0;
  for (auto& [pid, busy] : busy_by_pid) total += busy;
  for (auto& [pid, busy] : busy_by_pid) {
    const double share = static_cast<double>(busy) / static_cast<double>(total);
    EXPECT_NEAR(share, 0.5, 0.05) << "pid " << pid;
  }
  // The device was kept busy: contention leaves only switch dead time idle.
  EXPECT_GT(static_cast<double>(total) / static_cast<double>(last - first), 0.8);
}

TEST_F(SimgpuTimeSlicing, ExecutionLogShowsOneContextAtATimeWithSwitchDeadTime) {
  std::vector<Slice> slices = *slices_;
  ASSERT_GT(slices.size(), 100u);
  std::sort(slices.begin(), slices.end(),
            [](const Slice& a, const Slice& b) { return a.start < b.start; });
  int switches = 0;
  for (size_t i = 1; i < slices.size(); ++i) {
    EXPECT_EQ(slices[i].device, 0);
    ASSERT_GE(slices[i].start, slices[i - 1].end) << "slices overlap at " << i;
    EXPECT_LE(slices[i].end - slices[i].start, 1'000'000u) << "slice longer than the time slice";
    if (slices[i].context != slices[i - 1].context) {
      ++switches;
      EXPECT_GE(slices[i].start - slices[i - 1].end, 50'000u)
          << "switch without dead time at " << i;
    }
  }
  EXPECT_GT(switches, 100);
}

TEST(SimgpuMig, InstancesAreIndependentEnginesWithTheirOwnMemory) {
  UniqueState state("mig");
  const std::string log = temp_log("mig");
  unlink(log.c_str());
  const Env env = {{"SIMGPU_STATE", state.name()},
                   {"SIMGPU_MEMORY", "2Gi"},
                   {"SIMGPU_MIG", "0:2"},
                   {"SIMGPU_LOG", log}};
  ChildResult shape = run_child(env, [] {
    CHILD_CU(cuInit(0));
    int count = 0;
    CHILD_CU(cuDeviceGetCount(&count));
    CHILD_CHECK(count == 2);
    size_t total = 0;
    CHILD_CU(cuDeviceTotalMem(&total, 1));
    CHILD_CHECK(total == 1ull << 30);
    CUcontext c0, c1;
    CHILD_CU(cuDevicePrimaryCtxRetain(&c0, 0));
    CHILD_CU(cuDevicePrimaryCtxRetain(&c1, 1));
    CHILD_CU(cuCtxSetCurrent(c0));
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 1ull << 30));  // all of instance 0
    CHILD_CHECK(cuMemAlloc(&p, 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHILD_CU(cuCtxSetCurrent(c1));
    CHILD_CU(cuMemAlloc(&p, 1ull << 30));  // instance 1 is untouched
    return 0;
  });
  EXPECT_EQ(shape.exit_code, 0) << shape.stderr_text;

  // One 50 ms kernel on each instance, launched together: on independent engines they run
  // at the same time (their slices overlap), each for its full 50 ms.
  Pipe ready0, ready1, go;
  auto tenant = [&](Pipe& ready, int device) {
    return [&, device] {
      ready.close_read();
      go.close_write();
      CUcontext ctx;
      CUfunction spin;
      if (init_context(&ctx, device) != 0) return 1;
      CHILD_CU(load_spin(&spin));
      ready.signal();
      go.wait();
      CHILD_CU(launch_spin(spin, 50'000'000));
      CHILD_CU(cuCtxSynchronize());
      return 0;
    };
  };
  Child a = start_child(env, tenant(ready0, 0));
  Child b = start_child(env, tenant(ready1, 1));
  ready0.close_write();
  ready1.close_write();
  go.close_read();
  ready0.wait();
  ready1.wait();
  go.close_write();
  ChildResult ra = finish_child(a);
  ChildResult rb = finish_child(b);
  EXPECT_EQ(ra.exit_code, 0) << ra.stderr_text;
  EXPECT_EQ(rb.exit_code, 0) << rb.stderr_text;
  std::map<int, uint64_t> busy, first, last;
  for (const Slice& s : read_log(log)) {
    busy[s.device] += s.end - s.start;
    first[s.device] = first.count(s.device) ? std::min(first[s.device], s.start) : s.start;
    last[s.device] = std::max(last[s.device], s.end);
  }
  EXPECT_EQ(busy[0], 50'000'000u);
  EXPECT_EQ(busy[1], 50'000'000u);
  EXPECT_LT(std::max(first[0], first[1]), std::min(last[0], last[1]))
      << "the instances ran one after the other";
  unlink(log.c_str());
}

TEST(SimgpuCapacity, EachContextTakesTheDriversOwnMemoryUntilItIsDestroyed) {
  UniqueState state("context-memory");
  const Env env = {{"SIMGPU_STATE", state.name()},
                   {"SIMGPU_MEMORY", "4Gi"},
                   {"SIMGPU_CONTEXT_MEMORY", "518Mi"}};
  ChildResult r = run_child(env, [] {
    constexpr uint64_t kContext = 518ull << 20;
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t dev;
    CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(0, &dev) == NVML_SUCCESS);
    nvmlMemory_t mem;
    CUcontext primary;
    if (init_context(&primary, 0) != 0) return 1;
    size_t free = 0, total = 0;
    CHILD_CU(cuMemGetInfo(&free, &total));
    CHILD_CHECK(total == 4ull << 30 && free == total - kContext);
    CHILD_CHECK(nvmlDeviceGetMemoryInfo(dev, &mem) == NVML_SUCCESS && mem.used == kContext);
    // A second context takes its own; allocations come on top, as NVML counts them.
    CUcontext created;
    CHILD_CU(cuCtxCreate(&created, nullptr, 0, 0));
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 100ull << 20));
    nvmlProcessInfo_t infos[4];
    unsigned n = 4;
    CHILD_CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, infos) == NVML_SUCCESS && n == 1);
    CHILD_CHECK(infos[0].usedGpuMemory == 2 * kContext + (100ull << 20));
    CHILD_CU(cuCtxDestroy(created));
    CHILD_CHECK(nvmlDeviceGetMemoryInfo(dev, &mem) == NVML_SUCCESS && mem.used == kContext);
    // A context that does not fit is refused like an allocation.
    CHILD_CU(cuCtxSetCurrent(primary));
    CHILD_CU(cuMemAlloc(&p, (4ull << 30) - kContext - (100ull << 20)));
    CHILD_CHECK(cuCtxCreate(&created, nullptr, 0, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHILD_CU(cuDevicePrimaryCtxRelease(0));
    CHILD_CHECK(nvmlDeviceGetMemoryInfo(dev, &mem) == NVML_SUCCESS && mem.used == 0);
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

TEST(SimgpuNvml, MemoryAndProcessListAgreeWithTheCudaSide) {
  UniqueState state("nvml");
  const Env env = {
      {"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "4Gi"}, {"SIMGPU_DEVICES", "2"}};
  Pipe ready, done;
  Child user = start_child(env, [&] {
    ready.close_read();
    done.close_write();
    CUcontext ctx;
    if (init_context(&ctx, 1) != 0) return 1;
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 300ull << 20));
    ready.signal();
    done.wait();
    return 0;
  });
  ready.close_write();
  done.close_read();
  ASSERT_TRUE(ready.wait());
  const int user_pid = user.pid;
  ChildResult observer = run_child(env, [user_pid] {
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    unsigned count = 0;
    CHILD_CHECK(nvmlDeviceGetCount_v2(&count) == NVML_SUCCESS && count == 2);
    nvmlDevice_t dev;
    CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(1, &dev) == NVML_SUCCESS);
    char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
    CHILD_CHECK(nvmlDeviceGetUUID(dev, uuid, sizeof uuid) == NVML_SUCCESS);
    nvmlDevice_t same;
    CHILD_CHECK(nvmlDeviceGetHandleByUUID(uuid, &same) == NVML_SUCCESS && same == dev);
    unsigned index = 9;
    CHILD_CHECK(nvmlDeviceGetIndex(dev, &index) == NVML_SUCCESS && index == 1);

    // The UUID NVML gives is the one cuDeviceGetUuid gives, in text form.
    CHILD_CU(cuInit(0));
    CUuuid raw;
    CHILD_CU(cuDeviceGetUuid(&raw, 1));
    char expect[64];
    const unsigned char* b = reinterpret_cast<const unsigned char*>(raw.bytes);
    std::snprintf(expect, sizeof expect,
                  "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                  b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                  b[14], b[15]);
    CHILD_CHECK(std::string(uuid) == expect);

    nvmlMemory_t mem;
    CHILD_CHECK(nvmlDeviceGetMemoryInfo(dev, &mem) == NVML_SUCCESS);
    CHILD_CHECK(mem.total == 4ull << 30 && mem.used == 300ull << 20 &&
                mem.free == mem.total - mem.used);
    nvmlMemory_v2_t mem2{};
    mem2.version = nvmlMemory_v2;
    CHILD_CHECK(nvmlDeviceGetMemoryInfo_v2(dev, &mem2) == NVML_SUCCESS && mem2.used == mem.used);

    unsigned n = 0;
    CHILD_CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, nullptr) ==
                    NVML_ERROR_INSUFFICIENT_SIZE &&
                n == 1);
    nvmlProcessInfo_t infos[4];
    n = 4;
    CHILD_CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, infos) == NVML_SUCCESS && n == 1);
    CHILD_CHECK(static_cast<int>(infos[0].pid) == user_pid && infos[0].usedGpuMemory == 300ull
                                                                                            << 20);
    nvmlProcessInfo_v1_t legacy[4];
    n = 4;
    CHILD_CHECK(nvmlDeviceGetComputeRunningProcesses(dev, &n, legacy) == NVML_SUCCESS && n == 1);
    CHILD_CHECK(legacy[0].usedGpuMemory == 300ull << 20);

    nvmlDevice_t other;
    CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(0, &other) == NVML_SUCCESS);
    n = 4;
    CHILD_CHECK(nvmlDeviceGetComputeRunningProcesses_v2(
                    other, &n, reinterpret_cast<nvmlProcessInfo_v2_t*>(infos)) == NVML_SUCCESS &&
                n == 0);
    nvmlUtilization_t util;
    CHILD_CHECK(nvmlDeviceGetUtilizationRates(dev, &util) == NVML_SUCCESS && util.gpu == 0);
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    CHILD_CHECK(nvmlSystemGetDriverVersion(driver, sizeof driver) == NVML_SUCCESS);
    CHILD_CHECK(nvmlShutdown() == NVML_SUCCESS);
    return 0;
  });
  EXPECT_EQ(observer.exit_code, 0) << observer.stderr_text;
  done.signal();
  ChildResult used = finish_child(user);
  EXPECT_EQ(used.exit_code, 0) << used.stderr_text;
}

namespace {

// The UUID NVML reports for device-list index `index` (NVML ignores CUDA_VISIBLE_DEVICES).
std::string nvml_uuid(unsigned index) {
  nvmlDevice_t dev;
  char uuid[NVML_DEVICE_UUID_BUFFER_SIZE] = {};
  if (nvmlDeviceGetHandleByIndex_v2(index, &dev) != NVML_SUCCESS ||
      nvmlDeviceGetUUID(dev, uuid, sizeof uuid) != NVML_SUCCESS)
    return "";
  return uuid;
}

// cuDeviceGetUuid_v2 of a CUDA ordinal (a MIG instance's own UUID), in NVML's text form.
std::string cuda_uuid(CUdevice ordinal, const char* prefix) {
  CUuuid raw;
  if (cuDeviceGetUuid_v2(&raw, ordinal) != CUDA_SUCCESS) return "";
  const auto* b = reinterpret_cast<const unsigned char*>(raw.bytes);
  char text[64];
  std::snprintf(text, sizeof text,
                "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix,
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                b[13], b[14], b[15]);
  return text;
}

// Device-list UUIDs of a fresh state of `env`'s shape, read through NVML in a child (the
// test process itself never attaches, so each scenario child starts its own driver).
std::vector<std::string> device_uuids(const Env& env, unsigned count) {
  Pipe out;
  Child c = start_child(env, [&] {
    out.close_read();
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    for (unsigned i = 0; i < count; ++i) {
      const std::string u = nvml_uuid(i) + "\n";
      CHILD_CHECK(write(out.fd[1], u.data(), u.size()) == static_cast<ssize_t>(u.size()));
    }
    return 0;
  });
  out.close_write();
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(out.fd[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  finish_child(c);
  std::vector<std::string> uuids;
  for (size_t start = 0, end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    uuids.push_back(text.substr(start, end - start));
  return uuids;
}

Env with(Env env, const std::string& key, const std::string& value) {
  env.emplace_back(key, value);
  return env;
}

}  // namespace

TEST(SimgpuVisibleDevices, IndexesReorderCudaOrdinalsWhileNvmlKeepsPhysicalOrder) {
  UniqueState state("visible-order");
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_DEVICES", "3"}};
  ChildResult r = run_child(with(env, "CUDA_VISIBLE_DEVICES", "2,0"), [] {
    CHILD_CU(cuInit(0));
    int count = 0;
    CHILD_CU(cuDeviceGetCount(&count));
    CHILD_CHECK(count == 2);
    CUdevice dev;
    CHILD_CHECK(cuDeviceGet(&dev, 2) == CUDA_ERROR_INVALID_DEVICE);
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    unsigned nvml_count = 0;
    CHILD_CHECK(nvmlDeviceGetCount_v2(&nvml_count) == NVML_SUCCESS && nvml_count == 3);
    CHILD_CHECK(cuda_uuid(0, "GPU-") == nvml_uuid(2));
    CHILD_CHECK(cuda_uuid(1, "GPU-") == nvml_uuid(0));
    char bus[32];
    CHILD_CU(cuDeviceGetPCIBusId(bus, sizeof bus, 0));
    CHILD_CHECK(std::string(bus) == "00000000:12:00.0");
    CHILD_CU(cuDeviceGetByPCIBusId(&dev, "00000000:10:00.0"));
    CHILD_CHECK(dev == 1);
    CHILD_CHECK(cuDeviceGetByPCIBusId(&dev, "00000000:11:00.0") == CUDA_ERROR_INVALID_DEVICE);
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

TEST(SimgpuVisibleDevices, FullUuidsAndUniquePrefixesSelectDevices) {
  UniqueState state("visible-uuid");
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_DEVICES", "3"}};
  const std::vector<std::string> uuids = device_uuids(env, 3);
  ASSERT_EQ(uuids.size(), 3u);
  // The shortest prefix of device 1's UUID that no other device shares.
  std::string prefix = "GPU-";
  while (std::count_if(uuids.begin(), uuids.end(), [&](const std::string& u) {
           return u.compare(0, prefix.size(), prefix) == 0;
         }) > 1)
    prefix = uuids[1].substr(0, prefix.size() + 1);
  for (const std::string& list : {uuids[1] + "," + uuids[2], prefix + "," + uuids[2]}) {
    ChildResult r = run_child(with(env, "CUDA_VISIBLE_DEVICES", list), [&] {
      CHILD_CU(cuInit(0));
      int count = 0;
      CHILD_CU(cuDeviceGetCount(&count));
      CHILD_CHECK(count == 2);
      CHILD_CHECK(cuda_uuid(0, "GPU-") == uuids[1]);
      CHILD_CHECK(cuda_uuid(1, "GPU-") == uuids[2]);
      return 0;
    });
    EXPECT_EQ(r.exit_code, 0) << list << ": " << r.stderr_text;
  }
}

TEST(SimgpuVisibleDevices, ListEndsAtTheFirstInvalidEntryAndAnEmptyListHidesEveryDevice) {
  UniqueState state("visible-invalid");
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_DEVICES", "3"}};
  ChildResult truncated = run_child(with(env, "CUDA_VISIBLE_DEVICES", "1,7,0"), [] {
    CHILD_CU(cuInit(0));
    int count = 0;
    CHILD_CU(cuDeviceGetCount(&count));
    CHILD_CHECK(count == 1);
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CHILD_CHECK(cuda_uuid(0, "GPU-") == nvml_uuid(1));
    return 0;
  });
  EXPECT_EQ(truncated.exit_code, 0) << truncated.stderr_text;
  for (const char* list : {"", "-1", "GPU-ffffffff-nothing", "9,0"}) {
    ChildResult none = run_child(with(env, "CUDA_VISIBLE_DEVICES", list), [] {
      CHILD_CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE);
      int count = -1;
      CHILD_CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
      // NVML still sees every device.
      unsigned nvml_count = 0;
      CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
      CHILD_CHECK(nvmlDeviceGetCount_v2(&nvml_count) == NVML_SUCCESS && nvml_count == 3);
      return 0;
    });
    EXPECT_EQ(none.exit_code, 0) << "'" << list << "': " << none.stderr_text;
  }
}

// Failure mode 7 of ANCHORS.md at the driver level: ordinal 0 under CUDA_VISIBLE_DEVICES=1
// is physical device 1 for memory, NVML's views, contexts and the execution log.
TEST(SimgpuVisibleDevices, WorkAndMemoryOfOrdinalZeroGoToTheVisiblePhysicalDevice) {
  UniqueState state("visible-charge");
  const std::string log = temp_log("visible-charge");
  unlink(log.c_str());
  const Env env = {{"SIMGPU_STATE", state.name()},
                   {"SIMGPU_DEVICES", "2"},
                   {"SIMGPU_MEMORY", "4Gi"},
                   {"SIMGPU_LOG", log}};
  const std::vector<std::string> uuids = device_uuids(env, 2);
  ASSERT_EQ(uuids.size(), 2u);
  for (const std::string& list : {std::string("1"), uuids[1]}) {
    unlink(log.c_str());
    ChildResult r = run_child(with(env, "CUDA_VISIBLE_DEVICES", list), [] {
      CUcontext ctx;
      if (init_context(&ctx, 0) != 0) return 1;
      CUdeviceptr p;
      CHILD_CU(cuMemAlloc(&p, 300ull << 20));
      size_t free = 0, total = 0;
      CHILD_CU(cuMemGetInfo(&free, &total));
      CHILD_CHECK(total == 4ull << 30 && free == total - (300ull << 20));
      CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
      nvmlDevice_t physical0, physical1;
      CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(0, &physical0) == NVML_SUCCESS);
      CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(1, &physical1) == NVML_SUCCESS);
      nvmlMemory_t mem;
      CHILD_CHECK(nvmlDeviceGetMemoryInfo(physical1, &mem) == NVML_SUCCESS);
      CHILD_CHECK(mem.used == 300ull << 20);
      CHILD_CHECK(nvmlDeviceGetMemoryInfo(physical0, &mem) == NVML_SUCCESS && mem.used == 0);
      nvmlProcessInfo_t infos[4];
      unsigned n = 4;
      CHILD_CHECK(nvmlDeviceGetComputeRunningProcesses_v3(physical1, &n, infos) ==
                      NVML_SUCCESS &&
                  n == 1);
      CHILD_CHECK(static_cast<pid_t>(infos[0].pid) == getpid() &&
                  infos[0].usedGpuMemory == 300ull << 20);
      n = 4;
      CHILD_CHECK(nvmlDeviceGetComputeRunningProcesses_v3(physical0, &n, infos) ==
                      NVML_SUCCESS &&
                  n == 0);
      CUfunction spin;
      CHILD_CU(load_spin(&spin));
      CHILD_CU(launch_spin(spin, 1'000'000));
      CHILD_CU(cuCtxSynchronize());
      CHILD_CU(cuMemFree(p));
      CHILD_CHECK(nvmlDeviceGetMemoryInfo(physical1, &mem) == NVML_SUCCESS && mem.used == 0);
      return 0;
    });
    EXPECT_EQ(r.exit_code, 0) << list << ": " << r.stderr_text;
    const auto slices = read_log(log);
    ASSERT_EQ(slices.size(), 1u) << list;
    EXPECT_EQ(slices[0].device, 1) << list;
  }
  unlink(log.c_str());
}

TEST(SimgpuVisibleDevices, MigUuidSelectsOneInstanceWithItsShareOfMemory) {
  UniqueState state("visible-mig");
  const Env env = {{"SIMGPU_STATE", state.name()},
                   {"SIMGPU_DEVICES", "2"},
                   {"SIMGPU_MEMORY", "2Gi"},
                   {"SIMGPU_MIG", "1:2"}};
  const std::vector<std::string> uuids = device_uuids(env, 3);
  ASSERT_EQ(uuids.size(), 3u);
  ASSERT_EQ(uuids[2].compare(0, 4, "MIG-"), 0) << uuids[2];
  ChildResult r = run_child(with(env, "CUDA_VISIBLE_DEVICES", uuids[2]), [&] {
    CUcontext ctx;
    if (init_context(&ctx, 0) != 0) return 1;
    int count = 0;
    CHILD_CU(cuDeviceGetCount(&count));
    CHILD_CHECK(count == 1);
    CHILD_CHECK(cuda_uuid(0, "MIG-") == uuids[2]);
    // The legacy entry (cuda.h maps the name to _v2, so look it up) names the instance's
    // parent GPU, as the driver's does; the shim tells MIG instances apart by that.
    using GetUuid = CUresult (*)(CUuuid*, CUdevice);
    auto legacy_entry = reinterpret_cast<GetUuid>(dlsym(RTLD_DEFAULT, "cuDeviceGetUuid"));
    CHILD_CHECK(legacy_entry != nullptr);
    CUuuid legacy, own;
    CHILD_CU(legacy_entry(&legacy, 0));
    CHILD_CU(cuDeviceGetUuid_v2(&own, 0));
    CHILD_CHECK(std::memcmp(legacy.bytes, own.bytes, 16) != 0);
    size_t total = 0;
    CHILD_CU(cuDeviceTotalMem(&total, 0));
    CHILD_CHECK(total == 1ull << 30);
    CUdeviceptr p;
    CHILD_CU(cuMemAlloc(&p, 1ull << 30));
    CHILD_CHECK(cuMemAlloc(&p, 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t dev;
    nvmlMemory_t mem;
    for (unsigned i = 0; i < 3; ++i) {
      CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(i, &dev) == NVML_SUCCESS);
      CHILD_CHECK(nvmlDeviceGetMemoryInfo(dev, &mem) == NVML_SUCCESS);
      CHILD_CHECK(mem.used == (i == 2 ? 1ull << 30 : 0));
    }
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

namespace {

// What an observer process read from NVML at one instant (CLOCK_MONOTONIC `at_ns`).
struct UtilReading {
  uint64_t at_ns = 0;
  uint64_t since_ns = 0;  // the start of the period the samples cover (lastSeen, as monotonic)
  unsigned device_percent = 0;
  std::map<int, unsigned> process_percent;
};

// Parses the observer's "reading AT SINCE DEVICE" and "sample PID PERCENT" lines.
std::vector<UtilReading> parse_readings(const std::string& text) {
  std::vector<UtilReading> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string tag;
    f >> tag;
    if (tag == "reading") {
      UtilReading r;
      f >> r.at_ns >> r.since_ns >> r.device_percent;
      out.push_back(r);
    } else if (tag == "sample" && !out.empty()) {
      int pid = 0;
      unsigned pct = 0;
      f >> pid >> pct;
      out.back().process_percent[pid] = pct;
    }
  }
  return out;
}

}  // namespace

// Two processes on one device, one busy all the time and one a quarter of the time: NVML's
// per-process utilisation gives each its own busy fraction (not the device's), and the
// device's figure is their sum, both as the execution log accounts them.
TEST(SimgpuNvml, ProcessAndDeviceUtilisationAgreeWithTheExecutionLog) {
  UniqueState state("util");
  const std::string log = temp_log("util");
  unlink(log.c_str());
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_LOG", log}};
  Pipe ready_busy, ready_light, go;
  auto tenant = [&](Pipe& ready, uint64_t kernel_ns, uint64_t pause_ns) {
    return [&, kernel_ns, pause_ns] {
      ready.close_read();
      go.close_write();
      CUcontext ctx;
      CUfunction spin;
      if (init_context(&ctx) != 0) return 1;
      CHILD_CU(load_spin(&spin));
      ready.signal();
      go.wait();
      const uint64_t end = now_ns() + 2'400'000'000ULL;
      while (now_ns() < end) {
        CHILD_CU(launch_spin(spin, kernel_ns));
        CHILD_CU(cuCtxSynchronize());
        if (pause_ns != 0) {
          timespec pause{0, static_cast<long>(pause_ns)};
          nanosleep(&pause, nullptr);
        }
      }
      return 0;
    };
  };
  Child busy = start_child(env, tenant(ready_busy, 2'000'000, 0));
  Child light = start_child(env, tenant(ready_light, 2'000'000, 6'000'000));
  ready_busy.close_write();
  ready_light.close_write();
  go.close_read();
  ready_busy.wait();
  ready_light.wait();
  go.close_write();

  ChildResult observer = run_child(env, [&] {
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t dev;
    CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(0, &dev) == NVML_SUCCESS);
    timespec settle{1, 0};
    nanosleep(&settle, nullptr);
    unsigned long long last_seen = 0;
    for (int i = 0; i < 4; ++i) {
      unsigned n = 0;
      CHILD_CHECK(nvmlDeviceGetProcessUtilization(dev, nullptr, &n, last_seen) ==
                  NVML_ERROR_INSUFFICIENT_SIZE);
      CHILD_CHECK(n == 2);
      nvmlProcessUtilizationSample_t samples[4];
      n = 4;
      const uint64_t at = now_ns();
      timespec real{};
      clock_gettime(CLOCK_REALTIME, &real);
      const unsigned long long real_us =
          static_cast<unsigned long long>(real.tv_sec) * 1'000'000ULL + real.tv_nsec / 1000;
      CHILD_CHECK(nvmlDeviceGetProcessUtilization(dev, samples, &n, last_seen) == NVML_SUCCESS);
      nvmlUtilization_t util;
      CHILD_CHECK(nvmlDeviceGetUtilizationRates(dev, &util) == NVML_SUCCESS);
      // The period covered: from lastSeen (0 on the first query: the last 0.9 s).
      const uint64_t since = last_seen == 0 ? at - 900'000'000ULL : at - (real_us - last_seen) * 1000;
      std::fprintf(stderr, "reading %llu %llu %u\n", static_cast<unsigned long long>(at),
                   static_cast<unsigned long long>(since), util.gpu);
      for (unsigned k = 0; k < n; ++k) {
        CHILD_CHECK(samples[k].timeStamp + 100'000 >= real_us);  // stamped now (CPU time, us)
        std::fprintf(stderr, "sample %u %u\n", samples[k].pid, samples[k].smUtil);
      }
      last_seen = samples[0].timeStamp;
      timespec gap{0, 300'000'000};
      nanosleep(&gap, nullptr);
    }
    return 0;
  });
  ChildResult rb = finish_child(busy);
  ChildResult rl = finish_child(light);
  ASSERT_EQ(observer.exit_code, 0) << observer.stderr_text;
  ASSERT_EQ(rb.exit_code, 0) << rb.stderr_text;
  ASSERT_EQ(rl.exit_code, 0) << rl.stderr_text;
  const std::vector<UtilReading> readings = parse_readings(observer.stderr_text);
  ASSERT_EQ(readings.size(), 4u) << observer.stderr_text;
  const std::vector<Slice> slices = read_log(log);
  for (const UtilReading& r : readings) {
    // The device's figure covers whole 100 ms buckets back to 0.9-1 s before the query.
    const uint64_t device_from = (r.at_ns / 100'000'000ULL - 9) * 100'000'000ULL;
    std::map<int, uint64_t> busy_ns;
    uint64_t device_ns = 0;
    for (const Slice& s : slices) {
      const uint64_t from = std::max(s.start, r.since_ns);
      const uint64_t to = std::min(s.end, r.at_ns);
      if (to > from) busy_ns[s.pid] += to - from;
      const uint64_t dfrom = std::max(s.start, device_from);
      if (to > dfrom) device_ns += to - dfrom;
    }
    const double window = static_cast<double>(r.at_ns - r.since_ns);
    ASSERT_EQ(r.process_percent.size(), 2u);
    std::vector<double> shares;
    for (const auto& [pid, pct] : r.process_percent) {
      const double logged = 100.0 * static_cast<double>(busy_ns[pid]) / window;
      // Buckets are 100 ms: the one the period starts in is counted pro rata.
      EXPECT_NEAR(pct, logged, 8.0) << "pid " << pid << " at " << r.at_ns;
      shares.push_back(pct);
    }
    // The light process runs about a quarter of the time, the busy one the rest.
    EXPECT_GT(std::fabs(shares[0] - shares[1]), 20.0) << "every process shows one value";
    const double device_logged =
        100.0 * static_cast<double>(device_ns) / static_cast<double>(r.at_ns - device_from);
    EXPECT_NEAR(r.device_percent, device_logged, 3.0);
    EXPECT_NEAR(r.device_percent, shares[0] + shares[1], 10.0);
  }
  unlink(log.c_str());
}

// No process on the device: NOT_FOUND; a MIG instance: NOT_SUPPORTED for both utilisation
// queries, as NVML answers on a MIG device.
TEST(SimgpuNvml, UtilisationQueriesAnswerLikeNvmlWhenThereIsNothingToReport) {
  UniqueState state("util-none");
  const Env env = {{"SIMGPU_STATE", state.name()}, {"SIMGPU_DEVICES", "2"}, {"SIMGPU_MIG", "1:2"}};
  ChildResult r = run_child(env, [] {
    CHILD_CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t whole, mig;
    CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(0, &whole) == NVML_SUCCESS);
    CHILD_CHECK(nvmlDeviceGetHandleByIndex_v2(1, &mig) == NVML_SUCCESS);
    unsigned n = 7;
    nvmlProcessUtilizationSample_t samples[2];
    CHILD_CHECK(nvmlDeviceGetProcessUtilization(whole, samples, &n, 0) == NVML_ERROR_NOT_FOUND);
    CHILD_CHECK(n == 0);
    CHILD_CHECK(nvmlDeviceGetProcessUtilization(whole, samples, nullptr, 0) ==
                NVML_ERROR_INVALID_ARGUMENT);
    nvmlUtilization_t util;
    CHILD_CHECK(nvmlDeviceGetUtilizationRates(whole, &util) == NVML_SUCCESS && util.gpu == 0);
    CHILD_CHECK(nvmlDeviceGetUtilizationRates(mig, &util) == NVML_ERROR_NOT_SUPPORTED);
    n = 2;
    CHILD_CHECK(nvmlDeviceGetProcessUtilization(mig, samples, &n, 0) == NVML_ERROR_NOT_SUPPORTED);
    unsigned is_mig = 9, id = 9;
    CHILD_CHECK(nvmlDeviceIsMigDeviceHandle(whole, &is_mig) == NVML_SUCCESS && is_mig == 0);
    CHILD_CHECK(nvmlDeviceGetGpuInstanceId(whole, &id) == NVML_ERROR_NOT_SUPPORTED);
    CHILD_CHECK(nvmlDeviceIsMigDeviceHandle(mig, &is_mig) == NVML_SUCCESS && is_mig == 1);
    CHILD_CHECK(nvmlDeviceGetGpuInstanceId(mig, &id) == NVML_SUCCESS && id == 0);
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}
