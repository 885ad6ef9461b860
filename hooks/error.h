// The hooks layer's one error idiom: whatever fails throws HookError with one line naming
// what was wrong (the key, the value) and what is allowed. Parsers catch the JSON and YAML
// libraries' exceptions at their boundary and rethrow them as HookError, so nothing else
// leaves a hooks function; main prints the line after "quanta-hook: " and exits 1.
#pragma once

#include <stdexcept>
#include <string>

namespace quanta::hooks {

// `text` with control characters, C1 controls and bidirectional overrides escaped (\x0a),
// by Quanta's one rule (hosted/names.h): what a hostile value put into a message
// cannot start a line of its own in the runtime's log or reorder it.
std::string printable(const std::string& text);

class HookError : public std::runtime_error {
 public:
  explicit HookError(const std::string& line) : std::runtime_error(printable(line)) {}
};

// The arbiter did not answer (no socket, nobody listening, a silent connection): the stage
// then applies [enforce] unplaced instead of failing on the first question it asked.
class ArbiterUnreachable : public HookError {
 public:
  explicit ArbiterUnreachable(const std::string& reason) : HookError(reason) {}
};

// `text` quoted for an error line: control characters escaped, cut at 200 bytes, so a
// hostile value cannot forge lines or flood the runtime's log.
std::string shown(const std::string& text);

}  // namespace quanta::hooks
