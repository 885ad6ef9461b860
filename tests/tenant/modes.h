// The workload modes. Each fills the report with its figures and returns whether it
// succeeded; a CUDA failure outside what the mode counts is thrown as CudaError.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/tenant/driver.h"
#include "tests/tenant/options.h"

namespace quanta::tenant {

using Clock = std::chrono::steady_clock;

bool run_batch(const Driver& driver, const Options& options, nlohmann::json& report);
bool run_requests(const Driver& driver, const Options& options, nlohmann::json& report);
bool run_alloc(const Driver& driver, const Options& options, nlohmann::json& report);
bool run_info(const Driver& driver, const Options& options, nlohmann::json& report);

// Sleeps until --start-at (if given) and records how late the start was.
void wait_for_start(const Options& options, nlohmann::json& report);

// Nearest-rank percentile (0 < fraction <= 1) of unsorted samples; 0 when empty.
double percentile(std::vector<double> samples, double fraction);

// Sleeps until an absolute steady-clock time (CLOCK_MONOTONIC, absolute, EINTR-safe).
void sleep_until(Clock::time_point when);

}  // namespace quanta::tenant
