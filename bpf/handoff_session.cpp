// HandoffSession (handoff_session.h): open, size, load and attach handoff.bpf.c, then drain
// its ring buffer and read its maps.
#include "bpf/handoff_session.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bpf/libbpf_handles.h"
#include "bpf/trace_run.h"
#include "handoff.skel.h"

namespace quanta::bpf {

const char* const kHandoffProbeNames[QUANTA_PROBE_COUNT] = {"gate_wait_begin", "gate_wait_end",
                                                            "release", "grant"};

namespace {

int collect_event(void* ctx, void* data, size_t size) {
  if (size < sizeof(quanta_handoff_event)) return 0;
  auto* events = static_cast<std::vector<quanta_handoff_event>*>(ctx);
  events->push_back(*static_cast<const quanta_handoff_event*>(data));
  return 0;
}

// Checks that `path` is an ELF file and returns its absolute path.
std::string checked_binary(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw TraceError("binary '" + path + "' does not exist or is not a regular file");
  }
  const std::string binary = std::filesystem::absolute(path, ec).string();
  char magic[4] = {};
  std::ifstream file(binary, std::ios::binary);
  if (!file.read(magic, sizeof magic) || std::memcmp(magic, "\x7f" "ELF", 4) != 0) {
    throw TraceError("binary '" + binary + "' is not an ELF executable or shared library");
  }
  return binary;
}

}  // namespace

struct HandoffSession::Handles {
  struct SkeletonDeleter {
    void operator()(handoff_bpf* skel) const { handoff_bpf__destroy(skel); }
  };
  std::unique_ptr<handoff_bpf, SkeletonDeleter> skel;
  std::vector<UniqueLink> links;
  UniqueRingBuffer events;
};

HandoffSession::HandoffSession(const std::vector<std::string>& binaries,
                               const std::vector<pid_t>& pids, bool keep_events,
                               const std::vector<quanta_handoff_probe>& probes)
    : handles_(std::make_unique<Handles>()) {
  if (binaries.empty()) throw TraceError("handoff needs --binary PATH");
  for (const std::string& path : binaries) binaries_.push_back(checked_binary(path));
  require_processes(pids);

  handles_->skel.reset(handoff_bpf__open());
  handoff_bpf* skel = handles_->skel.get();
  if (!skel) throw TraceError("cannot open the handoff BPF object: " + errno_text(errno));
  skel->rodata->emit_events = keep_events;
  if (!keep_events) {
    // No events wanted: the ring buffer stays empty, so give it the smallest legal size.
    bpf_map__set_max_entries(skel->maps.events, static_cast<uint32_t>(::getpagesize()));
  }
  if (int err = handoff_bpf__load(skel); err != 0) {
    throw TraceError("cannot load the handoff BPF programs (root needed): " + errno_text(err));
  }

  bpf_program* programs[QUANTA_PROBE_COUNT] = {
      skel->progs.handle_gate_wait_begin, skel->progs.handle_gate_wait_end,
      skel->progs.handle_release, skel->progs.handle_grant};
  std::vector<pid_t> targets = pids;
  if (targets.empty()) targets.push_back(-1);  // every process that maps the binary
  for (int probe = 0; probe < QUANTA_PROBE_COUNT; ++probe) {
    if (!probes.empty() && std::find(probes.begin(), probes.end(), probe) == probes.end()) continue;
    bool found = false;
    for (const std::string& binary : binaries_) {
      for (pid_t pid : targets) {
        bpf_link* link = bpf_program__attach_usdt(programs[probe], pid, binary.c_str(), "quanta",
                                                  kHandoffProbeNames[probe], nullptr);
        if (!link) {
          const int err = errno;
          if (err == ENOENT) break;  // not in this binary; maybe in another
          throw TraceError("cannot attach USDT probe quanta:" + std::string(kHandoffProbeNames[probe]) +
                           " in '" + binary + "'" +
                           (pid > 0 ? " for pid " + std::to_string(pid) : std::string()) + ": " +
                           errno_text(err));
        }
        handles_->links.emplace_back(link);
        found = true;
      }
    }
    if (probe == QUANTA_PROBE_GRANT) {
      grant_attached_ = found;
    } else if (!found) {
      throw TraceError("binary '" + binaries_.front() + "'" +
                       (binaries_.size() > 1 ? " (nor any other --binary)" : "") +
                       " has no USDT probe quanta:" + kHandoffProbeNames[probe] +
                       " (name the executable or library built with Quanta's probes)");
    }
  }

  if (keep_events) {
    handles_->events.reset(
        ring_buffer__new(bpf_map__fd(skel->maps.events), collect_event, &events_, nullptr));
    if (!handles_->events) throw TraceError("cannot open the event ring buffer: " + errno_text(errno));
  }
}

HandoffSession::~HandoffSession() = default;

void HandoffSession::poll(int timeout_ms) {
  // The program submits without waking its reader (handoff.bpf.c), so the buffer is drained
  // once per period rather than once per event.
  std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
  if (handles_->events) ring_buffer__consume(handles_->events.get());
}

void HandoffSession::stop() {
  handles_->links.clear();
  if (handles_->events) ring_buffer__consume(handles_->events.get());
}

uint64_t HandoffSession::events_lost() const {
  return handles_->skel->bss->events_lost;
}

std::map<uint32_t, DeviceHists> HandoffSession::hists() const {
  std::map<uint32_t, DeviceHists> result;
  for_each_entry<quanta_handoff_key, quanta_hist>(
      bpf_map__fd(handles_->skel->maps.hists),
      [&result](const quanta_handoff_key& key, const quanta_hist& raw) {
        auto& entry = result[key.device];
        (key.kind == QUANTA_HIST_HANDOFF ? entry.handoff : entry.gate_wait).add(raw);
      });
  return result;
}

std::vector<uint64_t> HandoffSession::probe_counts() const {
  const int cpus = libbpf_num_possible_cpus();
  std::vector<uint64_t> totals(QUANTA_PROBE_COUNT, 0);
  std::vector<uint64_t> per_cpu(static_cast<size_t>(std::max(cpus, 1)));
  const int fd = bpf_map__fd(handles_->skel->maps.probe_counts);
  for (uint32_t probe = 0; probe < QUANTA_PROBE_COUNT; ++probe) {
    if (bpf_map_lookup_elem(fd, &probe, per_cpu.data()) != 0) continue;
    for (uint64_t v : per_cpu) totals[probe] += v;
  }
  return totals;
}

}  // namespace quanta::bpf
