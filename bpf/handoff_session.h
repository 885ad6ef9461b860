// handoff.bpf.c loaded and attached to the quanta:* USDT probes of given binaries, as a
// library: `quanta-trace handoff` reports from it, and quanta-bench links it to time the
// handoffs of its runs in process. Throws TraceError (trace_run.h) naming what failed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bpf/handoff.h"
#include "bpf/histogram.h"

namespace quanta::bpf {

// The probes' names, indexed by quanta_handoff_probe.
extern const char* const kHandoffProbeNames[QUANTA_PROBE_COUNT];

struct DeviceHists {
  Histogram handoff;
  Histogram gate_wait;
};

class HandoffSession {
 public:
  // Attaches to every binary that has each probe (ELF files; an absolute path is kept),
  // for `pids` or, when empty, every process that maps them. The gate and release probes
  // must be in at least one binary; the grant probe (quanta-arbiter's) may be missing.
  // With `keep_events`, every probe hit is kept as an event for events(). `probes` limits
  // the probes attached (each attached probe costs the traced process a trap per hit);
  // empty: all of them.
  HandoffSession(const std::vector<std::string>& binaries, const std::vector<pid_t>& pids,
                 bool keep_events, const std::vector<quanta_handoff_probe>& probes = {});
  ~HandoffSession();
  HandoffSession(const HandoffSession&) = delete;
  HandoffSession& operator=(const HandoffSession&) = delete;

  // Sleeps `timeout_ms`, then takes in the events buffered meanwhile (the program wakes no
  // reader per event). Not to be called beside stop().
  void poll(int timeout_ms);
  // Detaches every probe and takes in the events still buffered.
  void stop();

  const std::vector<std::string>& binaries() const { return binaries_; }
  bool grant_attached() const { return grant_attached_; }
  const std::vector<quanta_handoff_event>& events() const { return events_; }
  // Events the ring buffer had no room for.
  uint64_t events_lost() const;
  // The kernel's histograms, per device.
  std::map<uint32_t, DeviceHists> hists() const;
  // How often each probe fired (indexed by quanta_handoff_probe).
  std::vector<uint64_t> probe_counts() const;

 private:
  struct Handles;  // the skeleton, its links and ring buffer (handoff.skel.h stays inside)
  std::unique_ptr<Handles> handles_;
  std::vector<std::string> binaries_;
  bool grant_attached_ = false;
  std::vector<quanta_handoff_event> events_;
};

}  // namespace quanta::bpf
