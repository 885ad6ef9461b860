// Small helpers the hook tests share: a whole file as text, and the monotonic clock in seconds.
#pragma once

#include <time.h>

#include <fstream>
#include <sstream>
#include <string>

inline std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}
