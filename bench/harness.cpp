// Paths, environments, the arbiter's temporary config and the synchronised start of a
// scenario's tenants.
#include "bench/harness.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/policy.h"
#include "hosted/admin_client.h"

namespace quanta::bench {

namespace fs = std::filesystem;

Paths Paths::around(const std::string& bench_executable) {
  std::error_code error;
  fs::path self = fs::canonical(bench_executable, error);
  if (error) self = fs::absolute(bench_executable);
  fs::path bin = self.parent_path();
  fs::path root = bin.parent_path();
  Paths paths;
  paths.tenant = (bin / "quanta-tenant").string();
  paths.arbiter = (bin / "quanta-arbiter").string();
  paths.quantactl = (bin / "quantactl").string();
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

void Bench::note_not_admitted(const std::string& what) const {
  spdlog::error("not admitted: {}", what);
  std::lock_guard<std::mutex> hold(not_admitted_lock_);
  not_admitted_.push_back(what);
}

std::vector<std::string> Bench::not_admitted() const {
  std::lock_guard<std::mutex> hold(not_admitted_lock_);
  return not_admitted_;
}

void Admission::add(const Admission& other) {
  tenants += other.tenants;
  admitted += other.admitted;
  unverified += other.unverified;
  problems.insert(problems.end(), other.problems.begin(), other.problems.end());
}

nlohmann::json Admission::to_json() const {
  nlohmann::json out = {{"tenants", tenants}, {"admitted", admitted}};
  if (unverified > 0) out["unverified"] = unverified;
  if (!problems.empty()) out["problems"] = problems;
  return out;
}

nlohmann::json admin_request(const std::string& socket_path, const nlohmann::json& request) {
  const hosted::AdminReply reply =
      hosted::admin_request(socket_path, request, 3'000'000'000, hosted::kStatusAnswerBytes);
  return reply.outcome == hosted::AdminOutcome::kUnreachable ? nlohmann::json(nullptr)
                                                             : reply.response;
}

std::string shim_refusal(const std::string& stderr_text) {
  // The shim's own words where it runs a process ungated because the arbiter would not
  // place it (shim/link/session.cpp); a lapsed lease or an arbiter restart are not refusals.
  static const char* const kRefusals[] = {"the arbiter refused this process",
                                          "the restarted arbiter refused this process",
                                          "the arbiter did not attach",
                                          "the arbiter attached",
                                          "control region for",
                                          "the pod region from the arbiter was rejected",
                                          "CUDA is refused to this process"};
  std::istringstream lines(stderr_text);
  std::string line;
  while (std::getline(lines, line)) {
    for (const char* refusal : kRefusals) {
      if (line.find(refusal) != std::string::npos) return line;
    }
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

// Running: not ended, and not a zombie waiting for us to reap it.
bool alive(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

constexpr const char* kPodNamespace = "quanta-bench";

}  // namespace

void sweep_leftovers() {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/dev/shm", error)) {
    std::string name = entry.path().filename().string();
    pid_t owner = pid_after(name, "qb");
    if (owner == 0) owner = pid_after(name, "qbench-sim-");
    if (gone(owner)) fs::remove(entry.path(), error);
  }
  PodCgroups::sweep([](const std::string& name) { return gone(pid_after(name, "quanta-bench-")); });
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
  unique_ = unique;
  sim_state_ = "qbench-sim-" + unique;
  sim_log_path_ = dir_.file("simgpu.log");
  scope_ = "qb" + unique;
  tenant_socket_ = dir_.file("tenant.sock");
  admin_socket_ = dir_.file("admin.sock");
}

Run::~Run() {
  tenants_.clear();  // kills stragglers
  if (arbiter_) arbiter_->stop(std::chrono::milliseconds(2000));
  cgroups_.reset();  // every process in them is gone now
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
    // simgpu's own time slice and switch cost, never an outer environment's.
    env.unset("SIMGPU_TIMESLICE_US");
    env.unset("SIMGPU_SWITCH_US");
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
  // Every pod is registered, as quanta-hook registers a node's containers: the arbiter
  // bounds how many pods unregistered processes may claim (8 per cgroup), and a tenant it
  // refuses runs ungated, which would measure nothing. allow_unregistered = false makes a
  // process that escaped its pod's cgroup a refusal check_admission reports.
  std::string config_path = dir_.file("quanta.toml");
  std::ofstream config(config_path);
  config << "# written by quanta-bench for one run\n[node]\n"
         << "scope = " << toml_string(scope_) << "\n"
         << "tenant_socket = " << toml_string(tenant_socket_) << "\n"
         << "admin_socket = " << toml_string(admin_socket_) << "\n"
         << "state_dir = " << toml_string(dir_.file("state")) << "\n"
         << "allow_unregistered = false\n\n[scheduler]\n";
  if (!settings.quantum.empty()) config << "quantum = " << toml_string(settings.quantum) << "\n";
  if (!settings.quantum_min.empty()) config << "quantum_min = " << toml_string(settings.quantum_min) << "\n";
  if (!settings.idle_release.empty()) config << "idle_release = " << toml_string(settings.idle_release) << "\n";
  if (!settings.context_overhead.empty()) {
    config << "\n[shim]\ncontext_overhead = " << toml_string(settings.context_overhead) << "\n";
  }
  config.close();
  fs::create_directories(dir_.file("state"));

  try {
    if (!cgroups_) cgroups_ = std::make_unique<PodCgroups>("quanta-bench-" + unique_);
    arbiter_ = std::make_unique<Process>(Process::spawn({bench_.paths().arbiter, "--config", config_path, "--foreground"},
                                                        environment("", false), dir_.file("arbiter.out"),
                                                        dir_.file("arbiter.err")));
  } catch (const std::exception& error) {
    return error.what();
  }
  // Ready when it answers on the admin socket (it opens the tenant socket first): the
  // GPUs it manages are what every pod's registration gives the pod.
  std::string why;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (!arbiter_->running()) break;
    if (file_exists(tenant_socket_) && file_exists(admin_socket_)) {
      nlohmann::json status = admin_request(admin_socket_, {{"cmd", "status"}});
      if (status.is_object() && status.value("ok", false)) {
        gpu_uuids_.clear();
        for (const auto& gpu : status.value("gpus", nlohmann::json::array()))
          gpu_uuids_.push_back(gpu.value("uuid", ""));
        // The settings' pods, and after a restart those registered before (the state file
        // keeps registrations; registering again changes nothing).
        for (const auto& pod : settings.pods) registered_[pod.name] = pod;
        std::vector<PodPolicy> pods;
        for (const auto& [name, pod] : registered_) pods.push_back(pod);
        for (const auto& pod : pods) {
          why = register_pod(pod);
          if (!why.empty()) break;
        }
        if (why.empty()) return "";
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (why.empty()) {
    why = arbiter_->running() ? "quanta-arbiter did not answer on its admin socket within 10 s"
                              : "quanta-arbiter exited at start (" +
                                    arbiter_->wait(std::chrono::milliseconds(100)).describe() + ")";
  }
  std::string tail = arbiter_tail();
  arbiter_->stop(std::chrono::milliseconds(500));
  arbiter_.reset();
  return why + (tail.empty() ? "" : ": " + tail);
}

std::string Run::pod_key(const std::string& pod) {
  return std::string(kPodNamespace) + "/" + pod;
}

std::string Run::register_pod(const PodPolicy& pod) {
  if (!arbiter_ || !cgroups_) return "pod " + pod.name + " cannot be registered: no arbiter runs";
  nlohmann::json policy = nlohmann::json::object();
  if (pod.weight) policy["weight"] = *pod.weight;
  if (!pod.priority.empty()) policy["priority"] = pod.priority;
  if (!pod.max_share.empty()) policy["max_share"] = pod.max_share;
  if (!pod.memory_limit.empty()) policy["memory_limit"] = pod.memory_limit;
  if (!pod.quantum.empty()) policy["quantum"] = pod.quantum;
  nlohmann::json request;
  try {
    request = {{"cmd", "register"},
               {"container_id", scope_ + "." + pod.name},
               {"pod_uid", scope_ + "-" + pod.name},
               {"pod_name", pod.name},
               {"pod_namespace", kPodNamespace},
               {"container_name", "tenant"},
               {"cgroup_path", cgroups_->of(pod.name).path},
               {"devices", gpu_uuids_},
               {"policy", policy}};
  } catch (const std::exception& error) {
    return error.what();
  }
  nlohmann::json reply = admin_request(admin_socket_, request);
  if (!reply.is_object())
    return "registering pod " + pod.name + ": the arbiter did not answer on " + admin_socket_;
  if (!reply.value("ok", false))
    return "registering pod " + pod.name + ": " + reply.value("error", reply.dump());
  registered_[pod.name] = pod;
  return "";
}

Admission Run::check_admission(std::chrono::milliseconds patience, bool check_policy) {
  Admission out;
  auto until = std::chrono::steady_clock::now() + patience;
  auto settle = [&](Watched& w, const std::string& problem, bool admitted) {
    w.checked = true;
    if (admitted) ++out.admitted;
    if (!problem.empty())
      out.problems.push_back("pid " + std::to_string(w.pid) + " (pod " + w.pod + "): " + problem);
  };
  for (const Watched& w : watched_) out.tenants += w.checked ? 0 : 1;
  while (true) {
    nlohmann::json status =
        arbiter_ ? admin_request(admin_socket_, {{"cmd", "status"}}) : nlohmann::json(nullptr);
    std::map<pid_t, nlohmann::json> listed;
    if (status.is_object()) {
      for (const auto& gpu : status.value("gpus", nlohmann::json::array())) {
        for (const auto& tenant : gpu.value("tenants", nlohmann::json::array()))
          listed.emplace(tenant.value("pid", 0), tenant);
      }
    }
    int pending = 0;
    for (Watched& w : watched_) {
      if (w.checked) continue;
      auto found = listed.find(w.pid);
      if (found != listed.end()) {
        const nlohmann::json& t = found->second;
        std::string wrong;
        if (t.value("pod", "") != pod_key(w.pod))
          wrong = "the arbiter placed it in pod " + t.value("pod", "?") + ", not " + pod_key(w.pod);
        auto policy = registered_.find(w.pod);
        if (wrong.empty() && check_policy && policy != registered_.end()) {
          const PodPolicy& p = policy->second;
          uint64_t cap = 0;
          common::ParseError ignored;
          if (p.weight && t.value("weight", 0) != *p.weight) {
            wrong = "weight " + std::to_string(t.value("weight", 0)) + " on the arbiter, not " +
                    std::to_string(*p.weight);
          } else if (!p.priority.empty() && t.value("priority", "") != p.priority) {
            wrong = "priority " + t.value("priority", "?") + " on the arbiter, not " + p.priority;
          } else if (!p.max_share.empty() &&
                     std::fabs(t.value("max_share", 0.0) - std::stod(p.max_share)) > 1e-3) {
            wrong = "max_share " + t["max_share"].dump() + " on the arbiter, not " + p.max_share;
          } else if (!p.memory_limit.empty() &&
                     common::parse_bytes(p.memory_limit, &cap, &ignored) &&
                     t.value("memory_cap", 0ull) != cap) {
            wrong =
                "memory cap " + t["memory_cap"].dump() + " on the arbiter, not " + p.memory_limit;
          }
        }
        settle(w, wrong, wrong.empty());
      } else if (!alive(w.pid)) {
        std::string refusal = shim_refusal(read_file(w.stderr_path));
        if (refusal.empty()) ++out.unverified;
        settle(w, refusal.empty() ? "" : "not admitted: " + refusal, false);
        w.noted = !refusal.empty();
      } else {
        ++pending;
      }
    }
    if (pending == 0 || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double waited = std::chrono::duration<double>(patience).count();
  for (Watched& w : watched_) {
    if (w.checked) continue;
    std::string refusal = shim_refusal(read_file(w.stderr_path));
    char text[64];
    std::snprintf(text, sizeof text, "%.1f s", waited);
    settle(w,
           "it runs, but the arbiter did not list it among its tenants within " +
               std::string(text) + ": not admitted, so it runs ungated" +
               (refusal.empty() ? "" : " (" + refusal + ")"),
           false);
    w.noted = true;
  }
  for (const std::string& problem : out.problems) bench_.note_not_admitted(name_ + ": " + problem);
  return out;
}

void Run::note_refusals() {
  for (Watched& w : watched_) {
    if (w.noted) continue;
    std::string refusal = shim_refusal(read_file(w.stderr_path));
    if (refusal.empty()) continue;
    w.noted = true;
    bench_.note_not_admitted(name_ + ": pid " + std::to_string(w.pid) + " (pod " + w.pod +
                             "): " + refusal);
  }
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
  return spawn_placed(argv, pod, environment(pod, preload_shim), base + ".out", base + ".err",
                      preload_shim);
}

Process Run::spawn_tenant(const std::vector<std::string>& argv, const std::string& pod,
                          const Environment& env, const std::string& stdout_path,
                          const std::string& stderr_path) {
  return spawn_placed(argv, pod, env, stdout_path, stderr_path, true);
}

Process Run::spawn_placed(const std::vector<std::string>& argv, const std::string& pod,
                          const Environment& env, const std::string& stdout_path,
                          const std::string& stderr_path, bool shim) {
  const bool placed = quanta_ && shim;
  const std::string name = pod.empty() ? "default" : pod;
  std::string procs;
  if (placed) {
    if (registered_.count(name) == 0) {
      PodPolicy defaults;
      defaults.name = name;
      std::string why = register_pod(defaults);
      if (!why.empty()) throw std::runtime_error("cannot start " + argv.at(0) + ": " + why);
    }
    procs = cgroups_->of(name).procs;
  }
  Process process = Process::spawn(argv, env, stdout_path, stderr_path, procs);
  if (placed) {
    Watched watched;
    watched.pid = process.pid();
    watched.pod = name;
    watched.stderr_path = stderr_path;
    watched_.push_back(std::move(watched));
  }
  return process;
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
  if (quanta_) note_refusals();
  return results;
}

SimLog Run::sim_log() const { return read_sim_log(sim_log_path_); }

}  // namespace quanta::bench
