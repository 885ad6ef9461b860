// Pairing rules for a session's events, GPU by GPU in time order: a grant opens a hold and,
// when it goes to another slot than the previous grant, a switch; the holder's release
// closes its hold; the new holder's first gate exit after the grant completes the switch.
#include "bpf/switch_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

namespace quanta::bpf {
namespace {

struct PendingSwitch {
  size_t index = 0;
  std::optional<size_t> from_hold;
  uint64_t own_granted_ns = 0;
};

struct GpuState {
  GpuModel* model = nullptr;
  std::map<uint32_t, size_t> open_hold;                  // slot -> hold granted and not yet ended
  std::map<uint32_t, size_t> last_hold;                  // slot -> its latest hold
  std::map<uint32_t, PendingSwitch> pending;             // to_slot -> switch awaiting its gate exit
  std::map<size_t, std::optional<size_t>> from_hold_of;  // switch index -> previous hold
  std::map<uint32_t, uint64_t> drain_begin;              // slot -> last drain start
  std::map<uint32_t, uint64_t> revoked;                  // slot -> last revoke
  std::optional<uint32_t> last_granted;
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint32_t>>> owners;  // slot -> (since, tgid)
  std::map<uint32_t, WaitRecord> open_waits;                              // tid -> wait in progress

  void note_owner(uint32_t slot, uint32_t tgid, uint64_t ts) {
    auto& history = owners[slot];
    if (history.empty() || history.back().second != tgid) history.emplace_back(ts, tgid);
  }
  uint32_t owner(uint32_t slot, uint64_t ts) const {
    auto it = owners.find(slot);
    if (it == owners.end() || it->second.empty()) return 0;
    uint32_t tgid = it->second.front().second;
    for (const auto& [since, who] : it->second) {
      if (since > ts) break;
      tgid = who;
    }
    return tgid;
  }
};

bool is_shim_event(uint32_t kind) {
  return kind == QUANTA_EV_GATE_WAIT_BEGIN || kind == QUANTA_EV_GATE_WAIT_END ||
         kind == QUANTA_EV_DRAIN_BEGIN || kind == QUANTA_EV_RELEASE;
}

bool is_arbiter_event(uint32_t kind) {
  return kind == QUANTA_EV_GRANT || kind == QUANTA_EV_REVOKE || kind == QUANTA_EV_RELEASED ||
         kind == QUANTA_EV_PASS_OVER || kind == QUANTA_EV_SLOT_FREED;
}

void on_grant(GpuState& st, const quanta_session_event& e) {
  GpuModel& gpu = *st.model;
  ++gpu.grants;
  if (auto open = st.open_hold.find(e.slot); open != st.open_hold.end()) {
    gpu.holds[open->second].end_ns = e.ts_ns;  // granted again without a release (restart)
    st.open_hold.erase(open);
  }
  std::optional<size_t> previous;
  if (st.last_granted && *st.last_granted != e.slot) {
    if (auto last = st.last_hold.find(*st.last_granted); last != st.last_hold.end())
      previous = last->second;
  }
  HoldRecord hold;
  hold.slot = e.slot;
  hold.grant_ns = e.ts_ns;
  hold.quantum_ns = e.b;
  hold.own_granted_ns = e.a;
  gpu.holds.push_back(hold);
  st.open_hold[e.slot] = gpu.holds.size() - 1;
  st.last_hold[e.slot] = gpu.holds.size() - 1;
  if (st.last_granted && *st.last_granted != e.slot) {
    SwitchRecord sw;
    sw.from_slot = *st.last_granted;
    sw.to_slot = e.slot;
    sw.grant_ns = e.ts_ns;
    sw.start_ns = e.ts_ns;
    sw.end_ns = e.ts_ns;
    gpu.switches.push_back(sw);
    st.pending[e.slot] = PendingSwitch{gpu.switches.size() - 1, previous, e.a};
    st.from_hold_of[gpu.switches.size() - 1] = previous;
  }
  st.last_granted = e.slot;
}

// The next tenant is out of the gate: the switch's handoff is known.
void complete_switch(GpuState& st, const PendingSwitch& pending, const quanta_session_event& e,
                     uint64_t wait_begin_ns) {
  GpuModel& gpu = *st.model;
  SwitchRecord& sw = gpu.switches[pending.index];
  const HoldRecord* from = pending.from_hold ? &gpu.holds[*pending.from_hold] : nullptr;
  const uint64_t g = sw.grant_ns;
  const bool released_first = from && from->released && from->end_ns <= g;
  const uint64_t base = released_first ? from->end_ns : g;
  sw.complete = true;
  sw.to_tgid = e.tgid;
  sw.end_ns = e.ts_ns;
  sw.start_ns = std::min(std::max(base, wait_begin_ns), sw.end_ns);
  sw.kind = released_first
                ? (wait_begin_ns > base ? SwitchKind::kGpuIdle : SwitchKind::kAfterRelease)
                : SwitchKind::kOverlapped;

  const uint64_t t0 = std::min(std::max(g, sw.start_ns), sw.end_ns);
  sw.arbiter_ns = t0 - sw.start_ns;
  if (released_first && sw.start_ns == base && from->released_seen_ns >= base &&
      from->released_seen_ns <= g) {
    sw.has_notice = true;
    sw.notice_ns = from->released_seen_ns - base;
    sw.decide_ns = g - from->released_seen_ns;
  }
  const uint64_t woken = e.c;
  const uint64_t on_cpu = e.d;
  sw.has_sched = woken != 0;
  const uint64_t tw = woken >= t0 && woken <= sw.end_ns ? woken : t0;
  const uint64_t to = on_cpu >= tw && on_cpu <= sw.end_ns ? on_cpu : tw;
  sw.wakeup_ns = tw - t0;
  sw.run_queue_ns = to - tw;
  sw.gate_exit_ns = sw.end_ns - to;

  // The same handoff by the shim's and arbiter's own clock readings.
  const uint64_t own_end = e.b;
  const uint64_t own_wait = e.a;
  const uint64_t own_base = released_first ? from->own_released_ns : pending.own_granted_ns;
  if (own_end != 0 && own_base != 0 && own_wait <= own_end) {
    const uint64_t own_start = std::max(own_base, own_end - own_wait);
    if (own_end >= own_start) {
      sw.has_own = true;
      sw.own_handoff_ns = own_end - own_start;
    }
  }
}

void on_shim_event(GpuState& st, const quanta_session_event& e) {
  GpuModel& gpu = *st.model;
  st.note_owner(e.slot, e.tgid, e.ts_ns);
  switch (e.kind) {
    case QUANTA_EV_GATE_WAIT_BEGIN:
      st.open_waits[e.tid] = WaitRecord{e.slot, e.tgid, e.tid, e.ts_ns, 0};
      break;
    case QUANTA_EV_GATE_WAIT_END: {
      WaitRecord wait;
      if (auto open = st.open_waits.find(e.tid); open != st.open_waits.end()) {
        wait = open->second;
        st.open_waits.erase(open);
      } else {  // began before the session: its own length says when
        wait = WaitRecord{e.slot, e.tgid, e.tid, e.ts_ns > e.a ? e.ts_ns - e.a : 0, 0};
      }
      wait.end_ns = e.ts_ns;
      gpu.waits.push_back(wait);
      if (auto pending = st.pending.find(e.slot);
          pending != st.pending.end() && gpu.switches[pending->second.index].grant_ns <= e.ts_ns) {
        complete_switch(st, pending->second, e, wait.begin_ns);
        st.pending.erase(pending);
      }
      break;
    }
    case QUANTA_EV_DRAIN_BEGIN:
      st.drain_begin[e.slot] = e.ts_ns;
      break;
    case QUANTA_EV_RELEASE: {
      auto open = st.open_hold.find(e.slot);
      if (open == st.open_hold.end()) break;  // nothing held: the link's first look at a slot
      HoldRecord& hold = gpu.holds[open->second];
      hold.end_ns = e.ts_ns;
      hold.released = true;
      hold.own_released_ns = e.a;
      if (auto d = st.drain_begin.find(e.slot);
          d != st.drain_begin.end() && d->second >= hold.grant_ns)
        hold.drain_begin_ns = d->second;
      if (auto r = st.revoked.find(e.slot); r != st.revoked.end() && r->second >= hold.grant_ns)
        hold.revoke_ns = r->second;
      st.open_hold.erase(open);
      break;
    }
    default:
      break;
  }
}

void on_arbiter_event(GpuState& st, const quanta_session_event& e) {
  GpuModel& gpu = *st.model;
  switch (e.kind) {
    case QUANTA_EV_GRANT:
      on_grant(st, e);
      break;
    case QUANTA_EV_REVOKE:
      gpu.revokes.push_back(e.ts_ns);
      st.revoked[e.slot] = e.ts_ns;
      if (auto open = st.open_hold.find(e.slot); open != st.open_hold.end()) {
        HoldRecord& hold = gpu.holds[open->second];
        if (hold.revoke_ns == 0) hold.revoke_ns = e.ts_ns;
      }
      break;
    case QUANTA_EV_RELEASED:
      if (auto last = st.last_hold.find(e.slot); last != st.last_hold.end()) {
        HoldRecord& hold = gpu.holds[last->second];
        if (hold.released && hold.released_seen_ns == 0 && e.ts_ns >= hold.end_ns)
          hold.released_seen_ns = e.ts_ns;
      }
      break;
    case QUANTA_EV_SLOT_FREED:
      if (auto open = st.open_hold.find(e.slot); open != st.open_hold.end()) {
        HoldRecord& hold = gpu.holds[open->second];
        hold.end_ns = e.ts_ns;
        hold.holder_exited = true;
        st.open_hold.erase(open);
      }
      st.pending.erase(e.slot);  // granted, then gone before its first launch
      break;
    case QUANTA_EV_PASS_OVER:
      ++gpu.pass_overs;
      if (auto open = st.open_hold.find(e.slot); open != st.open_hold.end()) {
        HoldRecord& hold = gpu.holds[open->second];
        hold.end_ns = e.ts_ns;
        hold.passed_over = true;
        st.open_hold.erase(open);
      }
      break;
    default:
      break;
  }
}

void finalize(GpuState& st, uint64_t end_ns) {
  GpuModel& gpu = *st.model;
  for (HoldRecord& hold : gpu.holds) hold.tgid = st.owner(hold.slot, hold.grant_ns);
  // A hold the GPU was switched away from that never released: its holder is gone (exited,
  // or stopped and passed over); it ends at the first switch away from it.
  std::map<size_t, uint64_t> left_at;  // hold index -> first switch away from it
  for (const auto& [index, from] : st.from_hold_of) {
    if (!from) continue;
    auto [it, inserted] = left_at.emplace(*from, gpu.switches[index].grant_ns);
    if (!inserted) it->second = std::min(it->second, gpu.switches[index].grant_ns);
  }
  for (const auto& [slot, index] : st.open_hold) {
    HoldRecord& hold = gpu.holds[index];
    auto away = left_at.find(index);
    hold.end_ns = away != left_at.end() ? away->second : std::max(end_ns, hold.grant_ns);
  }
  for (const auto& [index, from] : st.from_hold_of) {
    SwitchRecord& sw = gpu.switches[index];
    if (from) {
      const HoldRecord& hold = gpu.holds[*from];
      sw.from_tgid = hold.tgid;
      if (sw.complete && (!hold.released || hold.passed_over)) sw.kind = SwitchKind::kHolderGone;
    } else {
      sw.from_tgid = st.owner(sw.from_slot, sw.grant_ns);
    }
    if (!sw.complete) sw.to_tgid = st.owner(sw.to_slot, sw.grant_ns);
  }
}

using Intervals = std::vector<std::pair<uint64_t, uint64_t>>;

Intervals merged(Intervals spans) {
  std::sort(spans.begin(), spans.end());
  Intervals out;
  for (const auto& span : spans) {
    if (span.second <= span.first) continue;
    if (!out.empty() && span.first <= out.back().second) {
      out.back().second = std::max(out.back().second, span.second);
    } else {
      out.push_back(span);
    }
  }
  return out;
}

uint64_t total(const Intervals& spans) {
  uint64_t sum = 0;
  for (const auto& [a, b] : spans) sum += b - a;
  return sum;
}

// Both merged (sorted, disjoint).
uint64_t overlap(const Intervals& a, const Intervals& b) {
  uint64_t sum = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint64_t lo = std::max(a[i].first, b[j].first);
    const uint64_t hi = std::min(a[i].second, b[j].second);
    if (hi > lo) sum += hi - lo;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return sum;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
  double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<long>(mid));
  return (lower + upper) / 2;
}

}  // namespace

const char* switch_kind_name(SwitchKind kind) {
  switch (kind) {
    case SwitchKind::kAfterRelease:
      return "after_release";
    case SwitchKind::kGpuIdle:
      return "gpu_idle";
    case SwitchKind::kOverlapped:
      return "overlapped";
    case SwitchKind::kHolderGone:
      return "holder_gone";
  }
  return "?";
}

Model build_model(ModelInput input) {
  Model model;
  model.start_ns = input.start_ns;
  model.end_ns = input.end_ns;
  std::stable_sort(input.events.begin(), input.events.end(),
                   [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  std::map<GpuKey, GpuState> states;
  auto state_of = [&](const GpuKey& key) -> GpuState& {
    GpuState& st = states[key];
    if (!st.model) {
      GpuModel& gpu = model.gpus[key];
      gpu.key = key;
      st.model = &gpu;
    }
    return st;
  };
  for (const auto& [key, slot] : input.seed_granted) state_of(key).last_granted = slot;
  for (const auto& [key, slot] : input.seed_holders) {
    GpuState& st = state_of(key);
    HoldRecord hold;
    hold.slot = slot;
    hold.grant_ns = input.start_ns;
    hold.before_session = true;
    st.model->holds.push_back(hold);
    st.open_hold[slot] = st.model->holds.size() - 1;
    st.last_hold[slot] = st.model->holds.size() - 1;
    st.last_granted = slot;
  }
  const std::optional<uint32_t> only_arbiter =
      input.arbiters.size() == 1 ? std::optional<uint32_t>(*input.arbiters.begin()) : std::nullopt;
  for (const quanta_session_event& e : input.events) {
    if (is_arbiter_event(e.kind)) {
      if (!input.arbiters.count(e.tgid)) continue;  // an arbiter this session did not find
      on_arbiter_event(state_of(GpuKey{e.tgid, e.device}), e);
    } else if (is_shim_event(e.kind)) {
      std::optional<uint32_t> arbiter;
      if (auto it = input.arbiter_of.find(e.tgid); it != input.arbiter_of.end()) {
        arbiter = it->second;
      } else {
        arbiter = only_arbiter;
      }
      if (!arbiter) {
        ++model.unattributed;
        continue;
      }
      on_shim_event(state_of(GpuKey{*arbiter, e.device}), e);
    }
  }
  for (auto& [key, st] : states) finalize(st, input.end_ns);
  return model;
}

GpuStats gpu_stats(const GpuModel& gpu, const std::function<bool(uint32_t tgid)>& include) {
  GpuStats stats;
  for (const SwitchRecord& sw : gpu.switches) {
    if (!include(sw.to_tgid)) continue;
    ++stats.switches;
    if (!sw.complete) continue;
    ++stats.complete;
    stats.sched_seen += sw.has_sched;
    ++stats.by_kind[sw.kind];
    stats.handoff.record(sw.handoff_ns());
    if (sw.has_own) stats.handoff_own.record(sw.own_handoff_ns);
    stats.arbiter.record(sw.arbiter_ns);
    if (sw.has_notice) {
      stats.notice.record(sw.notice_ns);
      stats.decide.record(sw.decide_ns);
    }
    stats.wakeup.record(sw.wakeup_ns);
    stats.run_queue.record(sw.run_queue_ns);
    stats.gate_exit.record(sw.gate_exit_ns);
  }
  for (const WaitRecord& wait : gpu.waits) {
    if (include(wait.tgid)) stats.gate_wait.record(wait.end_ns - wait.begin_ns);
  }
  for (const HoldRecord& hold : gpu.holds) {
    if (!include(hold.tgid) || !hold.released) continue;
    if (hold.drain_begin_ns != 0 && hold.drain_begin_ns <= hold.end_ns)
      stats.drain.record(hold.end_ns - hold.drain_begin_ns);
    if (hold.revoke_ns != 0 && hold.revoke_ns <= hold.end_ns)
      stats.revoke_to_release.record(hold.end_ns - hold.revoke_ns);
  }
  return stats;
}

std::map<std::string, PodTime> attribute(const GpuModel& gpu, uint64_t start_ns, uint64_t end_ns,
                                         const std::function<std::string(uint32_t tgid)>& pod_of) {
  auto clip = [&](uint64_t a, uint64_t b) {
    return std::make_pair(std::max(a, start_ns), std::min(b, end_ns));
  };
  std::map<std::string, Intervals> held, waiting, draining;
  for (const HoldRecord& hold : gpu.holds) {
    const std::string pod = pod_of(hold.tgid);
    held[pod].push_back(clip(hold.grant_ns, hold.end_ns));
    if (hold.released && hold.drain_begin_ns != 0)
      draining[pod].push_back(clip(hold.drain_begin_ns, hold.end_ns));
  }
  for (const WaitRecord& wait : gpu.waits)
    waiting[pod_of(wait.tgid)].push_back(clip(wait.begin_ns, wait.end_ns));
  Intervals anyone;
  for (auto& [pod, spans] : held) {
    spans = merged(spans);
    anyone.insert(anyone.end(), spans.begin(), spans.end());
  }
  anyone = merged(anyone);
  std::map<std::string, PodTime> out;
  auto seconds = [](uint64_t ns) { return static_cast<double>(ns) / 1e9; };
  for (auto& [pod, spans] : held) out[pod].held_s = seconds(total(spans));
  for (auto& [pod, spans] : draining) out[pod].draining_s = seconds(total(merged(spans)));
  for (auto& [pod, spans] : waiting) {
    spans = merged(spans);
    PodTime& time = out[pod];
    time.waiting_s = seconds(total(spans));
    for (const auto& [holder, holds] : held) {
      const uint64_t ns = overlap(spans, holds);
      if (ns) time.waited_on[holder] = seconds(ns);
    }
    time.waited_unheld_s = seconds(total(spans) - overlap(spans, anyone));
  }
  return out;
}

Agreement agreement(const Model& model, const std::function<bool(const GpuKey&)>& include) {
  std::vector<double> ebpf, own;
  for (const auto& [key, gpu] : model.gpus) {
    if (!include(key)) continue;
    for (const SwitchRecord& sw : gpu.switches) {
      if (!sw.complete || !sw.has_own) continue;
      ebpf.push_back(static_cast<double>(sw.handoff_ns()));
      own.push_back(static_cast<double>(sw.own_handoff_ns));
    }
  }
  Agreement result;
  result.switches = ebpf.size();
  result.ebpf_p50_ns = median(ebpf);
  result.own_p50_ns = median(own);
  if (result.own_p50_ns > 0)
    result.difference = std::abs(result.ebpf_p50_ns - result.own_p50_ns) / result.own_p50_ns;
  return result;
}

}  // namespace quanta::bpf
