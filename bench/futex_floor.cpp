// One-hop futex wake latency between a parent and a forked child sharing an anonymous
// mapping: the parent stamps the time, bumps the word and wakes; the child, asleep in
// FUTEX_WAIT, records how long it took to run again and acknowledges.
#include "bench/futex_floor.h"

#include "common/clock.h"
#include "common/futex.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace quanta::bench {

namespace {

constexpr int kMaxRounds = 20000;

struct Shared {
  std::atomic<uint32_t> doorbell;  // parent → child: round number
  std::atomic<uint32_t> ack;       // child → parent: last round handled
  std::atomic<uint64_t> stamp_ns;  // parent's clock right before the wake
  uint64_t latency_ns[kMaxRounds];
};

}  // namespace

std::vector<double> measure_futex_wakes(int rounds) {
  rounds = std::min(rounds, kMaxRounds);
  void* memory = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw std::runtime_error(std::string("futex floor: mmap failed: ") + std::strerror(errno));
  auto* shared = new (memory) Shared{};

  pid_t child = fork();
  if (child < 0) {
    munmap(memory, sizeof(Shared));
    throw std::runtime_error(std::string("futex floor: fork failed: ") + std::strerror(errno));
  }
  if (child == 0) {
    for (uint32_t round = 1; round <= static_cast<uint32_t>(rounds); ++round) {
      while (shared->doorbell.load(std::memory_order_acquire) < round) {
        common::futex_wait(&shared->doorbell, round - 1, 1'000'000'000ull);
      }
      shared->latency_ns[round - 1] = common::monotonic_ns() - shared->stamp_ns.load(std::memory_order_acquire);
      shared->ack.store(round, std::memory_order_release);
      common::futex_wake(&shared->ack, 1);
    }
    _exit(0);
  }

  for (uint32_t round = 1; round <= static_cast<uint32_t>(rounds); ++round) {
    // Let the child fall asleep in FUTEX_WAIT: the floor is a wake of a sleeper, as at
    // the gate, not a hand-over to a spinning thread.
    timespec pause{0, 200'000};
    nanosleep(&pause, nullptr);
    shared->stamp_ns.store(common::monotonic_ns(), std::memory_order_release);
    shared->doorbell.store(round, std::memory_order_release);
    common::futex_wake(&shared->doorbell, 1);
    while (shared->ack.load(std::memory_order_acquire) < round) {
      common::futex_wait(&shared->ack, round - 1, 1'000'000'000ull);
    }
  }
  int status = 0;
  waitpid(child, &status, 0);
  std::vector<double> out;
  for (int i = 0; i < rounds; ++i) out.push_back(static_cast<double>(shared->latency_ns[i]) / 1e3);
  munmap(memory, sizeof(Shared));
  return out;
}

}  // namespace quanta::bench
