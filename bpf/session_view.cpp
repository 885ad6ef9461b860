// The filters (--gpu, --pod) and names every output of a session shares.
#include "bpf/session_view.h"

namespace quanta::bpf {

std::string SessionView::pod_of(uint32_t tgid) const {
  auto it = processes.find(tgid);
  if (it != processes.end() && !it->second.pod.empty()) return it->second.pod;
  return tgid == 0 ? std::string("(unknown)") : "pid " + std::to_string(tgid);
}

bool SessionView::pod_selected(uint32_t tgid) const {
  return pod_filter.empty() || pod_of(tgid) == pod_filter;
}

bool SessionView::gpu_selected(const GpuKey& key) const {
  if (gpu_filter.empty()) return true;
  auto it = gpus.find(key);
  return it != gpus.end() && it->second.uuid == gpu_filter;
}

bool SessionView::process_selected(const ProcessView& process) const {
  if (!pod_filter.empty() && process.pod != pod_filter) return false;
  return gpu_filter.empty() || process.gpus.count(gpu_filter) != 0;
}

std::string SessionView::gpu_label(const GpuKey& key) const {
  std::string label = "GPU " + std::to_string(key.index);
  auto it = gpus.find(key);
  if (it != gpus.end() && !it->second.uuid.empty()) label += " " + it->second.uuid;
  if (arbiters.size() > 1) {
    label += " (arbiter " + std::to_string(key.arbiter);
    if (it != gpus.end() && !it->second.scope.empty()) label += ", scope " + it->second.scope;
    label += ")";
  }
  return label;
}

std::vector<GpuKey> SessionView::reported_gpus() const {
  std::vector<GpuKey> keys;
  for (const auto& [key, gpu] : model.gpus) {
    if (!gpu_selected(key)) continue;
    bool any = false;
    for (const auto& hold : gpu.holds) any = any || pod_selected(hold.tgid);
    for (const auto& wait : gpu.waits) any = any || pod_selected(wait.tgid);
    if (any || pod_filter.empty()) keys.push_back(key);
  }
  return keys;
}

}  // namespace quanta::bpf
