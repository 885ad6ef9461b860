// Test program that fires Quanta's four USDT probes in a known pattern, so quanta-trace's
// handoff tool is proven before the shim and arbiter emit them: two threads (slots 0 and 1)
// pass one device back and forth `--rounds` times each, holding it `--hold-us` each turn.
// It starts when a line (or EOF) arrives on stdin, so a tracer can attach first.
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
// the other slot.
void run_slot(Device& device, uint32_t device_id, uint32_t slot, int rounds,
              std::chrono::microseconds hold) {
  for (int round = 0; round < rounds; ++round) {
    DTRACE_PROBE2(quanta, gate_wait_begin, device_id, slot);
    const uint64_t wait_start = monotonic_ns();
    {
      std::unique_lock lock(device.mutex);
      device.turn_changed.wait(lock, [&] { return device.owner == slot; });
    }
    const uint64_t wait_ns = monotonic_ns() - wait_start;
    DTRACE_PROBE3(quanta, gate_wait_end, device_id, slot, wait_ns);
    DTRACE_PROBE2(quanta, grant, device_id, slot);
    std::this_thread::sleep_for(hold);
    DTRACE_PROBE2(quanta, release, device_id, slot);
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
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) {
      rounds = parse_int(argv[i], argv[i + 1]);
    } else if (std::strcmp(argv[i], "--hold-us") == 0) {
      hold_us = parse_int(argv[i], argv[i + 1]);
    } else if (std::strcmp(argv[i], "--device") == 0) {
      device_id = parse_int(argv[i], argv[i + 1]);
    } else {
      std::fprintf(stderr, "usdt_emitter: unknown option '%s' (--rounds, --hold-us, --device)\n",
                   argv[i]);
      return 2;
    }
  }
  std::string go;
  std::getline(std::cin, go);

  Device device;
  const auto hold = std::chrono::microseconds(hold_us);
  const auto id = static_cast<uint32_t>(device_id);
  std::thread slot0(run_slot, std::ref(device), id, 0u, rounds, hold);
  std::thread slot1(run_slot, std::ref(device), id, 1u, rounds, hold);
  slot0.join();
  slot1.join();
  return 0;
}
