// Closing descriptors off the event loop. The final close of a tenant connection frees the
// messages still queued on it, and with them any descriptors a peer managed to attach; the
// last close of such a descriptor can block (a TCP socket with SO_LINGER waits as long as
// its sender set, a FUSE file waits for its server). So can the last close of a replaced
// state file, whose blocks are freed then (with a synchronous trim on a filesystem mounted
// with discard). The loop hands such descriptors here and never waits; one thread closes
// them in order.
#pragma once

#include <cstddef>
#include <memory>

namespace quanta::arbiter {

class FdReaper {
 public:
  FdReaper();
  // Lets the thread finish what is queued; one stuck in a close is left behind (process
  // exit ends it) rather than holding up the arbiter's stop.
  ~FdReaper();
  FdReaper(const FdReaper&) = delete;
  FdReaper& operator=(const FdReaper&) = delete;

  // Takes ownership of fd (negative: ignored). Never blocks on the close itself.
  void close_later(int fd);
  // Descriptors handed over and not closed yet (a growing number means a close is stuck).
  size_t pending() const;

 public:
  struct State;  // shared with the thread, defined in the .cpp

 private:
  std::shared_ptr<State> state_;  // shared with the thread, which may outlive this object
};

}  // namespace quanta::arbiter
