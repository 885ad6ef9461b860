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
  std::vector<std::string> arguments;  // where each argument lives, as the note says ("8@%rax")
};

// Probes of an ELF file; throws std::runtime_error naming what could not be read.
std::vector<UsdtProbe> read_usdt_probes(const std::string& path);

// A tracefs fetch argument ("%ax:u64", "+32(%r10):u32") for one USDT argument location
// of x86-64 ("8@%rax", "4@32(%r10)", "-4@%ebx"); throws std::runtime_error naming a
// location that tracefs cannot fetch (a constant, an indexed address).
std::string tracefs_fetch(const std::string& location);

struct ProbeHit {
  std::string probe;
  uint32_t tid = 0;
  uint64_t ts_ns = 0;  // CLOCK_MONOTONIC, when the kernel recorded the hit
  // The arguments asked for, in the order asked (ProbeRequest::arguments).
  std::vector<uint64_t> arguments;
};

// A probe to record, and which of its arguments (1-based) to record with each hit.
struct ProbeRequest {
  std::string name;
  std::vector<int> arguments;
};

// One line of a tracefs instance's text output for a uprobe event whose fetched
// arguments are named a1, a2, ... ("quanta-tenant-812 [001] ..... 5563.632248: release:
// (0x7f01) a1=123"); false for a line that is not one.
bool parse_trace_line(const std::string& line, std::string& event, ProbeHit& hit);

class UprobeSession {
 public:
  // Attaches uprobes on `probes` (of provider `provider`) in `binary` for every process
  // that maps it; throws std::runtime_error with the reason when it cannot.
  UprobeSession(const std::string& binary, const std::string& provider, const std::vector<ProbeRequest>& probes);
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
  std::map<std::string, size_t> events_;  // each attached probe, and how many arguments it records
  bool attached_ = false;
  uint64_t lost_ = 0;
};

// One handoff: when the GPU was released (CLOCK_MONOTONIC, the shim's stamp) and how long
// until the next tenant passed its gate.
struct Handoff {
  uint64_t released_ns = 0;
  double us = 0;
  // The next tenant's first pass of its gate after a wait: the first time its process runs
  // after starting, part of its start-up rather than a handoff between running tenants.
  bool first_pass = false;
};

// Handoffs from hits: on each device, a `release` by one tenant to the next
// `gate_wait_end` of another tenant that was already waiting at its gate when the GPU was
// released. Threads are mapped to tenants (and tenants to devices) by the caller.
//
// Hits are timed by the shim's own clock, as the probes carry it: `release` its stamp
// (argument 1), `gate_wait_end` the time waited and its stamp (arguments 1 and 2). The
// stamps are read before each probe's trap, so the interval holds no trap of the
// measuring probes, and a wait's start is its end less the time waited. Hits without
// those arguments are left out.
std::vector<Handoff> handoffs_from_hits(const std::vector<ProbeHit>& hits, const std::map<uint32_t, int>& tenant_of_tid,
                                       const std::vector<int>& tenant_devices);

}  // namespace quanta::bench
