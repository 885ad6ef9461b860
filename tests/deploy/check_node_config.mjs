// The node config the DaemonSet ships (the quanta-node-config ConfigMap's quanta.toml)
// loads in the real parser: `quanta-arbiter --check-config` must accept it, serve metrics
// (the probes depend on it) and use the socket and state paths the manifests mount.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Report, assemble, buildDir, podSpec, root, run } from "./lib.mjs";

const report = new Report("node config");
const arbiter = path.join(buildDir(), "bin/quanta-arbiter");
if (!report.check(fs.existsSync(arbiter), `${arbiter} is built`)) report.finish();
const { objects } = assemble(path.join(root, "deploy"));
const cm = objects.find((o) => o.object.kind === "ConfigMap" && o.object.metadata.name === "quanta-node-config")?.object;
const toml = cm?.data?.["quanta.toml"];
if (!report.check(typeof toml === "string", "the ConfigMap holds quanta.toml")) report.finish();

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "quanta-node-config-"));
const file = path.join(dir, "quanta.toml");
fs.writeFileSync(file, toml);
const r = run(arbiter, ["--check-config", "--config", file]);
fs.rmSync(dir, { recursive: true, force: true });
report.check(r.code === 0, `quanta-arbiter --check-config accepts it: ${(r.out + r.err).trim()}`);
report.check(r.out.trim().split("\n").length === 1, "--check-config prints one line");
report.check(/metrics on 0\.0\.0\.0:\d+/.test(r.out), "it serves metrics on every address of the pod");

// The paths it names are where the DaemonSet mounts the host directories.
const ds = objects.find((o) => o.object.kind === "DaemonSet")?.object;
const arb = podSpec(ds).containers.find((c) => c.name === "arbiter");
const mounts = (arb.volumeMounts ?? []).map((m) => m.mountPath);
for (const key of ["tenant_socket", "admin_socket", "state_dir"]) {
  const value = (toml.match(new RegExp(`^\\s*${key}\\s*=\\s*"([^"]*)"`, "m")) ?? [])[1];
  report.check(value && mounts.some((m) => value === m || value.startsWith(m + "/")),
    `[node] ${key} = ${value} lies in a host directory the arbiter container mounts`);
}
report.finish();
