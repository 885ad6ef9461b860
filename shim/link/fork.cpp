// Fork: the child is a new process to the arbiter. It keeps no link (no connection, no
// link thread, no slots) and connects lazily at its own first CUDA call.
#include "shim/link/link_state.h"

namespace quanta::shim {

// pthread_atfork child handler: only the forking thread lives on in the child.
void reset_link_in_child() {
  session_reset_in_child();
  activity_reset_in_child();
  contexts_reset_in_child();
  gate_reset_in_child();
  link_threads_reset_in_child();
  t_in_link = false;
  g_process.epoch.fetch_add(1);
  g_process.state.store(kUntouched, std::memory_order_release);
}

}  // namespace quanta::shim
