// A shell command's standard output and its pclose status, for the bench tests that run
// quanta-bench and quanta-bench-report as a user would.
#pragma once

#include <cstdio>
#include <string>

namespace quanta::bench_tests {

inline std::string run_command(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t got = 0;
  while ((got = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, got);
  status = pclose(pipe);
  return out;
}

}  // namespace quanta::bench_tests
