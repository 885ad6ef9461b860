// Fit probes as the config writes them: a share ("0.25", "25%") and memory (Kubernetes
// sizes, "0", or a percentage of the GPU's memory).
#include "config/fit_probe.h"

#include <cmath>

#include "common/policy.h"
#include "hosted/names.h"

namespace quanta::config {

uint64_t FitProbe::memory_on(uint64_t gpu_memory) const {
  if (memory_fraction > 0) {
    return static_cast<uint64_t>(std::floor(static_cast<double>(gpu_memory) * memory_fraction));
  }
  return memory_bytes;
}

std::string parse_fit_probe(const std::string& share, const std::string& memory, FitProbe* out) {
  FitProbe p;
  common::ParseError err;
  uint32_t ppm = 0;
  if (!common::parse_share(share, &ppm, &err)) return err.text;
  p.share = ppm / static_cast<double>(common::kShareScale);
  p.share_label = share;
  p.memory_label = memory;
  if (!memory.empty() && memory.back() == '%') {
    uint32_t fraction_ppm = 0;
    if (!common::parse_share(memory, &fraction_ppm, &err)) {
      return "memory \"" + hosted::printable(memory) +
             "\": a percentage of the GPU's memory in (0%, 100%]";
    }
    p.memory_fraction = fraction_ppm / static_cast<double>(common::kShareScale);
  } else if (memory == "0") {
    p.memory_bytes = 0;
  } else if (!common::parse_bytes(memory, &p.memory_bytes, &err)) {
    return "memory \"" + hosted::printable(memory) + "\": " + err.text +
           ", or a percentage of the GPU (\"40%\")";
  }
  *out = p;
  return "";
}

}  // namespace quanta::config
