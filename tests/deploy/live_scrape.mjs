// Every metric the rules and the dashboard use, scraped live: an arbiter on simgpu with
// `[metrics] listen` set, two pods of quanta-tenant processes under libquanta.so contending
// for the GPU (one capped), then GET /metrics. Each used family must be served with the type
// docs/metrics.md gives it. An empty or failing scrape is a failure.
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { Report, buildDir, simNode, catalogue, familyOf, kExternalMetrics, labelsUsedByRulesAndDashboard,
  metricsUsedByRulesAndDashboard } from "./lib.mjs";

const report = new Report("live scrape");
const build = buildDir();
const bin = (p) => path.join(build, p);
for (const f of ["bin/quanta-arbiter", "bin/quanta-tenant", "lib/libquanta.so", "sim/libnvidia-ml.so.1"]) {
  if (!report.check(fs.existsSync(bin(f)), `${bin(f)} is built`)) report.finish();
}
const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
});
const port = await freePort();
const node = simNode("scrape", { build, tables: `[metrics]
listen = "127.0.0.1:${port}"
[pod."scrape-capped"]
weight = 1
memory_limit = "1Gi"
[pod."scrape-heavy"]
weight = 3
` });
const { dir, start, cleanup } = node;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const get = () => new Promise((resolve) => {
  const req = http.get({ host: "127.0.0.1", port, path: "/metrics", timeout: 3000 }, (res) => {
    let body = "";
    res.on("data", (d) => (body += d));
    res.on("end", () => resolve({ status: res.statusCode, body }));
  });
  req.on("error", (e) => resolve({ status: 0, body: "", error: e.message }));
  req.on("timeout", () => req.destroy(new Error("timed out")));
});

try {
  const arbiter = start([bin("bin/quanta-arbiter"), "--foreground", "--config", path.join(dir, "quanta.toml")], {}, "arbiter");
  let first;
  for (let i = 0; i < 100 && !(first = await get()).status; i++) await sleep(100);
  if (!report.check(first.status === 200 && first.body.length > 0,
    `GET http://127.0.0.1:${port}/metrics answers with metrics (status ${first.status}${first.error ? ", " + first.error : ""}); arbiter log:\n${arbiter.log}`)) {
    cleanup();
    report.finish();
  }
  const tenant = (pod, extra = []) => start([bin("bin/quanta-tenant"), "--json", "batch", "--seconds", "12", "--kernel-ms", "2",
    "--depth", "2", ...extra], { LD_PRELOAD: bin("lib/libquanta.so"), QUANTA_POD: pod }, pod);
  const batch = [tenant("scrape-capped"), tenant("scrape-heavy")];
  // The allocator starts once both batch tenants hold a context and have been granted the
  // GPU: started beside them, it could fill the capped pod's ledger before the capped batch
  // tenant's context is charged, and that tenant would exit with CUDA_ERROR_OUT_OF_MEMORY.
  const grants = (body, pod) => {
    let n = 0;
    for (const m of body.matchAll(new RegExp(`^quanta_pod_grants_total\\{[^}]*pod="${pod}"[^}]*\\} (\\S+)$`, "gm")))
      n += Number(m[1]);
    return n;
  };
  let granted = false;
  for (let i = 0; i < 100 && !granted; i++) {
    await sleep(100);
    const body = (await get()).body;
    granted = grants(body, "scrape-capped") > 0 && grants(body, "scrape-heavy") > 0;
  }
  report.check(granted, "both batch pods are granted the GPU within 10 s");
  const alloc = start([bin("bin/quanta-tenant"), "--json", "alloc", "--bytes", "512Mi", "--count", "4", "--hold-ms", "4000"],
    { LD_PRELOAD: bin("lib/libquanta.so"), QUANTA_POD: "scrape-capped" }, "alloc");
  await sleep(3000);  // contention: waits, switches, a denial at the cap
  for (const c of batch)
    report.check(c.exitCode === null, `the ${c.name} batch tenant still runs at the scrape; its output:\n${c.log}`);

  const scrape = await get();
  report.check(scrape.status === 200, `the scrape under load answers 200 (got ${scrape.status})`);
  const types = new Map();
  const samples = new Set();
  for (const line of scrape.body.split("\n")) {
    const t = line.match(/^# TYPE (\S+) (\S+)/);
    if (t) types.set(t[1], t[2]);
    const s = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/);
    if (s && !line.startsWith("#")) samples.add(s[1]);
  }
  report.check(types.size > 0, `the scrape declares metric families (${types.size})`);
  const cat = catalogue();
  for (const [name, where] of metricsUsedByRulesAndDashboard()) {
    if (kExternalMetrics.has(name)) continue;
    const family = familyOf(name, cat) ?? name;
    const served = types.get(family);
    report.check(served !== undefined, `${family} (used by ${where[0]}${where.length > 1 ? " and " + (where.length - 1) + " more" : ""}) is served`);
    if (served !== undefined) report.check(served === cat.get(family)?.type, `${family} is served as ${served}, the catalogue says ${cat.get(family)?.type}`);
  }
  report.check([...samples].some((s) => s.startsWith("quanta_pod_")), "pod series are present while tenants run");
  // Every label the rules and the dashboard group, match or template by is on some served
  // series, or is added by the scrape (the PodMonitor's node and arbiter_pod, job, instance).
  const served = new Set();
  for (const line of scrape.body.split("\n")) {
    if (line.startsWith("#")) continue;
    const braces = line.match(/^[^{\s]+\{(.*)\}\s/);
    if (braces) for (const m of braces[1].matchAll(/([A-Za-z_]\w*)="/g)) served.add(m[1]);
  }
  const kScrapeLabels = new Set(["node", "arbiter_pod", "job", "instance", "le"]);
  for (const label of labelsUsedByRulesAndDashboard()) {
    if (kScrapeLabels.has(label)) continue;
    report.check(served.has(label), `label ${label}, which the rules or the dashboard use, is on served series`);
  }
  void alloc;
} finally {
  cleanup();
}
report.finish();
