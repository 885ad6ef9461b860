// Runs the real quanta-tenant binary on simgpu and checks what it reports: every mode's
// JSON summary, every driver lookup path, request latency on an idle device, memory
// denials at the device's capacity, CUDA errors by name, and bad options rejected.
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
  nlohmann::json json;  // stdout parsed, when it parses as one JSON value
};

class TenantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One simgpu world per test, so parallel tests never share device memory.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    state_ = std::string("quanta-tenant-test-") + info->name() + "-" + std::to_string(getpid());
    for (char& c : state_) {
      if (!isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
    }
  }
  void TearDown() override { shm_unlink(("/" + state_).c_str()); }

  Result run(const std::vector<std::string>& arguments,
             const std::map<std::string, std::string>& env = {}) {
    std::map<std::string, std::string> variables;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string text = *entry;
      auto equals = text.find('=');
      if (equals != std::string::npos) variables[text.substr(0, equals)] = text.substr(equals + 1);
    }
    variables["LD_LIBRARY_PATH"] = QUANTA_SIMGPU_DIR;
    variables["SIMGPU_STATE"] = state_;
    variables.erase("QUANTA_POD");
    for (const auto& [key, value] : env) variables[key] = value;
    std::vector<std::string> env_text;
    for (const auto& [key, value] : variables) env_text.push_back(key + "=" + value);
    std::vector<char*> envp;
    for (auto& text : env_text) envp.push_back(text.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_text = {QUANTA_TENANT_BINARY};
    argv_text.insert(argv_text.end(), arguments.begin(), arguments.end());
    std::vector<char*> argv;
    for (auto& text : argv_text) argv.push_back(text.data());
    argv.push_back(nullptr);

    int out_pipe[2], err_pipe[2];
    EXPECT_EQ(pipe(out_pipe), 0);
    EXPECT_EQ(pipe(err_pipe), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
      posix_spawn_file_actions_addclose(&actions, fd);
    pid_t pid = -1;
    const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(out_pipe[1]);
    close(err_pipe[1]);
    Result result;
    if (spawned != 0) {
      ADD_FAILURE() << "posix_spawn " << argv[0] << " failed: " << spawned;
      close(out_pipe[0]);
      close(err_pipe[0]);
      return result;
    }
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    std::string* sinks[2] = {&result.out, &result.err};
    int open_fds = 2;
    while (open_fds > 0) {
      if (poll(fds, 2, -1) < 0) break;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || fds[i].revents == 0) continue;
        char buffer[4096];
        const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
        if (n > 0) {
          sinks[i]->append(buffer, static_cast<size_t>(n));
        } else {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        }
      }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.json = nlohmann::json::parse(result.out, nullptr, false);
    return result;
  }

  // Runs with --json and expects success and one JSON object on stdout.
  nlohmann::json run_json(std::vector<std::string> arguments,
                          const std::map<std::string, std::string>& env = {}) {
    arguments.insert(arguments.begin(), "--json");
    Result result = run(arguments, env);
    EXPECT_EQ(result.exit_code, 0) << "stderr: " << result.err << "\nstdout: " << result.out;
    EXPECT_TRUE(result.json.is_object()) << "stdout is not one JSON object: " << result.out;
    if (!result.json.is_object()) return nlohmann::json::object();
    EXPECT_EQ(result.json.value("ok", false), true) << result.out;
    return result.json;
  }

  static void expect_fields(const nlohmann::json& report, const std::vector<std::string>& fields) {
    for (const auto& field : fields)
      EXPECT_TRUE(report.contains(field)) << "missing field " << field << " in " << report.dump();
  }

  std::string state_;
};

TEST_F(TenantTest, BatchReportsCompletedKernelsAndUsefulThroughput) {
  auto report =
      run_json({"batch", "--seconds", "1", "--kernel-ms", "2", "--depth", "2", "--label", "solo"});
  expect_fields(report, {"mode", "lookup", "pid", "pod", "label", "kernels", "kernel_seconds",
                         "wall_seconds", "useful_per_s", "launch_ns_p50", "driver_version"});
  EXPECT_EQ(report["mode"], "batch");
  EXPECT_EQ(report["label"], "solo");
  const auto kernels = report["kernels"].get<std::uint64_t>();
  // 500 fit in a second, plus the two in flight at the deadline; a loaded test machine
  // delivers fewer, so the lower bound only rules out a stalled loop.
  EXPECT_GE(kernels, 150u);
  EXPECT_LE(kernels, 502u);
  EXPECT_NEAR(report["kernel_seconds"].get<double>(), static_cast<double>(kernels) * 0.002, 1e-9);
  const double useful = report["useful_per_s"].get<double>();
  EXPECT_NEAR(useful, report["kernel_seconds"].get<double>() / report["wall_seconds"].get<double>(),
              1e-9);
  EXPECT_GE(report["wall_seconds"].get<double>(), 1.0);
  // Alone on the device with two kernels queued it is busy most of the time; the bound
  // leaves room for a loaded test machine.
  EXPECT_GT(useful, 0.3);
  EXPECT_LE(useful, 1.02);
}

class TenantLookupTest : public TenantTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(TenantLookupTest, BatchCompletesKernelsThroughLookupPath) {
  auto report = run_json({"--lookup", GetParam(), "batch", "--seconds", "0.5", "--kernel-ms", "1"});
  EXPECT_EQ(report["lookup"], GetParam());
  EXPECT_GT(report["kernels"].get<std::uint64_t>(), 100u);
  for (const auto& missing : report["missing_entries"]) {
    EXPECT_NE(missing, "cuLaunchKernel");
    EXPECT_NE(missing, "cuModuleLoadData");
  }
  if (GetParam().rfind("getproc", 0) == 0) {
    EXPECT_EQ(report["cuda_version"], 12080);
  }
  // Each path lands on the variant its real counterpart would call.
  const bool per_thread = GetParam() == "getproc-ptds";
  EXPECT_EQ(report["entry_points"]["cuLaunchKernel"],
            per_thread ? "cuLaunchKernel_ptsz@libcuda.so.1" : "cuLaunchKernel@libcuda.so.1");
  EXPECT_EQ(
      report["entry_points"]["cuStreamSynchronize"],
      per_thread ? "cuStreamSynchronize_ptsz@libcuda.so.1" : "cuStreamSynchronize@libcuda.so.1");
  EXPECT_EQ(report["entry_points"]["cuMemAlloc"], "cuMemAlloc_v2@libcuda.so.1");
}

INSTANTIATE_TEST_SUITE_P(AllPaths, TenantLookupTest,
                         ::testing::Values("direct", "dlsym", "getproc", "getproc-ptds"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST_F(TenantTest, RequestsOnIdleDeviceHaveMedianLatencyNearKernelLength) {
  // 20 ms kernels at 25/s keep the device half idle; 20% of the kernel is 4 ms, more than
  // the wake-up delays of a busy test machine.
  auto report = run_json({"requests", "--seconds", "1", "--rate", "25", "--kernel-ms", "20"});
  expect_fields(report, {"p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "count", "missed",
                         "late", "service_p50_ms", "service_p99_ms"});
  EXPECT_EQ(report["count"], 25);
  EXPECT_EQ(report["missed"], 0);
  EXPECT_NEAR(report["p50_ms"].get<double>(), 20.0, 4.0);  // within 20%
  EXPECT_GE(report["p50_ms"].get<double>(), 20.0 * 0.98);  // never shorter than the kernel
  EXPECT_LE(report["p50_ms"].get<double>(), report["p90_ms"].get<double>());
  EXPECT_LE(report["p99_ms"].get<double>(), report["max_ms"].get<double>());
}

TEST_F(TenantTest, RequestsQueueBehindEachOtherWhenRateExceedsCapacity) {
  // 10 ms kernels at 200/s: arrivals pile up, and latency counts from the arrival.
  auto report = run_json({"requests", "--seconds", "0.5", "--rate", "200", "--kernel-ms", "10"});
  EXPECT_GT(report["missed"].get<std::uint64_t>(), 0u);
  EXPECT_GT(report["late"].get<std::uint64_t>(), 0u);
  EXPECT_GT(report["max_ms"].get<double>(), 100.0);
}

TEST_F(TenantTest, AllocRaceStopsAtFirstDenialAtDeviceCapacity) {
  auto report = run_json({"alloc", "--race", "--bytes", "64Mi"}, {{"SIMGPU_MEMORY", "256Mi"}});
  expect_fields(report, {"family", "successes", "oom", "errors", "peak_bytes_held", "allocs_per_s",
                         "alloc_free_ns"});
  EXPECT_EQ(report["oom"], 1);
  EXPECT_EQ(report["error_count"], 0);
  const auto successes = report["successes"].get<std::uint64_t>();
  EXPECT_GE(successes, 3u);
  EXPECT_LE(successes, 4u);
  EXPECT_EQ(report["peak_bytes_held"].get<std::uint64_t>(), successes * (64ull << 20));
}

TEST_F(TenantTest, AllocHoldingPastCapacityCountsEachDenialAndSucceeds) {
  auto report =
      run_json({"alloc", "--count", "6", "--bytes", "64Mi"}, {{"SIMGPU_MEMORY", "256Mi"}});
  EXPECT_EQ(report["attempts"], 6);
  EXPECT_GE(report["oom"].get<std::uint64_t>(), 2u);
  EXPECT_EQ(report["successes"].get<std::uint64_t>() + report["oom"].get<std::uint64_t>(), 6u);
}

TEST_F(TenantTest, AllocFreeingEachNeverRunsOutOfMemory) {
  auto report = run_json({"alloc", "--count", "20", "--bytes", "200Mi", "--free"},
                         {{"SIMGPU_MEMORY", "256Mi"}});
  EXPECT_EQ(report["successes"], 20);
  EXPECT_EQ(report["oom"], 0);
  EXPECT_EQ(report["peak_bytes_held"], 200ull << 20);
}

class TenantFamilyTest : public TenantTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(TenantFamilyTest, FamilyAllocatesAndFrees) {
  auto report =
      run_json({"alloc", "--family", GetParam(), "--count", "2", "--bytes", "1Mi", "--free"});
  EXPECT_EQ(report["family"], GetParam());
  EXPECT_EQ(report["successes"], 2) << report.dump();
  EXPECT_EQ(report["error_count"], 0) << report.dump();
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, TenantFamilyTest,
                         ::testing::Values("alloc", "pitch", "managed", "host", "vmm", "async",
                                           "pool", "array", "array3d", "mipmapped", "graph-node"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST_F(TenantTest, InfoListsEveryDeviceWithUuidAndMemory) {
  auto report = run_json({"info"}, {{"SIMGPU_DEVICES", "2"}, {"SIMGPU_MEMORY", "1Gi"}});
  ASSERT_EQ(report["device_count"], 2);
  ASSERT_EQ(report["devices"].size(), 2u);
  for (const auto& device : report["devices"]) {
    expect_fields(device, {"index", "name", "uuid", "total_mem", "mem_free", "mem_total"});
    EXPECT_EQ(device["uuid"].get<std::string>().rfind("GPU-", 0), 0u);
    EXPECT_EQ(device["total_mem"], 1ull << 30);
    EXPECT_EQ(device["mem_total"], 1ull << 30);
    EXPECT_LE(device["mem_free"].get<std::uint64_t>(), 1ull << 30);
  }
  EXPECT_NE(report["devices"][0]["uuid"], report["devices"][1]["uuid"]);
  ASSERT_TRUE(report.contains("nvml"));
  if (report["nvml"]["available"] == true) {
    ASSERT_EQ(report["nvml"]["device_count"], 2);
    EXPECT_EQ(report["nvml"]["devices"][0]["uuid"], report["devices"][0]["uuid"]);
    EXPECT_EQ(report["nvml"]["devices"][0]["memory_total"], 1ull << 30);
  } else {
    EXPECT_TRUE(report["nvml"].contains("note"));
  }
}

TEST_F(TenantTest, OwnContextRunsABatch) {
  auto report = run_json({"--context", "own", "batch", "--seconds", "0.3", "--kernel-ms", "1"});
  EXPECT_EQ(report["context"], "own");
  EXPECT_GT(report["kernels"].get<std::uint64_t>(), 50u);
}

TEST_F(TenantTest, NullStreamRunsRequests) {
  auto report = run_json({"--stream", "null", "--lookup", "getproc-ptds", "requests", "--seconds",
                          "0.3", "--kernel-ms", "1"});
  EXPECT_EQ(report["stream"], "null");
  EXPECT_EQ(report["count"], 15);
}

TEST_F(TenantTest, StartAtHoldsTheWorkloadUntilThatTime) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const std::int64_t start_at =
      static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec + 400'000'000;
  const auto before = std::chrono::steady_clock::now();
  auto report = run_json(
      {"--start-at", std::to_string(start_at), "batch", "--seconds", "0.1", "--kernel-ms", "1"});
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  EXPECT_GE(elapsed, 0.4 + 0.1);
  ASSERT_TRUE(report.contains("start_late_ms"));
  EXPECT_GE(report["start_late_ms"].get<double>(), 0.0);
  EXPECT_LT(report["start_late_ms"].get<double>(), 50.0);
}

TEST_F(TenantTest, PodNameIsExportedAndReported) {
  auto report = run_json({"--pod", "web-1", "batch", "--seconds", "0.05", "--kernel-ms", "1"});
  EXPECT_EQ(report["pod"], "web-1");
}

TEST_F(TenantTest, CudaErrorIsReportedWithCallAndNameAndFails) {
  Result result = run({"--json", "--device", "3", "batch", "--seconds", "0.1"});
  EXPECT_EQ(result.exit_code, 1);
  ASSERT_TRUE(result.json.is_object()) << result.out;
  EXPECT_EQ(result.json["ok"], false);
  EXPECT_EQ(result.json["error"]["call"], "cuDeviceGet");
  EXPECT_EQ(result.json["error"]["name"], "CUDA_ERROR_INVALID_DEVICE");
  EXPECT_NE(result.err.find("cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE"), std::string::npos)
      << result.err;
}

TEST_F(TenantTest, TextOutputWithoutJsonNamesEachFigure) {
  Result result = run({"batch", "--seconds", "0.05", "--kernel-ms", "1"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("useful_per_s: "), std::string::npos) << result.out;
}

struct BadOption {
  std::vector<std::string> arguments;
  std::vector<std::string> message_parts;  // the option, the value, what is allowed
};

TEST_F(TenantTest, BadOptionsAreRejectedWithOneLineNamingOptionValueAndAllowed) {
  const std::vector<BadOption> cases = {
      {{"batch", "--depth", "0"}, {"--depth", "'0'", "1 to 1024"}},
      {{"batch", "--seconds", "abc"}, {"--seconds", "'abc'", "0.001 to 86400"}},
      {{"requests", "--rate", "-5"}, {"--rate", "'-5'", "0.01 to"}},
      {{"--lookup", "magic", "batch"},
       {"--lookup", "'magic'", "direct, dlsym, getproc, getproc-ptds"}},
      {{"--context", "shared", "info"}, {"--context", "'shared'", "primary, own"}},
      {{"alloc", "--family", "texture"}, {"--family", "'texture'", "graph-node"}},
      {{"alloc", "--bytes", "12X"}, {"--bytes", "'12X'", "Gi"}},
      {{"alloc", "--count", "0"}, {"--count", "'0'", ">= 1"}},
      {{"--cuda-version", "11000", "batch"}, {"--cuda-version", "'11000'", "12000 to 99999"}},
      {{"--start-at", "soon", "batch"}, {"--start-at", "'soon'", "nanoseconds"}},
      {{"frobnicate"}, {"'frobnicate'", "batch, requests, alloc or info"}},
      {{"alloc", "--race", "--free"}, {"--race", "--free"}},
      {{"alloc", "--race", "--family", "host"}, {"--race", "host", "--count"}},
  };
  for (const auto& bad : cases) {
    std::vector<std::string> arguments = bad.arguments;
    arguments.insert(arguments.begin(), "--json");
    Result result = run(arguments);
    std::string command;
    for (const auto& argument : bad.arguments) command += argument + " ";
    EXPECT_EQ(result.exit_code, 2) << command;
    EXPECT_TRUE(result.out.empty()) << command << ": stdout " << result.out;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << command << ": " << result.err;
    for (const auto& part : bad.message_parts) {
      EXPECT_NE(result.err.find(part), std::string::npos)
          << command << ": '" << part << "' not in: " << result.err;
    }
  }
}

}  // namespace
