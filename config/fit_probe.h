// The pod sizes the node's capacity metrics count room for ([metrics] fit, in the node
// config): a share of GPU time and device memory, as bytes or as a fraction of the GPU.
#pragma once

#include <cstdint>
#include <string>

namespace quanta::config {

// The size of a pod to fit: a share of GPU time it must get (or be promised) and device
// memory, in bytes or as a fraction of the GPU's memory ("40%").
struct FitProbe {
  double share = 0;            // in (0, 1]
  uint64_t memory_bytes = 0;   // used when memory_fraction is 0
  double memory_fraction = 0;  // of the GPU's memory, in (0, 1]
  std::string share_label;     // the label values as the config wrote them: "0.25", "40%"
  std::string memory_label;

  uint64_t memory_on(uint64_t gpu_memory) const;
};

// "SHARE" and "MEMORY" as the config gives them: a share as 0.25 or 25%; memory as bytes
// with a Kubernetes suffix (10Gi) or a percentage of the GPU's memory (40%). Returns "" or
// an error line naming the value and what is allowed.
std::string parse_fit_probe(const std::string& share, const std::string& memory, FitProbe* out);

}  // namespace quanta::config
