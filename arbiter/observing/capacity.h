// What is left on a GPU, the figure aggregate utilisation hides: memory not promised to any
// pod, the share of GPU time a newcomer would get beside the pods that want it now, and how
// many pods of a probe size (share, memory) still fit. Pure functions over figures the
// arbiter already has, so tests build any GPU they like.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/policy.h"
#include "config/fit_probe.h"

namespace quanta::arbiter {

// One pod on the GPU as capacity sees it.
struct PodLoad {
  uint32_t weight = 1;
  common::Priority priority = common::Priority::kBatch;
  double min_share = 0;  // guaranteed minimum (0 = none)
  double max_share = 1;  // ceiling (1 = none)
  // The fraction of the recent window it wanted the GPU (running, draining or waiting):
  // a pod that is idle most of the time leaves the rest to others.
  double demand = 0;
  uint64_t memory_cap = 0;   // 0 = none
  uint64_t memory_used = 0;  // its ledger on this GPU
};

struct GpuCapacity {
  uint64_t memory_total = 0;
  uint64_t memory_caps = 0;        // sum of the pods' caps
  uint64_t memory_promised = 0;    // caps, plus what uncapped pods and unmanaged processes use
  uint64_t memory_unpromised = 0;  // total minus promised, 0 when promised exceeds it
  double new_pod_share = 0;        // a weight-1 batch pod that wants the GPU all the time
  double promised_min_share = 0;   // the sum of the pods' guaranteed minimums
  std::vector<uint32_t> fits;      // per probe, in the order given
};

// `unmanaged_memory`: what NVML shows processes Quanta does not manage holding.
// `free_slots`: tenant slots left on the GPU (a pod needs at least one).
// `promised_min_share`: the minimums promised on the GPU to pods that may use it, running
// here or not (PodRegistry::promised_minimum_ppm); the larger of it and the sum of `pods`'
// minimums is what new minimums must fit beside.
GpuCapacity gpu_capacity(const std::vector<PodLoad>& pods, uint64_t memory_total,
                         uint64_t unmanaged_memory, uint32_t free_slots,
                         const std::vector<config::FitProbe>& probes,
                         double promised_min_share = 0);

// The shares the pods (and `newcomers` extra weight-1 batch pods that want the GPU all the
// time) would receive: interactive pods take what they want first, best-effort pods only
// what nobody else wants; among batch pods weights divide what is left, each between its
// guaranteed minimum and the lesser of its demand and its ceiling. The newcomers' shares
// come last in the result.
std::vector<double> expected_shares(const std::vector<PodLoad>& pods, uint32_t newcomers);

}  // namespace quanta::arbiter
