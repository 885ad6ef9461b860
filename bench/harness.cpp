// Paths, environments, the arbiter's temporary config and the synchronised start of a
// scenario's tenants.
#include "harness.h"

#include <signal.h>
#include <cerrno>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace quanta::bench {

namespace fs = std::filesystem;

Paths Paths::around(const std::string& bench_executable) {
  std::error_code error;
  fs::path self = fs::canonical(bench_executable, error);
  if (error) self = fs::absolute(bench_executable);
  fs::path bin = self.parent_path();
  fs::path root = bin.parent_path();
  Paths paths;
  paths.bin_dir = bin.string();
  paths.tenant = (bin / "quanta-tenant").string();
  paths.arbiter = (bin / "quanta-arbiter").string();
  paths.quantactl = (bin / "quantactl").string();
  paths.trace = (bin / "quanta-trace").string();
  paths.launch_loop = (bin / "quanta-bench-launch-loop").string();
  paths.shim = (root / "lib" / "libquanta.so").string();
  paths.sim_dir = (root / "sim").string();
  return paths;
}

double Bench::seconds(double full, double quick) const {
  if (options_.seconds) return *options_.seconds;
  return options_.quick ? quick : full;
}

std::string Bench::missing_for_tenants() const {
  if (!file_exists(paths_.tenant)) return "quanta-tenant is not built (" + paths_.tenant + ")";
  if (sim() && !file_exists(paths_.sim_dir + "/libcuda.so.1")) {
    return "simgpu is not built (" + paths_.sim_dir + "/libcuda.so.1)";
  }
  return "";
}

std::string Bench::missing_for_quanta() const {
  std::string tenants = missing_for_tenants();
  if (!tenants.empty()) return tenants;
  if (!file_exists(paths_.shim)) return "libquanta.so is not built (" + paths_.shim + ")";
  if (!file_exists(paths_.arbiter)) return "quanta-arbiter is not built (" + paths_.arbiter + ")";
  return "";
}

int64_t realtime_minus_monotonic_ns() {
  timespec real{}, mono{};
  clock_gettime(CLOCK_REALTIME, &real);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  return (static_cast<int64_t>(real.tv_sec) - static_cast<int64_t>(mono.tv_sec)) * 1'000'000'000 +
         (static_cast<int64_t>(real.tv_nsec) - static_cast<int64_t>(mono.tv_nsec));
}

double tenant_seconds(const TenantSpec& spec) {
  for (size_t i = 0; i + 1 < spec.args.size(); ++i) {
    if (spec.args[i] == "--seconds") return std::stod(spec.args[i + 1]);
  }
  return 0.0;
}

std::vector<std::string> tenant_errors(const std::vector<TenantResult>& results) {
  std::vector<std::string> notes;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].error.empty()) continue;
    notes.push_back("tenant " + std::to_string(i) + (results[i].spec.pod.empty() ? "" : " (pod " + results[i].spec.pod + ")") +
                    ": " + results[i].error);
  }
  return notes;
}

namespace {

std::atomic<int> run_counter{0};

std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

void remove_shm_with_prefix(const std::string& prefix) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/dev/shm", error)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) fs::remove(entry.path(), error);
  }
}

// The pid in "<prefix><pid>-…", or 0.
pid_t pid_after(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return 0;
  size_t end = name.find('-', prefix.size());
  if (end == std::string::npos || end == prefix.size()) return 0;
  std::string digits = name.substr(prefix.size(), end - prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return 0;
  return static_cast<pid_t>(std::stol(digits));
}

bool gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

void sweep_leftovers() {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/dev/shm", error)) {
    std::string name = entry.path().filename().string();
    pid_t owner = pid_after(name, "qb");
    if (owner == 0) owner = pid_after(name, "qbench-sim-");
    if (gone(owner)) fs::remove(entry.path(), error);
  }
  const char* base = std::getenv("TMPDIR");
  for (const auto& entry : fs::directory_iterator(base != nullptr && *base != '\0' ? base : "/tmp", error)) {
    if (gone(pid_after(entry.path().filename().string(), "quanta-bench-"))) fs::remove_all(entry.path(), error);
  }
}

Run::Run(const Bench& bench, const std::string& name, bool quanta, SimSettings sim)
    : bench_(bench),
      name_(name),
      quanta_(quanta),
      sim_(std::move(sim)),
      dir_("quanta-bench-" + std::to_string(getpid()) + "-" + name) {
  int serial = run_counter.fetch_add(1);
  std::string unique = std::to_string(getpid()) + "-" + std::to_string(serial);
  sim_state_ = "qbench-sim-" + unique;
  sim_log_path_ = dir_.file("simgpu.log");
  scope_ = "qb" + unique;
  tenant_socket_ = dir_.file("tenant.sock");
  admin_socket_ = dir_.file("admin.sock");
}

Run::~Run() {
  tenants_.clear();  // kills stragglers
  if (arbiter_) arbiter_->stop(std::chrono::milliseconds(2000));
  remove_shm_with_prefix(scope_ + ".");
  remove_shm_with_prefix(sim_state_);
}

Environment Run::environment(const std::string& pod, bool preload_shim) const {
  Environment env;
  if (bench_.sim()) {
    const char* existing = std::getenv("LD_LIBRARY_PATH");
    std::string path = bench_.paths().sim_dir;
    if (existing != nullptr && *existing != '\0') path += std::string(":") + existing;
    env.set("LD_LIBRARY_PATH", path);
    env.set("SIMGPU_STATE", sim_state_);
    env.set("SIMGPU_LOG", sim_log_path_);
    env.set("SIMGPU_DEVICES", std::to_string(sim_.devices));
    if (!sim_.memory.empty()) env.set("SIMGPU_MEMORY", sim_.memory);
    else env.unset("SIMGPU_MEMORY");
    if (sim_.timeslice_us) env.set("SIMGPU_TIMESLICE_US", std::to_string(*sim_.timeslice_us));
    else env.unset("SIMGPU_TIMESLICE_US");
    if (sim_.switch_us) env.set("SIMGPU_SWITCH_US", std::to_string(*sim_.switch_us));
    else env.unset("SIMGPU_SWITCH_US");
    env.unset("SIMGPU_MIG");
    env.unset("SIMGPU_UUIDS");
  }
  if (quanta_ && preload_shim) {
    env.set("LD_PRELOAD", bench_.paths().shim);
    env.set("QUANTA_SOCKET", tenant_socket_);
    env.set("QUANTA_POD", pod.empty() ? "default" : pod);
  } else {
    env.unset("LD_PRELOAD");
    env.unset("QUANTA_SOCKET");
    env.unset("QUANTA_POD");
  }
  return env;
}

std::string Run::start_arbiter(const ArbiterSettings& settings) {
  std::string config_path = dir_.file("quanta.toml");
  std::ofstream config(config_path);
  config << "# written by quanta-bench for one run\n[node]\n"
         << "scope = " << toml_string(scope_) << "\n"
         << "tenant_socket = " << toml_string(tenant_socket_) << "\n"
         << "admin_socket = " << toml_string(admin_socket_) << "\n"
         << "state_dir = " << toml_string(dir_.file("state")) << "\n"
         << "allow_unregistered = true\n\n[scheduler]\n";
  if (!settings.quantum.empty()) config << "quantum = " << toml_string(settings.quantum) << "\n";
  if (!settings.quantum_min.empty()) config << "quantum_min = " << toml_string(settings.quantum_min) << "\n";
  if (!settings.idle_release.empty()) config << "idle_release = " << toml_string(settings.idle_release) << "\n";
  for (const auto& pod : settings.pods) {
    config << "\n[pod." << toml_string(pod.name) << "]\n";
    if (pod.weight) config << "weight = " << *pod.weight << "\n";
    if (!pod.priority.empty()) config << "priority = " << toml_string(pod.priority) << "\n";
    if (!pod.max_share.empty()) config << "max_share = " << toml_string(pod.max_share) << "\n";
    if (!pod.memory_limit.empty()) config << "memory_limit = " << toml_string(pod.memory_limit) << "\n";
    if (!pod.quantum.empty()) config << "quantum = " << toml_string(pod.quantum) << "\n";
  }
  config.close();
  fs::create_directories(dir_.file("state"));

  try {
    arbiter_ = std::make_unique<Process>(Process::spawn({bench_.paths().arbiter, "--config", config_path, "--foreground"},
                                                        environment("", false), dir_.file("arbiter.out"),
                                                        dir_.file("arbiter.err")));
  } catch (const std::exception& error) {
    return error.what();
  }
  // Ready when the tenant socket exists; a tenant connecting earlier would run ungated.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (!arbiter_->running()) break;
    if (file_exists(tenant_socket_)) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string why = arbiter_->running() ? "quanta-arbiter did not create its tenant socket within 10 s"
                                        : "quanta-arbiter exited at start (" + arbiter_->wait(std::chrono::milliseconds(100)).describe() + ")";
  std::string tail = arbiter_tail();
  arbiter_->stop(std::chrono::milliseconds(500));
  arbiter_.reset();
  return why + (tail.empty() ? "" : ": " + tail);
}

std::optional<double> Run::arbiter_cpu_seconds() const {
  if (!arbiter_ || !arbiter_->running()) return std::nullopt;
  return process_cpu_seconds(arbiter_->pid());
}

std::string Run::arbiter_tail() const { return last_line(read_file(dir_.file("arbiter.err"))); }

Process Run::spawn(const std::vector<std::string>& argv, const std::string& pod, bool preload_shim,
                   const std::string& label) {
  int index = spawned_++;
  std::string base = dir_.file(label + "-" + std::to_string(index));
  return Process::spawn(argv, environment(pod, preload_shim), base + ".out", base + ".err");
}

uint64_t Run::start_tenants(const std::vector<TenantSpec>& tenants) {
  // Every tenant starts at one instant; the lead time covers exec, driver init and (with
  // the shim) the socket handshake of all of them on two busy cores.
  double lead_s = 0.6 + 0.05 * static_cast<double>(tenants.size());
  int64_t offset = realtime_minus_monotonic_ns();
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  uint64_t start_mono = static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec) +
                        static_cast<uint64_t>(lead_s * 1e9);
  int64_t start_real = static_cast<int64_t>(start_mono) + offset;
  for (const auto& spec : tenants) {
    std::vector<std::string> argv{bench_.paths().tenant};
    argv.insert(argv.end(), spec.args.begin(), spec.args.end());
    argv.insert(argv.end(), {"--json", "--device", std::to_string(spec.device), "--start-at", std::to_string(start_real)});
    tenants_.emplace_back(spec, spawn(argv, spec.pod, true, "tenant"));
    longest_seconds_ = std::max(longest_seconds_, tenant_seconds(spec) + lead_s);
  }
  return start_mono;
}

std::vector<pid_t> Run::tenant_pids() const {
  std::vector<pid_t> pids;
  for (const auto& [spec, process] : tenants_) pids.push_back(process.pid());
  return pids;
}

std::vector<TenantResult> Run::wait_tenants(double slack_seconds) {
  std::vector<TenantResult> results;
  auto deadline = std::chrono::milliseconds(static_cast<int64_t>((longest_seconds_ + slack_seconds) * 1000));
  auto until = std::chrono::steady_clock::now() + deadline;
  for (auto& [spec, process] : tenants_) {
    TenantResult result;
    result.spec = spec;
    result.pid = process.pid();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    ExitStatus status = process.wait(std::max(left, std::chrono::milliseconds(1)));
    std::string out = read_file(process.stdout_path());
    try {
      auto report = nlohmann::json::parse(last_line(out));
      if (report.is_object()) result.report = report;
    } catch (const nlohmann::json::exception&) {
    }
    if (!status.exited || status.code != 0 || !result.report) {
      std::string why = status.describe();
      if (result.report && result.report->contains("error")) why += ": " + (*result.report)["error"].dump();
      std::string err = last_line(read_file(process.stderr_path()));
      if (!err.empty()) why += ": " + err;
      result.error = why;
      if (result.report && !(*result.report).value("ok", false)) result.report.reset();
    }
    results.push_back(std::move(result));
  }
  tenants_.clear();
  longest_seconds_ = 0;
  return results;
}

SimLog Run::sim_log() const { return read_sim_log(sim_log_path_); }

}  // namespace quanta::bench
