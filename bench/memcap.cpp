// `memcap`: 8 processes of one pod racing allocations at the pod's cap. Phase one races
// to the cap (each allocates until its first denial and holds); phase two churns
// (allocate, free, repeat) with more demand than the cap allows. The committed bytes are
// sampled from the pod's ledger (the arbiter's sealed memfd, mapped read-only) while they
// run and cross-checked with the tenants' own reports; the native run, with no cap, shows
// what the pod would take.
#include "bench/scenarios.h"
#include "bench/stats.h"
#include "common/shm_layout.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

namespace quanta::bench {

namespace {

constexpr int kProcesses = 8;
// The cap covers the pod's contexts too: the shim charges each context a fixed overhead
// (QUANTA_CONTEXT_OVERHEAD, 300Mi by default), so 8 processes hold 2400Mi before their
// first allocation and 1696Mi remain for them to race for.
constexpr uint64_t kCap = 4ull << 30;  // 4Gi
constexpr const char* kCapText = "4Gi";
constexpr uint64_t kRaceBytes = 96ull << 20;    // 17 fit in what remains, the 18th is denied
constexpr uint64_t kChurnBytes = 256ull << 20;  // 6 fit at once; 8 processes want one each

// Samples the pod ledger (PodRegion::memory_used) of a run's arbiter until stopped. The
// ledger is a memfd with no name in any filesystem; the arbiter holds it open, and
// /proc/<arbiter pid>/fd/<n> opens the same memory again (read-only here), so sampling is
// a load from shared memory that neither the arbiter nor the tenants see.
class LedgerSampler {
 public:
  LedgerSampler(pid_t arbiter, std::string scope, std::string pod_key)
      : arbiter_(arbiter), scope_(std::move(scope)), pod_key_(std::move(pod_key)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~LedgerSampler() { stop(); }
  void stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t max_bytes() const { return max_bytes_; }
  uint64_t samples() const { return samples_; }
  bool found() const { return region_ != nullptr; }

 private:
  void find_region() {
    std::error_code error;
    const std::string fds = "/proc/" + std::to_string(arbiter_) + "/fd";
    // How the kernel names a memfd's link: "/memfd:<name> (deleted)".
    const std::string wanted = "/memfd:" + scope_ + ".pod.";
    for (const auto& entry : std::filesystem::directory_iterator(fds, error)) {
      const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
      if (error || target.rfind(wanted, 0) != 0) continue;
      int fd = open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      struct stat info {};
      if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) < sizeof(common::PodRegion)) {
        close(fd);
        continue;
      }
      void* map = mmap(nullptr, sizeof(common::PodRegion), PROT_READ, MAP_SHARED, fd, 0);
      close(fd);
      if (map == MAP_FAILED) continue;
      auto* region = static_cast<const common::PodRegion*>(map);
      std::string key(region->header.pod_key, strnlen(region->header.pod_key, common::kPodKeyLen));
      if (region->header.magic == common::kPodMagic && key == pod_key_) {
        region_ = region;
        return;
      }
      munmap(map, sizeof(common::PodRegion));
    }
  }

  void loop() {
    while (running_) {
      if (region_ == nullptr) {
        find_region();
      } else {
        uint64_t used = 0;
        for (uint32_t gpu = 0; gpu < common::kMaxGpus; ++gpu) {
          used = std::max(used, region_->memory_used[gpu].load(std::memory_order_relaxed));
        }
        max_bytes_ = std::max(max_bytes_.load(), used);
        ++samples_;
      }
      // A sample every 50 µs: racing allocations take microseconds each, and the
      // sampler must not take a core from the 8 racers.
      std::this_thread::sleep_for(std::chrono::microseconds(region_ == nullptr ? 1000 : 50));
    }
    if (region_ != nullptr) munmap(const_cast<common::PodRegion*>(region_), sizeof(common::PodRegion));
  }

  pid_t arbiter_;
  std::string scope_;
  std::string pod_key_;
  const common::PodRegion* region_ = nullptr;
  std::atomic<bool> running_{true};
  std::atomic<uint64_t> max_bytes_{0};
  std::atomic<uint64_t> samples_{0};
  std::thread thread_;
};

uint64_t sum_field(const std::vector<TenantResult>& results, const char* key) {
  uint64_t sum = 0;
  for (const auto& result : results) {
    if (result.report && (*result.report).contains(key) && (*result.report)[key].is_number()) {
      sum += (*result.report)[key].get<uint64_t>();
    }
  }
  return sum;
}

Json run_config(const Bench& bench, bool quanta, int churn_count) {
  Json out = {{"cap", quanta ? Json(kCap) : Json(nullptr)}, {"max_committed", nullptr}, {"overshoot_bytes", nullptr},
              {"denials", nullptr}, {"allocs_per_s", nullptr}};
  std::string missing = quanta ? bench.missing_for_quanta() : bench.missing_for_tenants();
  if (!missing.empty()) {
    add_note(out, missing);
    return out;
  }
  SimSettings sim;
  sim.memory = "16Gi";
  Run run(bench, quanta ? "memcap-quanta" : "memcap-native", quanta, sim);
  if (quanta) {
    ArbiterSettings arbiter;
    arbiter.pods.push_back(PodPolicy{"capped", 1, "", "", kCapText, ""});
    std::string why = run.start_arbiter(arbiter);
    if (!why.empty()) {
      add_note(out, why);
      return out;
    }
  }
  std::unique_ptr<LedgerSampler> sampler;
  if (quanta)
    sampler =
        std::make_unique<LedgerSampler>(run.arbiter_pid(), run.scope(), Run::pod_key("capped"));

  std::vector<TenantSpec> race, churn;
  for (int i = 0; i < kProcesses; ++i) {
    race.push_back(TenantSpec{{"alloc", "--race", "--bytes", std::to_string(kRaceBytes), "--hold-ms", "300"}, "capped", 0});
    churn.push_back(TenantSpec{{"alloc", "--free", "--hold-ms", "1", "--count", std::to_string(churn_count), "--bytes",
                                std::to_string(kChurnBytes)},
                               "capped", 0});
  }
  // Each phase's processes must all be tenants of the capped pod when they start racing.
  Admission admission;
  uint64_t race_start = run.start_tenants(race);
  if (quanta) {
    sleep_until_monotonic(race_start);
    admission.add(run.check_admission(std::chrono::seconds(10)));
  }
  auto race_results = run.wait_tenants(30.0);
  uint64_t churn_start = run.start_tenants(churn);
  if (quanta) {
    sleep_until_monotonic(churn_start);
    admission.add(run.check_admission(std::chrono::seconds(10)));
    out["admission"] = admission.to_json();
  }
  auto churn_results = run.wait_tenants(60.0);
  if (sampler) sampler->stop();
  for (const auto& note : tenant_errors(race_results)) add_note(out, "race " + note);
  for (const auto& note : tenant_errors(churn_results)) add_note(out, "churn " + note);

  // Every racer holds what it got until after its first denial, so the sum of the
  // successes is what the pod's allocations held at once at the end of the race. The
  // ledger adds the contexts' overhead, so it is the figure when it was sampled.
  uint64_t race_committed = sum_field(race_results, "successes") * kRaceBytes;
  uint64_t ledger_max = sampler ? sampler->max_bytes() : 0;
  uint64_t max_committed = std::max(race_committed, ledger_max);
  out["max_committed"] = max_committed;
  out["race_committed"] = race_committed;
  if (sampler) {
    out["ledger_max"] = sampler->found() ? Json(ledger_max) : Json(nullptr);
    out["ledger_samples"] = sampler->samples();
    if (!sampler->found())
      add_note(out,
               "the pod's ledger region was not found among the arbiter's descriptors; "
               "max_committed from the tenants' reports only");
  }
  out["overshoot_bytes"] = max_committed > kCap ? max_committed - kCap : 0;
  out["denials"] = sum_field(race_results, "oom") + sum_field(churn_results, "oom");
  out["other_errors"] = sum_field(race_results, "error_count") + sum_field(churn_results, "error_count");
  double rate = 0;
  bool any = false;
  for (const auto& result : churn_results) {
    if (!result.report) continue;
    if (auto value = number_field(*result.report, {"allocs_per_s"})) {
      rate += *value;
      any = true;
    }
  }
  out["allocs_per_s"] = figure(any ? std::optional<double>(rate) : std::nullopt, 1);
  if (!quanta) add_note(out, "no cap without Quanta: max_committed and overshoot show what the pod takes unchecked");
  return out;
}

}  // namespace

Json run_memcap(const Bench& bench) {
  // A quick run's churners still live about half a second (each allocation is held 1 ms),
  // several of the admission check's 100 ms polls: one that ran its whole life between two
  // polls on a loaded machine could not be seen as a tenant and counted as unverified.
  int churn_count = bench.quick() ? 400 : 1000;
  Json out = {{"scenario", "memcap"},
              {"workload", {{"processes", kProcesses}, {"cap", kCapText}, {"race_bytes", kRaceBytes},
                            {"churn_bytes", kChurnBytes}, {"cap_includes", "8 contexts x QUANTA_CONTEXT_OVERHEAD (300Mi default)"}, {"churn_allocs_per_process", churn_count}}}};
  out["native"] = guarded("native", [&] { return run_config(bench, false, churn_count); });
  out["quanta"] = guarded("quanta", [&] { return run_config(bench, true, churn_count); });
  std::optional<double> overshoot;
  if (out["quanta"]["overshoot_bytes"].is_number()) overshoot = out["quanta"]["overshoot_bytes"].get<double>();
  out["targets"] = {{"overshoot_bytes", target("quanta overshoot_bytes == 0 (never past the cap)", overshoot, 0.0, true, 0)}};
  return out;
}

}  // namespace quanta::bench
