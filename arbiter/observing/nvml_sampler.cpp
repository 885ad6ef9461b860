// NVML's per-process view, sampled on a thread of its own (hosted/nvml.h loads the library:
// the arbiter runs, and says so, where the driver lacks a call).
#include "arbiter/observing/nvml_sampler.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "arbiter/loop/event_loop.h"
#include "common/clock.h"
#include "common/nvml_api.h"
#include "hosted/nvml.h"

namespace quanta::arbiter {
namespace {

unsigned long long realtime_us() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<unsigned long long>(ts.tv_sec) * 1'000'000ULL +
         static_cast<unsigned long long>(ts.tv_nsec) / 1000;
}

}  // namespace

// The process's NVML (hosted/nvml.h), initialised; a missing entry point turns its figure off.
struct NvmlSampler::Api {
  const hosted::Nvml& n = hosted::nvml();
  const bool ready = n.init != nullptr && n.handle_by_uuid != nullptr && n.init() == NVML_SUCCESS;

  nvmlDevice_t device(const std::string& uuid) const {
    nvmlDevice_t dev = nullptr;
    if (!ready || n.handle_by_uuid(uuid.c_str(), &dev) != NVML_SUCCESS) return nullptr;
    return dev;
  }
};

NvmlSampler::NvmlSampler(const std::vector<std::string>& uuids, uint64_t interval_ns)
    : api_(std::make_unique<Api>()),
      uuids_(uuids),
      interval_ns_(interval_ns),
      last_seen_us_(uuids.size(), 0),
      busy_(uuids.size()) {
  for (const std::string& uuid : uuids_) {
    GpuIdentity id;
    if (nvmlDevice_t dev = api_->device(uuid)) {
      char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
      if (api_->n.name != nullptr && api_->n.name(dev, text, sizeof text) == NVML_SUCCESS)
        id.model = text;
      nvmlMemory_t mem{};
      if (api_->n.memory != nullptr && api_->n.memory(dev, &mem) == NVML_SUCCESS)
        id.memory_total = mem.total;
      unsigned is_mig = 0;
      id.mig = uuid.rfind("MIG-", 0) == 0 ||
               (api_->n.is_mig != nullptr && api_->n.is_mig(dev, &is_mig) == NVML_SUCCESS && is_mig);
      unsigned instance = 0;
      if (id.mig && api_->n.gpu_instance_id != nullptr &&
          api_->n.gpu_instance_id(dev, &instance) == NVML_SUCCESS) {
        id.mig_instance = std::to_string(instance);
      }
      const size_t at = id.model.rfind(" MIG ");
      if (id.mig && at != std::string::npos) id.mig_profile = id.model.substr(at + 5);
    } else {
      spdlog::warn("NVML does not answer for {}: its model, memory and process figures are unknown",
                   uuid);
    }
    identities_.push_back(id);
  }
  ready_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!ready_) throw_errno("eventfd");
  if (interval_ns_ != 0 && api_->ready) {
    // Signals stay with the arbiter's signalfd: the sampler's thread takes none.
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "quanta-nvml");
      run();
    });
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  }
}

void NvmlSampler::acknowledge() {
  uint64_t count = 0;
  ssize_t n = ::read(ready_.get(), &count, sizeof(count));
  (void)n;
}

NvmlSampler::~NvmlSampler() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const std::vector<GpuReading>> NvmlSampler::latest() const {
  std::lock_guard lock(mu_);
  return latest_;
}

void NvmlSampler::run() {
  for (;;) {
    auto readings = std::make_shared<const std::vector<GpuReading>>(sample());
    std::unique_lock lock(mu_);
    latest_ = std::move(readings);
    const uint64_t one = 1;
    ssize_t n = ::write(ready_.get(), &one, sizeof(one));
    (void)n;
    if (wake_.wait_for(lock, std::chrono::nanoseconds(interval_ns_), [this] { return stopping_; }))
      return;
  }
}

std::vector<GpuReading> NvmlSampler::sample() {
  std::vector<GpuReading> out(uuids_.size());
  for (size_t g = 0; g < uuids_.size(); ++g) {
    GpuReading& r = out[g];
    r.at_ns = common::monotonic_ns();
    nvmlDevice_t dev = api_->device(uuids_[g]);
    if (dev == nullptr) {
      r.error = "NVML has no device " + uuids_[g];
      continue;
    }
    // Compute processes: the v3 layout (v2 on older drivers), grown until it fits.
    std::vector<nvmlProcessInfo_t> infos(16);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned n = static_cast<unsigned>(infos.size());
      nvmlReturn_t rc = NVML_ERROR_FUNCTION_NOT_FOUND;
      if (api_->n.processes_v3 != nullptr) {
        rc = api_->n.processes_v3(dev, &n, infos.data());
      } else if (api_->n.processes_v2 != nullptr) {
        rc = api_->n.processes_v2(dev, &n, reinterpret_cast<nvmlProcessInfo_v2_t*>(infos.data()));
      }
      if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
        infos.resize(n + 16);
        continue;
      }
      if (rc != NVML_SUCCESS) {
        r.error = "listing its compute processes failed with NVML code " + std::to_string(rc);
      } else {
        r.ok = true;
        for (unsigned k = 0; k < n; ++k) {
          const unsigned long long used = infos[k].usedGpuMemory;
          r.processes.push_back(NvmlProcess{static_cast<pid_t>(infos[k].pid),
                                            used == NVML_VALUE_NOT_AVAILABLE ? 0 : used});
        }
      }
      break;
    }
    // Per-process busy: each query covers the time since the previous one. A pid's figure
    // is the mean of its samples (a driver may return several) over that period.
    if (api_->n.process_utilization == nullptr) continue;
    const unsigned long long now_us = realtime_us();
    std::vector<nvmlProcessUtilizationSample_t> samples(64);
    unsigned n = static_cast<unsigned>(samples.size());
    nvmlReturn_t rc = api_->n.process_utilization(dev, samples.data(), &n, last_seen_us_[g]);
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
      samples.resize(n + 16);
      n = static_cast<unsigned>(samples.size());
      rc = api_->n.process_utilization(dev, samples.data(), &n, last_seen_us_[g]);
    }
    if (rc != NVML_SUCCESS && rc != NVML_ERROR_NOT_FOUND) continue;
    r.process_busy_supported = true;
    const unsigned long long previous = last_seen_us_[g];
    last_seen_us_[g] = now_us;
    std::map<pid_t, std::pair<uint64_t, uint32_t>> percent;  // pid -> (sum, count)
    if (rc == NVML_SUCCESS) {
      for (unsigned k = 0; k < n; ++k) {
        auto& p = percent[static_cast<pid_t>(samples[k].pid)];
        p.first += std::min(samples[k].smUtil, 100u);
        ++p.second;
      }
    }
    if (previous != 0 && now_us > previous) {
      const uint64_t period_ns = (now_us - previous) * 1000;
      for (const auto& [pid, p] : percent) {
        busy_[g][pid] += static_cast<uint64_t>(static_cast<double>(period_ns) *
                                               static_cast<double>(p.first) / p.second / 100.0);
      }
    }
    // Forget pids that left: neither listed nor sampled now.
    for (auto it = busy_[g].begin(); it != busy_[g].end();) {
      const pid_t pid = it->first;
      const bool listed = percent.count(pid) != 0 ||
                          std::any_of(r.processes.begin(), r.processes.end(),
                                      [pid](const NvmlProcess& p) { return p.pid == pid; });
      it = listed ? std::next(it) : busy_[g].erase(it);
    }
    for (const auto& [pid, p] : percent) busy_[g].try_emplace(pid, 0);
    r.busy_ns = busy_[g];
  }
  return out;
}

}  // namespace quanta::arbiter
