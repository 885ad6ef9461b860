// Stand-in for the arbiter link, compiled only while shim/link.cpp does not exist: every
// process is unplaced, so launches pass ungated and memory goes uncapped and uncounted.
#include "shim/link.h"

namespace quanta::shim {

bool link_memory_account(CUdevice, MemoryAccount*) {
  return false;
}
void link_gate_enter(CUcontext) {}
void link_gate_leave(CUcontext, CUresult) {}
void link_forget_context(CUcontext) {}

}  // namespace quanta::shim
