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
  files: ["bin/quanta-hook", "libexec/quanta-hook", "lib/libquanta.so", "etc/node.conf", "etc/ld.so.preload"],
  tenantSocket: "/run/quanta/tenant.sock",
  adminSocket: "/run/quanta-admin/admin.sock",
  nodeConfig: "/etc/quanta/quanta.toml",
  // The runtime's CDI folders, lowest priority first: its defaults and, last, the folder the
  // take-overs of specs in /var/run/cdi go to.
  cdiDirs: ["/etc/cdi", "/var/run/cdi", "/var/run/cdi-quanta"],
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
report.check(hostPathOf(arbiter, path.dirname(kContract.tenantSocket)) === path.dirname(kContract.tenantSocket), "the tenant socket's directory is the host's");
report.check(hostPathOf(arbiter, path.dirname(kContract.adminSocket)) === path.dirname(kContract.adminSocket), "the admin socket's directory is the host's");
report.check(path.dirname(kContract.adminSocket) !== path.dirname(kContract.tenantSocket) &&
  !kContract.adminSocket.startsWith(path.dirname(kContract.tenantSocket) + "/"),
  "the admin socket is not in the tenant socket's folder, which every GPU container mounts");

// The installer and cdi-sync are told the runtime's CDI folders as deploy/containerd and
// deploy/crio configure them, and see each at the host's path; every folder but the lowest
// (where no take-over goes) is writable for the take-overs.
const sync = spec.containers.find((c) => c.name === "cdi-sync");
const runtimeDirs = (file) => {
  const text = fs.readFileSync(path.join(root, file), "utf8");
  const m = text.match(/^\s*cdi_spec_dirs\s*=\s*\[([^\]]*)\]/m);
  return m ? [...m[1].matchAll(/"([^"]*)"/g)].map((x) => x[1]) : [];
};
const expected = kContract.cdiDirs.join(",");
for (const [what, dirs] of [["containerd's", runtimeDirs("deploy/containerd/quanta-pod-annotations.toml")],
  ["CRI-O's", runtimeDirs("deploy/crio/50-quanta-cdi.conf")]]) {
  report.check(dirs.join(",") === expected, `${what} cdi_spec_dirs are ${expected} (got ${dirs.join(",")})`);
}
for (const c of [init, sync]) {
  report.check(c !== undefined && arg(c, "spec-dirs") === expected, `${c?.name ?? "cdi-sync"}'s --spec-dirs is ${expected} (got ${c && arg(c, "spec-dirs")})`);
  if (!c) continue;
  kContract.cdiDirs.forEach((d, i) => {
    report.check(hostPathOf(c, d) === d, `host ${d} is mounted at ${d} in ${c.name}`);
    const m = (c.volumeMounts ?? []).find((v) => v.mountPath === d);
    if (i > 0) report.check(m !== undefined && !m.readOnly, `${d} is writable in ${c.name} (take-overs go there)`);
  });
}

// The installer provides the payload; quanta-hook writes <prefix>/etc itself.
const installer = fs.readFileSync(path.join(root, "deploy/image/quanta-install-host"), "utf8");
for (const f of kContract.files) {
  if (f.startsWith("etc/")) {
    report.check(!installer.includes(`"$prefix/${f}"`), `${kContract.prefix}/${f} is left to quanta-hook cdi generate, which writes it`);
    continue;
  }
  report.check(installer.includes(`"$prefix/${f}"`), `the installer writes ${kContract.prefix}/${f}`);
}

// The real generator, once it is built: the spec it writes for the DaemonSet's paths, and
// a generation into a scratch prefix after which every host path it mounts must exist.
const hook = path.join(buildDir(), "bin/quanta-hook");
let mode = "documented contract (no build/bin/quanta-hook yet)";
if (fs.existsSync(hook)) {
  mode = "quanta-hook cdi generate";
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "quanta-cdi-"));
  const config = path.join(dir, "quanta.toml");
  fs.writeFileSync(config, toml);
  const env = { ...process.env, LD_LIBRARY_PATH: path.join(buildDir(), "sim"), SIMGPU_STATE: `quanta-cdi-${process.pid}` };
  const generate = (prefix, output, extra = []) => run(hook, ["cdi", "generate", "--prefix", prefix,
    "--socket", kContract.tenantSocket, "--config", config, "--output", output, "--format", "json", ...extra], { env });
  const out = path.join(dir, "quanta.json");
  const r = generate(kContract.prefix, out, ["--spec-only"]);
  if (report.check(r.code === 0 && fs.existsSync(out), `quanta-hook cdi generate --spec-only succeeds${r.code ? ": " + r.err.trim() : ""}`)) {
    const cdi = JSON.parse(fs.readFileSync(out, "utf8"));
    report.check(cdi.kind === kContract.kind, `the spec's kind is ${kContract.kind} (got ${cdi.kind})`);
    const edits = [cdi.containerEdits ?? {}, ...(cdi.devices ?? []).map((d) => d.containerEdits ?? {})];
    const mounts = edits.flatMap((e) => e.mounts ?? []);
    const hooks = edits.flatMap((e) => e.hooks ?? []);
    const under = [...new Set([...mounts.map((m) => m.hostPath), ...hooks.map((h) => h.path)])]
      .filter((p) => p === kContract.prefix || p.startsWith(kContract.prefix + "/"));
    report.check(under.length > 0, `the spec uses files under ${kContract.prefix} (${under.join(", ")})`);
    const socketDir = path.dirname(kContract.tenantSocket);
    report.check(mounts.some((m) => m.hostPath === kContract.tenantSocket || m.hostPath === socketDir),
      `the spec mounts the tenant socket ${kContract.tenantSocket} (or its folder)`);
    report.check(hostPathOf(arbiter, socketDir) === socketDir, `the arbiter serves its sockets in the host's ${socketDir}`);
    report.check(mounts.some((m) => m.containerPath === "/etc/ld.so.preload" && m.hostPath.startsWith(kContract.prefix + "/")),
      "a file under the prefix is bound over /etc/ld.so.preload");
    report.check(mounts.some((m) => m.hostPath === `${kContract.prefix}/lib/libquanta.so`), "the spec mounts the installed libquanta.so");
    report.check(hooks.length > 0 && hooks.every((h) => h.path === `${kContract.prefix}/bin/quanta-hook`),
      "every hook runs the installed quanta-hook");
    for (const h of hooks) {
      report.check((h.args ?? []).includes(config) || (h.args ?? []).some((a) => a === `--config=${config}`),
        `hook ${h.hookName} reads the node config it was generated for`);
    }
  }
  // Into a scratch prefix holding what the installer installs: every path must then exist.
  const prefix = path.join(dir, "opt/quanta");
  fs.mkdirSync(path.join(prefix, "lib"), { recursive: true });
  fs.mkdirSync(path.join(prefix, "bin"), { recursive: true });
  fs.copyFileSync(path.join(buildDir(), "lib/libquanta.so"), path.join(prefix, "lib/libquanta.so"));
  fs.copyFileSync(hook, path.join(prefix, "bin/quanta-hook"));
  const out2 = path.join(dir, "scratch.json");
  const r2 = generate(prefix, out2);
  if (report.check(r2.code === 0, `quanta-hook cdi generate into a scratch prefix succeeds${r2.code ? ": " + r2.err.trim() : ""}`)) {
    const cdi = JSON.parse(fs.readFileSync(out2, "utf8"));
    const edits = [cdi.containerEdits ?? {}, ...(cdi.devices ?? []).map((d) => d.containerEdits ?? {})];
    for (const p of [...edits.flatMap((e) => e.mounts ?? []).map((m) => m.hostPath), ...edits.flatMap((e) => e.hooks ?? []).map((h) => h.path)]) {
      if (!p.startsWith(prefix)) continue;
      report.check(fs.existsSync(p), `${p.replace(prefix, kContract.prefix)}, which the spec mounts, exists after the install and generation`);
    }
  }
  fs.rmSync(`/dev/shm/${env.SIMGPU_STATE}`, { force: true });
  fs.rmSync(dir, { recursive: true, force: true });
}
report.finish(mode);
