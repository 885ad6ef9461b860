// What a tracing session's events say happened on each GPU: every hold (grant to release),
// every wait at a gate, and every switch between tenants with its handoff split into the
// arbiter's part, the wake-up, the run-queue delay and the gate exit, measured twice: by the
// kernel's clock at each probe and by the clocks the shim and arbiter read themselves.
// Pure (no I/O), so the pairing rules are unit-tested on hand-made event streams.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bpf/histogram.h"
#include "bpf/session.h"

namespace quanta::bpf {

// A GPU as one arbiter indexes it: device indexes are only unique per arbiter.
struct GpuKey {
  uint32_t arbiter = 0;  // the arbiter's tgid
  uint32_t index = 0;
  auto operator<=>(const GpuKey&) const = default;
};

struct ModelInput {
  std::vector<quanta_session_event> events;  // any order
  std::set<uint32_t> arbiters;               // arbiter tgids: their events are grants & co.
  std::map<uint32_t, uint32_t> arbiter_of;   // tenant tgid -> its arbiter's tgid
  std::map<GpuKey, uint32_t> seed_holders;   // slot holding each GPU when the session began
  std::map<GpuKey, uint32_t> seed_granted;   // slot granted last then (held or not): a grant
                                             // to another slot is the session's first switch
  uint64_t start_ns = 0;                     // session bounds, CLOCK_MONOTONIC
  uint64_t end_ns = 0;
};

struct HoldRecord {
  uint32_t slot = 0;
  uint32_t tgid = 0;  // 0 when no shim event named the slot's process
  uint64_t grant_ns = 0;
  uint64_t end_ns = 0;  // release, pass-over, the holder's next switch, or the session's end
  bool before_session = false;  // held when the session began: grant_ns is its start
  bool released = false;
  bool passed_over = false;
  bool holder_exited = false;  // its process exited while holding (the arbiter freed the slot)
  uint64_t quantum_ns = 0;
  uint64_t revoke_ns = 0;         // 0: not revoked (released idle, or still holding)
  uint64_t drain_begin_ns = 0;    // 0: no drain seen
  uint64_t released_seen_ns = 0;  // when the arbiter applied the release (its probe)
  uint64_t own_granted_ns = 0;    // the arbiter's own clock at the grant
  uint64_t own_released_ns = 0;   // the shim's own clock at the release
};

struct WaitRecord {
  uint32_t slot = 0;
  uint32_t tgid = 0;
  uint32_t tid = 0;
  uint64_t begin_ns = 0;
  uint64_t end_ns = 0;
};

// How the GPU changed hands.
enum class SwitchKind {
  kAfterRelease,  // the previous holder released, then the arbiter granted
  kGpuIdle,       // the GPU was free before the next tenant asked: measured from its ask
  kOverlapped,    // granted while the previous holder still drained (drain_overlap)
  kHolderGone,    // the previous holder never released (exited, or passed over)
};
const char* switch_kind_name(SwitchKind kind);

// One grant to another slot than the previous grant on that GPU. Its handoff runs from
// `start_ns` (the previous holder's release, the grant when there was none first, or the
// next tenant's gate-wait start when that came later) to the next tenant's first gate exit
// after the grant. The parts add up to the whole.
struct SwitchRecord {
  uint32_t from_slot = 0;
  uint32_t to_slot = 0;
  uint32_t from_tgid = 0;
  uint32_t to_tgid = 0;
  SwitchKind kind = SwitchKind::kAfterRelease;
  bool complete = false;  // the next tenant's gate exit was seen
  uint64_t grant_ns = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint64_t arbiter_ns = 0;      // start -> grant: noticing the release and deciding
  bool has_notice = false;      // the arbiter's own `released` probe split arbiter_ns:
  uint64_t notice_ns = 0;       //   release -> the arbiter applied it
  uint64_t decide_ns = 0;       //   applied -> grant
  uint64_t wakeup_ns = 0;       // grant -> the waiting thread made runnable
  uint64_t run_queue_ns = 0;    // runnable -> on a CPU
  uint64_t gate_exit_ns = 0;    // on a CPU -> out of the gate
  bool has_sched = false;       // the scheduler tracepoints saw the wake-up
  bool has_own = false;         // the shim and arbiter passed their own clock readings
  uint64_t own_handoff_ns = 0;  // the same handoff by those readings
  uint64_t handoff_ns() const { return end_ns - start_ns; }
};

struct GpuModel {
  GpuKey key;
  std::vector<HoldRecord> holds;
  std::vector<WaitRecord> waits;
  std::vector<SwitchRecord> switches;
  std::vector<uint64_t> revokes;  // instants
  uint64_t grants = 0;
  uint64_t pass_overs = 0;
};

struct Model {
  std::map<GpuKey, GpuModel> gpus;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint64_t unattributed = 0;  // shim events of processes whose arbiter is not known
};

Model build_model(ModelInput input);

// Histograms over one GPU, or over the part of it that `include(tgid)` selects (a pod):
// handoffs into selected processes, their waits, drains and revoke-to-release times.
struct GpuStats {
  uint64_t switches = 0;
  uint64_t complete = 0;
  uint64_t sched_seen = 0;  // complete switches whose waiter's wake-up the scheduler showed
  std::map<SwitchKind, uint64_t> by_kind;
  Histogram handoff;
  Histogram handoff_own;
  Histogram arbiter;
  Histogram notice;
  Histogram decide;
  Histogram wakeup;
  Histogram run_queue;
  Histogram gate_exit;
  Histogram gate_wait;
  Histogram drain;
  Histogram revoke_to_release;
};
GpuStats gpu_stats(const GpuModel& gpu, const std::function<bool(uint32_t tgid)>& include);

// Where each pod's time on one GPU went: holding it, waiting for it (and who held it
// meanwhile), draining after a revoke. Overlapping intervals of one pod count once.
struct PodTime {
  double held_s = 0;
  double waiting_s = 0;
  double draining_s = 0;
  std::map<std::string, double> waited_on;  // holder pod -> seconds of this pod's waits
  double waited_unheld_s = 0;               // waits while no pod held it (switching)
};
std::map<std::string, PodTime> attribute(const GpuModel& gpu, uint64_t start_ns, uint64_t end_ns,
                                         const std::function<std::string(uint32_t tgid)>& pod_of);

// The two instruments over the same switches: the kernel-clock handoff and the one the
// shim and arbiter timed themselves, exact medians over complete switches that have both.
struct Agreement {
  uint64_t switches = 0;
  double ebpf_p50_ns = 0;
  double own_p50_ns = 0;
  double difference = 0;  // |ebpf - own| / own
};
Agreement agreement(const Model& model, const std::function<bool(const GpuKey&)>& include);

}  // namespace quanta::bpf
