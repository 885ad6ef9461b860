// Quanta's CDI specs. Two forms:
//  - kind quanta.dev/gpu: a device per GPU index, UUID, MIG instance ("0:1" and its UUID) and
//    `all`, each standing for "Quanta on that GPU"; requested beside the GPU itself.
//  - the take-over form: a copy of a vendor's spec (NVIDIA's nvidia.com/gpu) under the same
//    kind and device names, each device with the vendor's own edits plus Quanta's, written
//    to a CDI folder of higher priority so runtimes resolve the vendor's names to it and
//    pods get Quanta with nothing added but their policy annotations.
// Both carry the same Quanta edits: the read-only mounts of layout.h and the quanta-hook
// stages (createRuntime registers, createContainer mounts container.conf, poststop
// unregisters). docs/containers.md explains the choice and its limits.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hooks/device_table.h"
#include "hooks/layout.h"

namespace quanta::hooks {

struct CdiOptions {
  Layout layout;
  uint64_t hook_timeout_ns = 5'000'000'000;
};

// The spec-level edits Quanta adds to every container that gets one of its devices.
nlohmann::json quanta_container_edits(const CdiOptions& options);

// kind quanta.dev/gpu, devices named as `table` names the node's GPUs.
nlohmann::json quanta_gpu_spec(const CdiOptions& options, const DeviceTable& table);

// The take-over form of `vendor` (a parsed CDI spec). `table` resolves the vendor's device
// names to UUIDs for the QUANTA_DEVICE_* markers; names it does not know get none (the hook
// then relies on the device nodes). Throws HookError when `vendor` is not a CDI spec.
nlohmann::json take_over_spec(const CdiOptions& options, const nlohmann::json& vendor,
                              const DeviceTable& table);

// The lowest cdiVersion whose schema has every field the spec uses, by the rules of the
// CDI reference library (pkg/cdi/version.go); never below `floor`.
std::string minimum_cdi_version(const nlohmann::json& spec, const std::string& floor = "0.3.0");

// The hooks of the Quanta edits, as OCI hook objects (path, args, env, timeout) per stage;
// hooks.d generation uses the same ones.
struct HookCommand {
  std::string stage;  // createRuntime, createContainer or poststop
  std::vector<std::string> args;
};
std::vector<HookCommand> quanta_hook_commands(const Layout& layout);
int hook_timeout_seconds(uint64_t hook_timeout_ns);

}  // namespace quanta::hooks
