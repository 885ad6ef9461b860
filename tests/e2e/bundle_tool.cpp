// quanta-e2e-bundle: the e2e harness's image and bundle builders and its share arithmetic
// as a command, for scripts/demo-containers.sh (the same code the e2e tests run).
//   quanta-e2e-bundle rootfs DIR
//   quanta-e2e-bundle vendor-spec --sim-state S --sim-log L --uuid U --output FILE
//   quanta-e2e-bundle bundle --rootfs R --id ID --pod NS/NAME [--annotation K=V]... [--env K=V]...
//                            --edits SPEC=DEV[,DEV]... --output DIR -- ARGS...
//   quanta-e2e-bundle shares --sim-log L [--trim-ms N] PID...
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/e2e/containers.h"

int main(int argc, char** argv) {
  using namespace quanta::e2e;
  using nlohmann::json;
  CLI::App app{"quanta-e2e-bundle: images and OCI bundles with CDI edits applied, on simgpu"};
  app.require_subcommand(1);

  std::string rootfs_dir;
  CLI::App* rootfs = app.add_subcommand("rootfs", "assemble an image without libstdc++ under DIR/rootfs");
  rootfs->add_option("DIR", rootfs_dir)->required();

  std::string sim_state, sim_log, uuid, vendor_output, kind = "nvidia.com/gpu";
  CLI::App* vendor = app.add_subcommand("vendor-spec", "write the stand-in for NVIDIA's CDI spec (simgpu)");
  vendor->add_option("--sim-state", sim_state)->required();
  vendor->add_option("--sim-log", sim_log);
  vendor->add_option("--uuid", uuid)->required();
  vendor->add_option("--kind", kind);
  vendor->add_option("--output", vendor_output)->required();

  ContainerSpec c;
  std::string root, pod, output;
  std::vector<std::string> annotations, edits;
  CLI::App* bundle = app.add_subcommand("bundle", "write DIR/config.json for a container");
  bundle->add_option("--rootfs", root)->required();
  bundle->add_option("--id", c.id)->required();
  bundle->add_option("--pod", pod, "NAMESPACE/NAME, written as containerd's annotations");
  bundle->add_option("--annotation", annotations, "K=V (repeatable)")->allow_extra_args(false);
  bundle->add_option("--env", c.env, "K=V in the container's environment (repeatable)")->allow_extra_args(false);
  bundle->add_option("--edits", edits, "SPEC_FILE=DEVICE[,DEVICE] (repeatable, in order)")->allow_extra_args(false);
  bundle->add_option("--output", output)->required();
  // One value per repeated option, so `--annotation K=V -- ARGS` ends at the `--`.
  bundle->add_option("ARGS", c.args)->required();

  std::string shares_log;
  std::vector<pid_t> share_pids;
  unsigned trim_ms = 300;
  CLI::App* shares = app.add_subcommand(
      "shares", "each pid's busy time on GPU 0 in simgpu's execution log while all of them ran (JSON)");
  shares->add_option("--sim-log", shares_log)->required();
  shares->add_option("--trim-ms", trim_ms, "left out at both ends of the common window (300)");
  shares->add_option("PID", share_pids)->required();

  CLI11_PARSE(app, argc, argv);
  try {
    if (rootfs->parsed()) {
      std::printf("%s\n", assemble_rootfs(rootfs_dir).c_str());
    } else if (shares->parsed()) {
      const Shares s = shares_from_log(shares_log, share_pids, trim_ms * 1000000ull);
      if (!s.ok) throw std::runtime_error(s.why);
      json busy = json::object();
      for (const auto& [pid, ns] : s.busy_ns) busy[std::to_string(pid)] = ns;
      std::printf("%s\n", json{{"from_ns", s.from_ns}, {"to_ns", s.to_ns}, {"busy_ns", busy}}.dump().c_str());
    } else if (vendor->parsed()) {
      std::ofstream(vendor_output) << vendor_spec(sim_state, sim_log, uuid, kind, false).dump(2) << "\n";
    } else {
      for (const std::string& a : annotations) {
        const size_t eq = a.find('=');
        if (eq == std::string::npos) throw std::runtime_error("--annotation " + a + " is not K=V");
        c.annotations[a.substr(0, eq)] = a.substr(eq + 1);
      }
      if (!pod.empty()) {
        const size_t slash = pod.find('/');
        c.pod_namespace = slash == std::string::npos ? "default" : pod.substr(0, slash);
        c.pod = slash == std::string::npos ? pod : pod.substr(slash + 1);
      }
      json config = base_config(c, root);
      for (const std::string& e : edits) {
        const size_t eq = e.find('=');
        if (eq == std::string::npos) throw std::runtime_error("--edits " + e + " is not SPEC=DEVICES");
        json spec = json::parse(read_file(e.substr(0, eq)));
        std::vector<std::string> devices;
        std::string list = e.substr(eq + 1);
        for (size_t start = 0; start <= list.size();) {
          size_t end = list.find(',', start);
          if (end == std::string::npos) end = list.size();
          if (end > start) devices.push_back(list.substr(start, end - start));
          start = end + 1;
        }
        apply_cdi(&config, spec, devices);
      }
      std::filesystem::create_directories(output);
      std::ofstream(output + "/config.json") << config.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quanta-e2e-bundle: %s\n", e.what());
    return 1;
  }
  return 0;
}
