// USDT probes read straight from an ELF file's .note.stapsdt, and a tracefs session that
// records them as uprobes on a private ftrace instance with the CLOCK_MONOTONIC clock:
// the fallback for handoff latency where quanta-trace cannot attach. Needs root and
// tracefs; everything it creates is removed at destruction.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace quanta::bench {

struct UsdtProbe {
  std::string provider;
  std::string name;
  uint64_t address = 0;      // link-time address of the probe's nop
  uint64_t file_offset = 0;  // where a uprobe attaches
};

// Probes of an ELF file; throws std::runtime_error naming what could not be read.
std::vector<UsdtProbe> read_usdt_probes(const std::string& path);

struct ProbeHit {
  std::string probe;
  uint32_t tid = 0;
  uint64_t ts_ns = 0;  // CLOCK_MONOTONIC
};

class UprobeSession {
 public:
  // Attaches uprobes on `probes` (names of provider `provider`) in `binary` for every
  // process that maps it; throws std::runtime_error with the reason when it cannot.
  UprobeSession(const std::string& binary, const std::string& provider, const std::vector<std::string>& probes);
  ~UprobeSession();
  UprobeSession(const UprobeSession&) = delete;
  UprobeSession& operator=(const UprobeSession&) = delete;
  // Stops recording and returns every hit in time order.
  std::vector<ProbeHit> collect();
  uint64_t lost() const { return lost_; }

 private:
  void teardown();
  std::string tracefs_;
  std::string group_;
  std::string instance_;
  std::vector<std::string> events_;
  bool attached_ = false;
  uint64_t lost_ = 0;
};

// Handoffs from hits: on each device, a `release` by one tenant to the next
// `gate_wait_end` of another tenant that was already waiting at its gate (its
// `gate_wait_begin` came before the release). Threads are mapped to tenants (and tenants
// to devices) by the caller. Returns microseconds.
std::vector<double> handoffs_from_hits(const std::vector<ProbeHit>& hits, const std::map<uint32_t, int>& tenant_of_tid,
                                       const std::vector<int>& tenant_devices);

}  // namespace quanta::bench
