// quanta-hook's entry point: the command line, and one error line on failure. What each
// command does is in commands.cpp and the files it names.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "hooks/commands.h"
#include "hooks/error.h"
#include "common/version.h"

int main(int argc, char** argv) {
  using namespace quanta::hooks;
  CLI::App app{"quanta-hook: brings Quanta into GPU containers (CDI spec, hooks.d files, "
               "OCI hook stages); see docs/containers.md"};
  app.set_version_flag("--version", quanta::common::version_line("quanta-hook"));
  app.require_subcommand(1);
  auto common = [](CLI::App* cmd, CommonArgs* c) {
    cmd->add_option("--config", c->config, "node config (default /etc/quanta/quanta.toml)");
    cmd->add_option("--prefix", c->prefix, "install prefix on the host (default /opt/quanta)");
    cmd->add_option("--socket", c->socket,
                    "the arbiter's tenant socket on the host (default: the config's [node] "
                    "tenant_socket)");
  };

  CLI::App* cdi = app.add_subcommand("cdi", "CDI specs")->require_subcommand(1);
  CLI::App* cdi_gen = cdi->add_subcommand(
      "generate", "write Quanta's CDI spec (kind quanta.dev/gpu), or with --take-over a copy of "
                  "a vendor's spec carrying Quanta's edits, plus <prefix>/etc/node.conf and "
                  "ld.so.preload");
  CdiGenerateArgs c;
  common(cdi_gen, &c.common);
  cdi_gen->add_option("--output", c.output,
                      "spec file, or - for stdout (default /var/run/cdi/quanta.yaml; with "
                      "--take-over /var/run/cdi/quanta-<vendor>_<class>.yaml)");
  cdi_gen->add_option("--format", c.format, "yaml or json (default: the output's extension)");
  cdi_gen->add_option("--take-over", c.take_over,
                      "a vendor's CDI spec (NVIDIA's) whose device names the output takes over");
  cdi_gen->add_option("--spec-dirs", c.spec_dirs,
                      "the runtime's CDI folders, lowest priority first (default "
                      "/etc/cdi,/var/run/cdi)");
  cdi_gen->add_flag("--spec-only", c.spec_only, "write the spec only, not the node files");

  CLI::App* hooksd = app.add_subcommand("hooksd", "OCI hooks.d files (CRI-O, podman)")
                         ->require_subcommand(1);
  CLI::App* hooksd_gen =
      hooksd->add_subcommand("generate", "write one hooks.d file per hook stage, plus the node files");
  HooksdGenerateArgs h;
  common(hooksd_gen, &h.common);
  hooksd_gen->add_option("--output", h.output,
                         "folder, or - for stdout (default /etc/containers/oci/hooks.d); the node "
                         "files go under --prefix whatever the output (--spec-only: not at all)");
  hooksd_gen->add_option("--format", h.format, "json (hooks.d reads JSON only)");
  hooksd_gen->add_flag("--spec-only", h.spec_only, "write the hooks.d files only, not the node files");

  CLI::App* oci =
      app.add_subcommand("oci", "OCI hook stages, run by the container runtime (state on stdin)")
          ->require_subcommand(1);
  CommonArgs s;
  std::vector<std::pair<CLI::App*, std::string>> stages;
  for (const char* name : {"create-runtime", "create-container", "poststop"}) {
    CLI::App* stage = oci->add_subcommand(name, std::string("the ") + name + " stage");
    common(stage, &s);
    stages.emplace_back(stage, name);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // a usage error exits 2, as other tools' do
  }
  try {
    if (cdi_gen->parsed()) {
      c.common.config_given = cdi_gen->count("--config") > 0;
      cdi_generate(c);
    } else if (hooksd_gen->parsed()) {
      h.common.config_given = hooksd_gen->count("--config") > 0;
      hooksd_generate(h);
    } else {
      for (const auto& [stage, name] : stages) {
        if (!stage->parsed()) continue;
        s.config_given = stage->count("--config") > 0;
        run_stage(name, s);
      }
    }
  } catch (const HookError& e) {
    std::fprintf(stderr, "quanta-hook: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    // Every layer rethrows as HookError; this is the last guard, still one line.
    std::fprintf(stderr, "quanta-hook: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
