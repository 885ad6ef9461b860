// What every hooks fuzz target asserts of a refusal: a HookError (nothing else escapes a
// hooks function) whose message is one non-empty line.
#pragma once

#include <cstdlib>
#include <string>

#include "hooks/error.h"

inline void check_refusal(const quanta::hooks::HookError& e) {
  const std::string what = e.what();
  if (what.empty() || what.find('\n') != std::string::npos || what.find('\r') != std::string::npos) std::abort();
}
