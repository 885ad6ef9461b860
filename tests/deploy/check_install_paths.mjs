// The paths the manifests and the installer use agree with the CDI spec quanta-hook emits.
// Until build/bin/quanta-hook exists the spec's side is the documented install contract
// (kContract below, the same table as docs/operator-guide.md); once it exists, the real
// `quanta-hook cdi generate` output is the judge and every difference fails.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import YAML from "yaml";
import { Report, assemble, buildDir, podSpec, root, run } from "./lib.mjs";

const kContract = {
  prefix: "/opt/quanta",
  files: ["bin/quanta-hook", "lib/libquanta.so", "etc/node.conf", "etc/ld.so.preload"],
  tenantSocket: "/run/quanta/tenant.sock",
  adminSocket: "/run/quanta/admin.sock",
  nodeConfig: "/etc/quanta/quanta.toml",
  cdiDirs: ["/etc/cdi", "/var/run/cdi"],
  kind: "quanta.dev/gpu",
};
const report = new Report("install paths");
const { objects } = assemble(path.join(root, "deploy"));
const ds = objects.find((o) => o.object.kind === "DaemonSet").object;
const spec = podSpec(ds);
const init = spec.initContainers.find((c) => c.name === "install");
const arbiter = spec.containers.find((c) => c.name === "arbiter");
const arg = (c, name) => [...(c.command ?? []), ...(c.args ?? [])].find((a) => a.startsWith(`--${name}=`))?.split("=")[1];
const hostPathOf = (c, mountPath) => {
  const m = (c.volumeMounts ?? []).find((v) => v.mountPath === mountPath);
  return spec.volumes.find((v) => v.name === m?.name)?.hostPath?.path;
};
const toml = objects.find((o) => o.object.metadata.name === "quanta-node-config").object.data["quanta.toml"];
const tomlValue = (key) => (toml.match(new RegExp(`^\\s*${key}\\s*=\\s*"([^"]*)"`, "m")) ?? [])[1];

// The init container installs at the contract's paths, with the host directory mounted at
// the same path (so the spec it writes names host paths).
report.check(arg(init, "prefix") === kContract.prefix, `the installer's --prefix is ${kContract.prefix}`);
report.check(hostPathOf(init, kContract.prefix) === kContract.prefix, `host ${kContract.prefix} is mounted at ${kContract.prefix} in the init container`);
report.check(kContract.cdiDirs.includes(arg(init, "cdi-dir")), `the CDI spec goes to ${arg(init, "cdi-dir")}, a directory runtimes read`);
report.check(hostPathOf(init, arg(init, "cdi-dir")) === arg(init, "cdi-dir"), "the CDI directory is the host's, at the same path");
report.check(arg(init, "config") === kContract.nodeConfig, `quanta-hook's node config is ${kContract.nodeConfig}`);
report.check(hostPathOf(init, path.dirname(kContract.nodeConfig)) === path.dirname(kContract.nodeConfig), "the node config's directory is the host's");
report.check(arg(init, "socket") === kContract.tenantSocket, `the spec mounts the tenant socket ${kContract.tenantSocket}`);
report.check(tomlValue("tenant_socket") === kContract.tenantSocket, "the arbiter serves the tenant socket there");
report.check(tomlValue("admin_socket") === kContract.adminSocket, `the arbiter serves the admin socket at ${kContract.adminSocket}`);
report.check(hostPathOf(arbiter, path.dirname(kContract.tenantSocket)) === path.dirname(kContract.tenantSocket), "the sockets' directory is the host's");

// The installer provides every contract file.
const installer = fs.readFileSync(path.join(root, "deploy/image/quanta-install-host"), "utf8");
for (const f of kContract.files) {
  const provided = installer.includes(`"$prefix/${f}"`);
  if (f === "etc/node.conf" && !provided) {
    console.log(`NOTE: ${kContract.prefix}/${f} is left to quanta-hook (the installer fails if the spec mounts a file nobody wrote)`);
    continue;
  }
  report.check(provided, `the installer writes ${kContract.prefix}/${f}`);
}

// The real generator, once it is built.
const hook = path.join(buildDir(), "bin/quanta-hook");
let mode = "documented contract (no build/bin/quanta-hook yet)";
if (fs.existsSync(hook)) {
  mode = "quanta-hook cdi generate";
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "quanta-cdi-"));
  const out = path.join(dir, "quanta.json");
  const env = { ...process.env, LD_LIBRARY_PATH: path.join(buildDir(), "sim"), SIMGPU_STATE: `quanta-cdi-${process.pid}` };
  const r = run(hook, ["cdi", "generate", "--prefix", kContract.prefix, "--socket", kContract.tenantSocket,
    "--config", kContract.nodeConfig, "--output", out, "--format", "json"], { env });
  fs.rmSync(`/dev/shm/${env.SIMGPU_STATE}`, { force: true });
  if (report.check(r.code === 0 && fs.existsSync(out), `quanta-hook cdi generate succeeds${r.code ? ": " + r.err.trim() : ""}`)) {
    const cdi = JSON.parse(fs.readFileSync(out, "utf8"));
    report.check(cdi.kind === kContract.kind, `the spec's kind is ${kContract.kind} (got ${cdi.kind})`);
    const edits = [cdi.containerEdits ?? {}, ...(cdi.devices ?? []).map((d) => d.containerEdits ?? {})];
    const mounts = edits.flatMap((e) => e.mounts ?? []);
    const hooks = edits.flatMap((e) => e.hooks ?? []);
    const hostPaths = new Set([...mounts.map((m) => m.hostPath), ...hooks.map((h) => h.path)]);
    for (const p of hostPaths) {
      if (!p.startsWith(kContract.prefix + "/")) continue;
      const f = p.slice(kContract.prefix.length + 1);
      report.check(kContract.files.includes(f), `the spec's ${p} is a file of the install contract`);
    }
    for (const f of kContract.files) {
      report.check(hostPaths.has(`${kContract.prefix}/${f}`) || f === "bin/quanta-hook" && hooks.length === 0,
        `the spec uses ${kContract.prefix}/${f}`);
    }
    report.check(mounts.some((m) => m.hostPath === kContract.tenantSocket), `the spec mounts ${kContract.tenantSocket}`);
    report.check(mounts.some((m) => m.hostPath === `${kContract.prefix}/etc/ld.so.preload` && m.containerPath === "/etc/ld.so.preload"),
      "ld.so.preload is bound over /etc/ld.so.preload");
    const lib = mounts.find((m) => m.hostPath === `${kContract.prefix}/lib/libquanta.so`);
    report.check(lib?.containerPath === lib?.hostPath,
      `libquanta.so is mounted at the path ld.so.preload names (${lib?.containerPath})`);
    report.check(hooks.every((h) => h.path === `${kContract.prefix}/bin/quanta-hook`), "every hook runs the installed quanta-hook");
  }
  fs.rmSync(dir, { recursive: true, force: true });
}
report.finish(mode);
