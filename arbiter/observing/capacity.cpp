// Capacity arithmetic: a weighted water-fill of the GPU's time among the pods that want it
// (minimums first, then interactive, batch and best-effort in turn, each pod between its
// minimum and the lesser of its demand and ceiling), and the memory left unpromised.
#include "arbiter/observing/capacity.h"

#include <algorithm>
#include <cmath>

namespace quanta::arbiter {
namespace {

constexpr double kEpsilon = 1e-9;

// Raises x[i] for the pods in `members` towards hi[i] by weight, x[i] = min(hi[i], base[i] +
// w[i] * lambda), spending at most `budget`. Returns what it spent.
double fill(const std::vector<size_t>& members, const std::vector<double>& weight,
            const std::vector<double>& hi, std::vector<double>& x, double budget) {
  if (members.empty() || budget <= kEpsilon) return 0;
  std::vector<double> base(x.size());
  double room = 0;
  double top = 0;
  for (size_t i : members) {
    base[i] = x[i];
    room += std::max(0.0, hi[i] - x[i]);
    top = std::max(top, (hi[i] - x[i]) / weight[i]);
  }
  if (room <= budget + kEpsilon) {
    for (size_t i : members) x[i] = std::max(x[i], hi[i]);
    return room;
  }
  auto spent_at = [&](double lambda) {
    double s = 0;
    for (size_t i : members) s += std::min(hi[i], base[i] + weight[i] * lambda) - base[i];
    return s;
  };
  double lo = 0;
  double up = top;
  for (int k = 0; k < 80; ++k) {
    const double mid = (lo + up) / 2;
    (spent_at(mid) > budget ? up : lo) = mid;
  }
  for (size_t i : members) x[i] = std::min(hi[i], base[i] + weight[i] * lo);
  return spent_at(lo);
}

}  // namespace

std::vector<double> expected_shares(const std::vector<PodLoad>& pods, uint32_t newcomers) {
  std::vector<PodLoad> all = pods;
  for (uint32_t k = 0; k < newcomers; ++k) {
    PodLoad n;
    n.demand = 1;
    all.push_back(n);
  }
  const size_t count = all.size();
  std::vector<double> weight(count), lo(count), hi(count), x(count);
  for (size_t i = 0; i < count; ++i) {
    const PodLoad& p = all[i];
    weight[i] = std::max<double>(p.weight, 1);
    hi[i] = std::clamp(std::min(p.demand, p.max_share), 0.0, 1.0);
    lo[i] = std::clamp(std::min(p.min_share, hi[i]), 0.0, 1.0);
  }
  // Guaranteed minimums first (scaled down if, against the rules, they promise more).
  double promised = 0;
  for (double v : lo) promised += v;
  const double scale = promised > 1 ? 1 / promised : 1;
  double left = 1;
  for (size_t i = 0; i < count; ++i) {
    x[i] = lo[i] * scale;
    left -= x[i];
  }
  for (common::Priority cls :
       {common::Priority::kInteractive, common::Priority::kBatch, common::Priority::kBestEffort}) {
    std::vector<size_t> members;
    for (size_t i = 0; i < count; ++i) {
      if (all[i].priority == cls) members.push_back(i);
    }
    left -= fill(members, weight, hi, x, std::max(0.0, left));
  }
  return x;
}

GpuCapacity gpu_capacity(const std::vector<PodLoad>& pods, uint64_t memory_total,
                         uint64_t unmanaged_memory, uint32_t free_slots,
                         const std::vector<config::FitProbe>& probes, double promised_min_share) {
  GpuCapacity c;
  c.memory_total = memory_total;
  c.memory_promised = unmanaged_memory;
  for (const PodLoad& p : pods) {
    c.memory_caps += p.memory_cap;
    c.memory_promised += p.memory_cap != 0 ? std::max(p.memory_cap, p.memory_used) : p.memory_used;
    c.promised_min_share += p.min_share;
  }
  c.promised_min_share = std::max(c.promised_min_share, promised_min_share);
  c.memory_unpromised = memory_total > c.memory_promised ? memory_total - c.memory_promised : 0;
  c.new_pod_share = free_slots == 0 ? 0 : expected_shares(pods, 1).back();

  for (const config::FitProbe& probe : probes) {
    const uint64_t need = probe.memory_on(memory_total);
    uint64_t by_memory = need == 0 ? UINT64_MAX : c.memory_unpromised / need;
    uint64_t limit = std::min<uint64_t>(by_memory, free_slots);
    // A share s fits at most 1/s times on an empty GPU: no need to look further.
    limit = std::min<uint64_t>(limit, static_cast<uint64_t>(1.0 / probe.share + kEpsilon));
    uint32_t fit = 0;
    for (uint32_t k = 1; k <= limit; ++k) {
      if (c.promised_min_share + k * probe.share > 1 + kEpsilon) break;
      const std::vector<double> shares = expected_shares(pods, k);
      if (shares.back() + kEpsilon < probe.share) break;
      fit = k;
    }
    c.fits.push_back(fit);
  }
  return c;
}

}  // namespace quanta::arbiter
