// pair_handoffs (handoff_model.h).
#include "bpf/handoff_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace quanta::bpf {

std::vector<Handoff> pair_handoffs(std::vector<quanta_handoff_event> events) {
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  std::map<uint32_t, quanta_handoff_event> released;  // device -> last release not handed on
  // A waiter is a slot of a process: the shim holds one slot per GPU in each process.
  auto waiter = [](const quanta_handoff_event& e) { return std::make_pair(e.pid, e.slot); };
  std::set<std::pair<uint32_t, uint32_t>> passed;  // waiters seen passing their gate
  std::vector<Handoff> out;
  for (const quanta_handoff_event& e : events) {
    if (e.probe == QUANTA_PROBE_RELEASE) {
      released[e.device] = e;
      continue;
    }
    if (e.probe != QUANTA_PROBE_GATE_WAIT_END) continue;
    const uint64_t began = e.ts_ns > e.value_ns ? e.ts_ns - e.value_ns : 0;
    const bool first_pass = passed.insert(waiter(e)).second;
    auto pending = released.find(e.device);
    // A handoff: another waiter, already waiting when the GPU was released, passes its
    // gate. One that started waiting later measures its own lateness, not the handoff, and
    // is left out; the release waits for the next.
    if (pending == released.end() || waiter(pending->second) == waiter(e) ||
        began > pending->second.ts_ns) {
      continue;
    }
    const quanta_handoff_event& release = pending->second;
    out.push_back({e.device, release.pid, release.slot, e.pid, e.tid, e.slot, release.ts_ns,
                   static_cast<double>(e.ts_ns - release.ts_ns) / 1e3, first_pass});
    released.erase(pending);
  }
  return out;
}

}  // namespace quanta::bpf
