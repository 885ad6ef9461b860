// quanta-hook's commands, as main's command line hands them over. Each throws HookError
// with one line; main prints it.
#pragma once

#include <string>
#include <vector>

namespace quanta::hooks {

struct CommonArgs {
  std::string config = "/etc/quanta/quanta.toml";
  bool config_given = false;  // a missing default config means built-in defaults
  std::string prefix = "/opt/quanta";
  std::string socket;  // default: the config's [node] tenant_socket
};

struct CdiGenerateArgs {
  CommonArgs common;
  std::string output;  // "" = the default under /var/run/cdi; "-" = stdout
  std::string format;  // "" = from the output's extension, else yaml
  std::string take_over;
  std::string spec_dirs = "/etc/cdi,/var/run/cdi";
  bool spec_only = false;
};

struct HooksdGenerateArgs {
  CommonArgs common;
  std::string output = "/etc/containers/oci/hooks.d";
  std::string format = "json";
  bool spec_only = false;
};

void cdi_generate(const CdiGenerateArgs& args);
void hooksd_generate(const HooksdGenerateArgs& args);
// stage: create-runtime, create-container or poststop; the OCI state comes on stdin.
void run_stage(const std::string& stage, const CommonArgs& args);

// The take-over only works from a CDI folder of higher priority than the vendor's: in the
// same folder the two specs' device names conflict and CDI drops both, in a lower one the
// vendor's win. `dirs` is the runtime's list, lowest priority first.
void check_take_over_priority(const std::string& vendor_spec, const std::string& output,
                              const std::string& dirs);

}  // namespace quanta::hooks
