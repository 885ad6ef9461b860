// Test program that fires Quanta's four USDT probes in a known pattern, so quanta-trace's
// handoff tool is proven before the shim and arbiter emit them: two threads (slots 0 and 1)
// pass one device back and forth `--rounds` times each, holding it `--hold-us` each turn.
// Each probe carries the stamps the shim and arbiter pass (read just before the probe);
// `--release-stamp-lead-us N` stamps each release N us before its probe, as if the releaser
// had been held up that long between its clock and the probe, so a test can tell which
// times a tracer used. It starts when a line (or EOF) arrives on stdin, so a tracer can
// attach first.
#include <sys/sdt.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

namespace {

struct Device {
  std::mutex mutex;
  std::condition_variable turn_changed;
  uint32_t owner = 0;  // the slot whose turn it is
};

uint64_t monotonic_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Each round: wait at the gate until it is this slot's turn, take the grant, hold the
// device, release it and hand the turn to the other slot. Strict alternation makes the
// number of handoffs exact: every gate_wait_end but the very first follows a release by
// the other slot. A slot's wait for its next turn begins before it hands this one on, so
// it was waiting when the other slot released however late its thread runs again; its
// first wait begins at `go_ns`, before either thread started.
void run_slot(Device& device, uint32_t device_id, uint32_t slot, int rounds,
              std::chrono::microseconds hold, uint64_t release_lead_ns, uint64_t go_ns) {
  uint64_t wait_start = go_ns;
  for (int round = 0; round < rounds; ++round) {
    DTRACE_PROBE2(quanta, gate_wait_begin, device_id, slot);
    {
      std::unique_lock lock(device.mutex);
      device.turn_changed.wait(lock, [&] { return device.owner == slot; });
    }
    const uint64_t end_ns = monotonic_ns();
    const uint64_t wait_ns = end_ns - wait_start;
    DTRACE_PROBE4(quanta, gate_wait_end, device_id, slot, wait_ns, end_ns);
    DTRACE_PROBE4(quanta, grant, device_id, slot, monotonic_ns(), hold.count() * 1000);
    std::this_thread::sleep_for(hold);
    DTRACE_PROBE3(quanta, release, device_id, slot, monotonic_ns() - release_lead_ns);
    wait_start = monotonic_ns();
    {
      std::lock_guard lock(device.mutex);
      device.owner = 1 - slot;
    }
    device.turn_changed.notify_all();
  }
}

int parse_int(const char* flag, const char* value) {
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || parsed < 0 || parsed > 1000000) {
    std::fprintf(stderr, "usdt_emitter: %s wants a number 0..1000000, got '%s'\n", flag, value);
    std::exit(2);
  }
  return static_cast<int>(parsed);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20;
  int hold_us = 1000;
  int device_id = 0;
  int release_lead_us = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) {
      rounds = parse_int(argv[i], argv[i + 1]);
    } else if (std::strcmp(argv[i], "--hold-us") == 0) {
      hold_us = parse_int(argv[i], argv[i + 1]);
    } else if (std::strcmp(argv[i], "--device") == 0) {
      device_id = parse_int(argv[i], argv[i + 1]);
    } else if (std::strcmp(argv[i], "--release-stamp-lead-us") == 0) {
      release_lead_us = parse_int(argv[i], argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usdt_emitter: unknown option '%s' (--rounds, --hold-us, --device, "
                   "--release-stamp-lead-us)\n",
                   argv[i]);
      return 2;
    }
  }
  std::string go;
  std::getline(std::cin, go);

  Device device;
  const auto hold = std::chrono::microseconds(hold_us);
  const auto id = static_cast<uint32_t>(device_id);
  const auto lead_ns = static_cast<uint64_t>(release_lead_us) * 1000;
  const uint64_t go_ns = monotonic_ns();
  std::thread slot0(run_slot, std::ref(device), id, 0u, rounds, hold, lead_ns, go_ns);
  std::thread slot1(run_slot, std::ref(device), id, 1u, rounds, hold, lead_ns, go_ns);
  slot0.join();
  slot1.join();
  return 0;
}
