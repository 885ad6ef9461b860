// The one way the host programs put an errno value into a message.
#pragma once

#include <string>

namespace quanta::hosted {

// strerror's text for `err` and its number, "No such file or directory (errno 2)", safe
// from any thread. A negative `err` (libbpf's return values) counts as its opposite.
std::string errno_text(int err);

}  // namespace quanta::hosted
