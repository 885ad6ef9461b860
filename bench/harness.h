// What every scenario shares: where the programs are, which GPU the run uses, how long
// it lasts, and one configuration's run (its fresh simulated GPU, optional arbiter with a
// temporary config, and tenants started together at one instant).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/pod_cgroups.h"
#include "bench/process.h"
#include "bench/simlog.h"

namespace quanta::bench {

enum class GpuMode { sim, real };

struct Paths {
  std::string tenant;       // quanta-tenant
  std::string arbiter;      // quanta-arbiter
  std::string quantactl;
  std::string launch_loop;  // quanta-bench-launch-loop
  std::string shim;         // libquanta.so
  std::string sim_dir;      // simgpu's libcuda.so.1 and libnvidia-ml.so.1

  static Paths around(const std::string& bench_executable);
};

struct BenchOptions {
  GpuMode gpu = GpuMode::sim;
  bool quick = false;
  std::optional<double> seconds;  // overrides each scenario's measured duration
  std::optional<double> minutes;  // soak: how long the whole run lasts
};

class Bench {
 public:
  Bench(Paths paths, BenchOptions options) : paths_(std::move(paths)), options_(options) {}
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;
  const Paths& paths() const { return paths_; }
  GpuMode gpu() const { return options_.gpu; }
  bool sim() const { return options_.gpu == GpuMode::sim; }
  bool quick() const { return options_.quick; }
  std::optional<double> minutes() const { return options_.minutes; }
  // The measured duration: --seconds if given, else `quick` under --quick, else `full`.
  double seconds(double full, double quick) const;
  // Missing pieces as one line ("quanta-arbiter not built (…/bin/quanta-arbiter)"), or "".
  std::string missing_for_tenants() const;
  std::string missing_for_quanta() const;

  // Tenants meant to run under Quanta that the arbiter did not admit, gate or give their
  // pod's policy, one line each: any makes quanta-bench fail, whatever the scenario.
  void note_not_admitted(const std::string& what) const;
  std::vector<std::string> not_admitted() const;

 private:
  Paths paths_;
  BenchOptions options_;
  mutable std::mutex not_admitted_lock_;
  mutable std::vector<std::string> not_admitted_;
};

// simgpu settings for one run (ignored on a real GPU).
struct SimSettings {
  int devices = 1;
  std::string memory;  // SIMGPU_MEMORY; "" = simgpu's default
};

struct PodPolicy {
  std::string name;
  std::optional<int> weight;
  std::string priority;      // "" = default
  std::string max_share;     // "" = default
  std::string memory_limit;  // "" = default
  std::string quantum;       // "" = default
};

struct ArbiterSettings {
  std::string quantum;           // [scheduler] quantum; "" = default
  std::string quantum_min;       // "" = default
  std::string idle_release;      // "" = default
  std::string context_overhead;  // [shim] context_overhead; "" = default (300Mi)
  std::vector<PodPolicy> pods;   // registered with these policies at the arbiter's start
};

// What the arbiter said about a run's tenants: each started with the shim must be listed
// among its tenants, in its own pod, with that pod's policy.
struct Admission {
  int tenants = 0;     // processes checked
  int admitted = 0;    // listed in their pod (with its policy, where that was checked)
  int unverified = 0;  // ended before the arbiter listed them, the shim saying no refusal
  std::vector<std::string> problems;
  void add(const Admission& other);
  nlohmann::json to_json() const;
};

struct TenantSpec {
  std::vector<std::string> args;  // after the program name, e.g. {"batch", "--kernel-ms", "2"}
  std::string pod;                // QUANTA_POD (quanta runs); also a label
  int device = 0;
};

struct TenantResult {
  TenantSpec spec;
  pid_t pid = 0;
  std::optional<nlohmann::json> report;  // its --json object
  std::string error;                      // why there is no usable report
};

// One configuration of one scenario: a fresh simulated GPU (own SIMGPU_STATE and
// execution log), an arbiter when `quanta`, tenants started together.
class Run {
 public:
  Run(const Bench& bench, const std::string& name, bool quanta, SimSettings sim = {});
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Starts quanta-arbiter on a temporary config and registers the settings' pods (and any
  // registered before, after a restart); returns "" or why it could not.
  std::string start_arbiter(const ArbiterSettings& settings);
  // Every pod of a quanta run is registered as a node's container would be (quanta-hook's
  // `register`): a cgroup of its own, the arbiter's GPUs, its policy. Its key:
  static std::string pod_key(const std::string& pod);  // "quanta-bench/<pod>"
  // Registers one pod with the running arbiter; "" or why not. spawn registers a pod it
  // does not know with the default policy.
  std::string register_pod(const PodPolicy& pod);
  // Asks the arbiter (every 100 ms, for at most `patience`) until each process spawned with
  // the shim since the last check is listed in its pod or has ended; with `check_policy`,
  // also that the pod has the weight, priority, ceiling and cap it was registered with.
  // Problems are noted with the Bench (quanta-bench then fails) and returned.
  Admission check_admission(std::chrono::milliseconds patience, bool check_policy = true);
  // Notes every shim-preloaded process of this run whose stderr says the arbiter refused
  // it or did not attach its GPU (once per process).
  void note_refusals();
  pid_t arbiter_pid() const { return arbiter_ ? arbiter_->pid() : 0; }
  std::optional<double> arbiter_cpu_seconds() const;
  const std::string& scope() const { return scope_; }
  const std::string& admin_socket() const { return admin_socket_; }

  // The environment children of this run get: the simulated GPU, and for quanta runs
  // the shim preloaded with the run's socket and the pod's name.
  Environment environment(const std::string& pod, bool preload_shim) const;

  // Spawns every tenant with --json and one --start-at far enough ahead for all to be
  // ready; returns the start instant on CLOCK_MONOTONIC.
  uint64_t start_tenants(const std::vector<TenantSpec>& tenants);
  // Pids of the tenants started and not yet waited for, in start order.
  std::vector<pid_t> tenant_pids() const;
  // Waits for all (deadline: their duration plus slack) and parses their reports.
  std::vector<TenantResult> wait_tenants(double slack_seconds);

  // Spawns any program with this run's environment (no --start-at handling); with the
  // shim under Quanta, in its pod's cgroup.
  Process spawn(const std::vector<std::string>& argv, const std::string& pod, bool preload_shim,
                const std::string& label);
  // The same with a given environment (which preloads the shim) and output files.
  Process spawn_tenant(const std::vector<std::string>& argv, const std::string& pod,
                       const Environment& env, const std::string& stdout_path,
                       const std::string& stderr_path);

  SimLog sim_log() const;
  const std::string& dir() const { return dir_.path(); }
  const std::string& name() const { return name_; }
  const Bench& bench() const { return bench_; }
  bool quanta() const { return quanta_; }
  // The last lines of the arbiter's stderr, for notes when something went wrong.
  std::string arbiter_tail() const;

 private:
  struct Watched {
    pid_t pid = 0;
    std::string pod;
    std::string stderr_path;
    bool checked = false;  // by check_admission
    bool noted = false;    // a refusal already noted
  };
  Process spawn_placed(const std::vector<std::string>& argv, const std::string& pod,
                       const Environment& env, const std::string& stdout_path,
                       const std::string& stderr_path, bool shim);

  const Bench& bench_;
  std::string name_;
  bool quanta_;
  SimSettings sim_;
  TempDir dir_;
  std::string sim_state_;
  std::string sim_log_path_;
  std::string scope_;
  std::string tenant_socket_;
  std::string admin_socket_;
  std::string unique_;
  std::unique_ptr<Process> arbiter_;
  std::unique_ptr<PodCgroups> cgroups_;
  std::map<std::string, PodPolicy> registered_;
  std::vector<std::string> gpu_uuids_;
  std::vector<Watched> watched_;
  std::vector<std::pair<TenantSpec, Process>> tenants_;
  double longest_seconds_ = 0;
  int spawned_ = 0;
};

// Removes what runs of quanta-bench that were killed left behind: shared-memory regions
// and temporary directories whose names carry the pid of a process that is gone.
void sweep_leftovers();

// One request over an arbiter's admin socket (docs/quantactl-status.md, through the hook's
// client), answered within 3 s; null when it could not be asked or the answer is not an
// admin response.
nlohmann::json admin_request(const std::string& socket_path, const nlohmann::json& request);

// The line of a tenant's stderr where the shim says the arbiter refused it or did not
// attach a GPU (it then runs ungated), or "".
std::string shim_refusal(const std::string& stderr_text);

// CLOCK_REALTIME minus CLOCK_MONOTONIC, now, in ns.
int64_t realtime_minus_monotonic_ns();

// A tenant's duration from its --seconds argument (0 when absent).
double tenant_seconds(const TenantSpec& spec);

// Notes for the tenants that failed: "tenant 2 (pod w4): exit 1: cuInit failed: …".
std::vector<std::string> tenant_errors(const std::vector<TenantResult>& results);

}  // namespace quanta::bench
