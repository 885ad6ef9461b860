// Device configuration read once from the SIMGPU_* environment: device count, memory,
// names, UUIDs, MIG splits, engine timing, execution log and the shared-state name.
// Parsing is pure (no globals) so tests can feed it values directly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace quanta::simgpu {

// One CUdevice as the tenant sees it: a whole GPU or one MIG-like instance of one.
struct DeviceSpec {
  std::string name;
  std::string uuid_text;  // "GPU-8-4-4-4-12" or "MIG-8-4-4-4-12"
  uint8_t uuid[16] = {};
  uint8_t parent_uuid[16] = {};  // the whole GPU's (its own for a GPU that is not split)
  uint64_t memory_bytes = 0;
  int physical_index = 0;
  int mig_instance = -1;  // -1: a whole GPU
};

struct Config {
  std::vector<DeviceSpec> devices;
  uint64_t timeslice_ns = 1'000'000;
  uint64_t switch_ns = 50'000;
  uint64_t context_bytes = 0;  // device memory the driver itself takes for each context
  std::string log_path;    // empty: no execution log
  std::string state_name;  // shm_open name without the leading '/'
};

// Looks a variable up; returns nullptr when unset. Tests inject their own.
using EnvLookup = const char* (*)(const char* name);

// Parses every SIMGPU_* variable. On a bad value, returns false and sets `error` to one
// line naming the variable, the value and what is allowed.
bool parse_config(EnvLookup env, Config& out, std::string& error);

// "80Gi", "512M", "1048576" -> bytes. Returns false on anything else.
bool parse_byte_size(const std::string& text, uint64_t& bytes);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes. Returns false on a bad form.
bool parse_uuid(const std::string& text, const char* prefix, uint8_t out[16]);
std::string format_uuid(const char* prefix, const uint8_t uuid[16]);

// CUDA_VISIBLE_DEVICES -> the device-list index (NVML index) behind each CUDA ordinal, in
// ordinal order. `value` nullptr (unset) keeps every device in order. Otherwise a comma
// list of indexes, full UUIDs or unique UUID prefixes ("GPU-5175", "MIG-..."); as the
// real driver does, the list ends at the first entry that is invalid, ambiguous or a
// repeat, so "" or "-1" leave no device. `uuids` holds each device's uuid_text.
std::vector<int> parse_visible_devices(const char* value, const std::vector<std::string>& uuids);

}  // namespace quanta::simgpu
