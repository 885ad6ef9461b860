// The shipped alert rules against a live arbiter, evaluated by Debian's Prometheus server:
// an arbiter on simgpu (five GPUs) with `[metrics] listen` set, scraped every second by
// `prometheus` running deploy/monitoring/prometheusrule.yaml's groups. The rules are changed
// in one way only: every range window and `offset` is shortened to 2 s per minute and every
// `for:` to a second per minute (at most 10 s), so a run takes minutes, not hours.
//
// 1. Healthy weighted pods (4:1:1 on one GPU, 3:1 on another) run busy for half a minute:
//    no alert fires.
// 2. Each alert's condition is staged, side by side on their own GPUs, and each alert must
//    fire with the labels that name what is wrong, then resolve once the condition is gone:
//    a starved pod and a passed-over holder (a holder stopped with SIGSTOP), waits over budget
//    (kernels far longer than the quantum beside a pod of short ones), a denial at the cap in
//    a pod's first second, memory caps past the GPU, an unmanaged process, a drained GPU, a
//    refused admission.
// 3. The arbiter is killed (QuantaArbiterDown) and restarted three times
//    (QuantaArbiterRestarting).
// Every query of the Grafana dashboard must return data at some point of the run.
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { spawnSync } from "node:child_process";
import YAML from "yaml";
import { Report, buildDir, root, simNode } from "./lib.mjs";

const report = new Report("live alerts");
const build = buildDir();
const bin = (p) => path.join(build, p);
for (const f of ["bin/quanta-arbiter", "bin/quanta-tenant", "bin/quantactl", "lib/libquanta.so", "sim/libnvidia-ml.so.1"]) {
  if (!report.check(fs.existsSync(bin(f)), `${bin(f)} is built`)) report.finish();
}
if (!report.check(spawnSync("prometheus", ["--version"]).status === 0,
  "Debian's prometheus server is installed (scripts/install-deps.sh installs it)")) report.finish();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
});
const [metricsPort, promPort] = [await freePort(), await freePort()];
const node = simNode("alerts", { build, simEnv: { SIMGPU_DEVICES: "5", SIMGPU_MEMORY: "8Gi" }, nodeKeys: `nvml_interval = "500ms"
`, tables: `[scheduler]
# Long enough that a stopped holder starves its neighbour before it is passed over.
revoke_timeout = "25s"
[shim]
context_overhead = 0
[metrics]
listen = "127.0.0.1:${metricsPort}"
[pod."healthy-a"]
weight = 4
[pod."healthy-b"]
weight = 1
[pod."healthy-c"]
weight = 1
[pod."ratio-big"]
weight = 3
[pod."ratio-small"]
weight = 1
[pod."early-capped"]
memory_limit = "1Gi"
[pod."caps-a"]
memory_limit = "6Gi"
[pod."caps-b"]
memory_limit = "6Gi"
` });
const { dir, env, children, start, cleanup } = node;
const kNode = "alerts-node";
const kArbiterPod = "quanta-arbiter-alerts";
const log = (what) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${what}`);
const t0 = Date.now();

// --- the rules, windows and `for:` shortened -------------------------------------------
const minutes = (n, unit) => Number(n) * ({ s: 1 / 60, m: 1, h: 60 }[unit]);
const shortenWindow = (n, unit) => `${Math.max(2, Math.round(minutes(n, unit) * 2))}s`;
const shortenFor = (text) => {
  const m = /^(\d+)([smh])$/.exec(text);
  return `${Math.min(10, Math.max(1, Math.round(minutes(m[1], m[2]))))}s`;
};
const rule = YAML.parse(fs.readFileSync(path.join(root, "deploy/monitoring/prometheusrule.yaml"), "utf8"));
const groups = rule.spec.groups.map((g) => ({
  ...g,
  rules: g.rules.map((r) => ({
    ...r,
    expr: r.expr
      .replace(/\[(\d+)([smh])\]/g, (_, n, u) => `[${shortenWindow(n, u)}]`)
      .replace(/offset (\d+)([smh])/g, (_, n, u) => `offset ${shortenWindow(n, u)}`),
    ...(r.for ? { for: shortenFor(r.for) } : {}),
  })),
}));
fs.writeFileSync(path.join(dir, "rules.yaml"), YAML.stringify({ groups }));
fs.writeFileSync(path.join(dir, "prometheus.yml"), YAML.stringify({
  global: { scrape_interval: "1s", evaluation_interval: "1s", scrape_timeout: "900ms" },
  rule_files: [path.join(dir, "rules.yaml")],
  // The labels the PodMonitor's relabeling gives every arbiter target.
  scrape_configs: [{
    job_name: "quanta-arbiter",
    static_configs: [{ targets: [`127.0.0.1:${metricsPort}`], labels: { node: kNode, arbiter_pod: kArbiterPod } }],
  }],
}));

const stop = async (c, signal = "SIGTERM") => {
  if (c.exitCode === null && c.signalCode === null) {
    c.kill("SIGCONT");
    c.kill(signal);
  }
  await c.exited;
};
process.on("exit", cleanup);
const bail = (what) => {
  report.fail(what);
  for (const c of children) if (c.log) console.log(`--- ${c.name} (last output):\n${c.log.slice(-3000)}`);
  report.finish();
};

const get = (port, urlPath) => new Promise((resolve) => {
  const req = http.get({ host: "127.0.0.1", port, path: urlPath, timeout: 5000 }, (res) => {
    let body = "";
    res.on("data", (d) => (body += d));
    res.on("end", () => resolve({ status: res.statusCode, body }));
  });
  req.on("error", (e) => resolve({ status: 0, body: "", error: e.message }));
  req.on("timeout", () => req.destroy(new Error("timed out")));
});
const promQuery = async (expr) => {
  const r = await get(promPort, `/api/v1/query?query=${encodeURIComponent(expr)}`);
  if (r.status !== 200) return { error: `status ${r.status} ${r.body.slice(0, 300)}` };
  return { result: JSON.parse(r.body).data.result };
};
const quantactl = (...args) => {
  const r = spawnSync(bin("bin/quantactl"), ["--admin-socket", path.join(dir, "admin.sock"), ...args],
    { env, encoding: "utf8", timeout: 15000 });
  return { status: r.status, out: r.stdout, err: r.stderr };
};

let arbiter;
const startArbiter = async () => {
  arbiter = start([bin("bin/quanta-arbiter"), "--foreground", "--config", path.join(dir, "quanta.toml")], {}, "arbiter");
  for (let i = 0; i < 150; i++) {
    if ((await get(metricsPort, "/metrics")).status === 200) return;
    await sleep(100);
  }
  bail(`the arbiter serves /metrics on 127.0.0.1:${metricsPort}`);
};
await startArbiter();
const prometheus = start(["prometheus", `--config.file=${path.join(dir, "prometheus.yml")}`,
  `--storage.tsdb.path=${path.join(dir, "tsdb")}`, `--web.listen-address=127.0.0.1:${promPort}`,
  "--log.level=warn"], {}, "prometheus");
for (let i = 0; ; i++) {
  const r = await promQuery(`up{job="quanta-arbiter"}`);
  if (r.result && r.result.length && r.result[0].value[1] === "1") break;
  if (i > 300 || prometheus.exitCode !== null) bail("Prometheus scrapes the arbiter (up == 1)");
  await sleep(100);
}
const uuids = new Map();
for (const s of (await promQuery("quanta_gpu_info")).result) uuids.set(s.metric.gpu, s.metric.UUID);
if (!report.check(uuids.size === 5, `the arbiter manages simgpu's 5 GPUs (got ${[...uuids.keys()]})`)) bail("no GPUs");
log(`arbiter and Prometheus up; rules shortened into ${path.join(dir, "rules.yaml")}`);

// --- what Prometheus says -------------------------------------------------------------------
let alerts = [];
let polling = true;
const everFiring = [];
const poller = (async () => {
  while (polling) {
    const r = await get(promPort, "/api/v1/alerts");
    if (r.status === 200) {
      alerts = JSON.parse(r.body).data.alerts;
      for (const a of alerts) if (a.state === "firing") everFiring.push({ at: Date.now(), ...a });
    }
    await sleep(500);
  }
})();
const matches = (a, name, labels) => a.labels.alertname === name &&
  Object.entries(labels).every(([k, v]) => a.labels[k] === v);
const describe = (a) => `${a.labels.alertname}{${Object.entries(a.labels).filter(([k]) => k !== "alertname")
  .map(([k, v]) => `${k}="${v}"`).join(",")}} ${a.state}`;
const waitFor = async (what, cond, seconds) => {
  const until = Date.now() + seconds * 1000;
  while (Date.now() < until) {
    if (cond()) return true;
    await sleep(250);
  }
  return false;
};
// Fires with these labels (and the node's), then resolves once `remove` has run.
const firesThenResolves = async (name, labels, remove, { fireWithin = 60, resolveWithin = 60 } = {}) => {
  const all = { node: kNode, ...labels };
  const fired = await waitFor(name, () => alerts.some((a) => a.state === "firing" && matches(a, name, all)), fireWithin);
  report.check(fired, `${name} fires with ${JSON.stringify(all)} within ${fireWithin} s; alerts now: ${alerts.map(describe).join("; ") || "none"}`);
  if (fired) log(`${name} fired: ${alerts.filter((a) => matches(a, name, all)).map(describe).join("; ")}`);
  await remove();
  const resolved = await waitFor(name, () => !alerts.some((a) => matches(a, name, all)), resolveWithin);
  report.check(resolved, `${name} ${JSON.stringify(all)} resolves within ${resolveWithin} s of its cause going; alerts now: ${alerts.map(describe).join("; ")}`);
  if (resolved) log(`${name} resolved`);
};

// Every dashboard query, with its variables set to "all"; each must return data once.
const dashboard = JSON.parse(fs.readFileSync(path.join(root, "deploy/monitoring/grafana/quanta.json"), "utf8"));
const queries = [];
const walk = (panels) => {
  for (const p of panels) {
    if (p.panels) walk(p.panels);
    for (const t of p.targets || []) if (t.expr) queries.push({ title: p.title, expr: t.expr, seen: false });
  }
};
walk(dashboard.panels);
const expand = (expr) => expr.replace(/\$__rate_interval/g, "10s").replace(/\$(node|gpu|namespace|pod)\b/g, ".*");
const sampleDashboard = async () => {
  for (const q of queries) {
    if (q.seen) continue;
    const r = await promQuery(expand(q.expr));
    if (r.error) q.error = r.error;
    else if (r.result.length) q.seen = true;
  }
};

// --- 1. healthy weighted pods: nothing fires ----------------------------------------------
const tenant = (pod, device, args, extra = {}) => start([bin("bin/quanta-tenant"), "--device", String(device), ...args],
  { LD_PRELOAD: bin("lib/libquanta.so"), QUANTA_POD: pod, ...extra }, pod);
const busy = (seconds, kernelMs = 2) => ["batch", "--seconds", String(seconds), "--kernel-ms", String(kernelMs), "--depth", "2"];
const healthy = [
  ...["healthy-a", "healthy-b", "healthy-c"].map((p) => tenant(p, 0, busy(45))),
  ...["ratio-big", "ratio-small"].map((p) => tenant(p, 1, busy(45))),
];
const healthyStart = Date.now();
await sleep(8000);
const watchFrom = Date.now();
while (Date.now() - healthyStart < 42000) {
  await sampleDashboard();
  await sleep(2000);
}
const falseAlarms = everFiring.filter((a) => a.at >= watchFrom);
report.check(falseAlarms.length === 0, `healthy pods with weights 4:1:1 and 3:1 fire no alert for 34 s (fired: ${
  [...new Set(falseAlarms.map(describe))].join("; ") || "none"})`);
const pending = alerts.filter((a) => a.state === "pending");
if (pending.length) log(`pending at the end of the healthy phase: ${pending.map(describe).join("; ")}`);
await Promise.all(healthy.map((c) => stop(c)));
log("healthy phase over");

// --- 2. each alert's condition ---------------------------------------------------------------
const pod = (name, gpu) => ({ namespace: "default", pod: name, gpu: String(gpu), UUID: uuids.get(String(gpu)) });
const statusJson = () => {
  const r = quantactl("status", "--json");
  try { return JSON.parse(r.out); } catch { return null; }
};
let lastStatus = "";
// The state of a tenant on a GPU as quantactl status says it (holding, revoking, ...).
const stateOf = (gpu, pid) => {
  const s = statusJson();
  const g = s && s.gpus.find((x) => x.index === gpu);
  lastStatus = g ? JSON.stringify({ holder: g.holder, tenants: g.tenants.map((t) => [t.pid, t.pod, t.state]) }) : "no status";
  const t = g && g.tenants.find((x) => x.pid === pid);
  return t ? t.state : null;
};

const stages = [
  // A holder stopped while it holds GPU 2: its neighbour waits and is starved; 25 s later
  // (revoke_timeout) the holder is passed over.
  (async () => {
    const holder = tenant("stall-holder", 2, busy(120));
    const victim = tenant("stall-victim", 2, busy(120));
    let stopped = false;
    for (let i = 0; i < 200 && !stopped; i++) {
      if (stateOf(2, holder.pid) === "holding") {
        holder.kill("SIGSTOP");
        await sleep(300);
        // Stopped with the grant: revoked at its quantum's end, it cannot release.
        if (["holding", "revoking"].includes(stateOf(2, holder.pid))) stopped = true;
        else holder.kill("SIGCONT");
      }
      if (!stopped) await sleep(50);
    }
    if (!report.check(stopped, `stall-holder (pid ${holder.pid}) was stopped while it held GPU 2; GPU 2 last: ${lastStatus}`)) return;
    log("stall-holder stopped while holding GPU 2");
    await firesThenResolves("QuantaPodStarved", pod("stall-victim", 2), async () => {
      // The pass-over ends the starvation; the holder resumes after it.
      await waitFor("pass-over", () => alerts.some((a) => matches(a, "QuantaHolderPassedOver", pod("stall-holder", 2))), 40);
      holder.kill("SIGCONT");
    }, { fireWithin: 30, resolveWithin: 40 });
    await firesThenResolves("QuantaHolderPassedOver", { ...pod("stall-holder", 2), severity: "warning" }, async () => {
      await Promise.all([stop(holder), stop(victim)]);
    }, { fireWithin: 10, resolveWithin: 60 });
  })(),
  // Kernels far longer than the quantum on GPU 3: the short-kernel pod waits 400 ms each time.
  (async () => {
    const long = tenant("long-kernels", 3, ["batch", "--seconds", "120", "--kernel-ms", "400", "--depth", "1"]);
    const waiter = tenant("short-kernels", 3, busy(120));
    await firesThenResolves("QuantaWaitOverBudget", pod("short-kernels", 3), async () => {
      await Promise.all([stop(long), stop(waiter)]);
    }, { fireWithin: 60, resolveWithin: 40 });
  })(),
  // Refused at its 1 GiB cap in its first milliseconds, before any scrape saw the pod.
  (async () => {
    const early = tenant("early-capped", 4, ["alloc", "--bytes", "2Gi", "--count", "1", "--hold-ms", "15000"]);
    await firesThenResolves("QuantaAllocationsDeniedAtCap", { ...pod("early-capped", 4), severity: "info" },
      async () => { await early.exited; }, { fireWithin: 15, resolveWithin: 40 });
  })(),
  // Two pods of 6 GiB caps on a GPU of 8 GiB.
  (async () => {
    const caps = ["caps-a", "caps-b"].map((p) => tenant(p, 4, ["alloc", "--bytes", "64Mi", "--count", "1", "--hold-ms", "120000"]));
    await firesThenResolves("QuantaMemoryCapsExceedGpu", { gpu: "4", UUID: uuids.get("4") },
      async () => { await Promise.all(caps.map((c) => stop(c))); }, { fireWithin: 30, resolveWithin: 30 });
  })(),
  // A process on GPU 4 without the shim.
  (async () => {
    const unmanaged = start([bin("bin/quanta-tenant"), "--device", "4", ...busy(120)], {}, "unmanaged");
    await firesThenResolves("QuantaUnmanagedProcesses", { gpu: "4", UUID: uuids.get("4") },
      async () => { await stop(unmanaged); }, { fireWithin: 30, resolveWithin: 30 });
  })(),
  // GPU 1 drained, then undrained.
  (async () => {
    const d = quantactl("drain", "1");
    report.check(d.status === 0, `quantactl drain 1 succeeds: ${d.out}${d.err}`);
    await firesThenResolves("QuantaGpuDrainedForLong", { gpu: "1", UUID: uuids.get("1") }, async () => {
      const u = quantactl("undrain", "1");
      report.check(u.status === 0, `quantactl undrain 1 succeeds: ${u.out}${u.err}`);
    }, { fireWithin: 30, resolveWithin: 30 });
  })(),
  // A process that names no pod is refused at the tenant socket.
  (async () => {
    const refused = start([bin("bin/quanta-tenant"), "--device", "0", "info"], { LD_PRELOAD: bin("lib/libquanta.so") }, "no-pod");
    await firesThenResolves("QuantaAdmissionsRefused", { reason: "no-pod", severity: "info" },
      async () => { await refused.exited; }, { fireWithin: 30, resolveWithin: 40 });
  })(),
];
const sampler = (async () => {
  const until = Date.now() + 90000;
  while (Date.now() < until) { await sampleDashboard(); await sleep(3000); }
})();
await Promise.all([...stages, sampler]);
log("staged conditions over");

// --- 3. the arbiter down, then restarting --------------------------------------------------
const startTime = async () => {
  const r = await promQuery("quanta_arbiter_start_time_seconds");
  return r.result && r.result.length ? r.result[0].value[1] : "";
};
await stop(arbiter, "SIGKILL");
log("arbiter killed");
await firesThenResolves("QuantaArbiterDown", { arbiter_pod: kArbiterPod, severity: "critical" },
  async () => { await startArbiter(); }, { fireWithin: 30, resolveWithin: 30 });
// Three restarts, each seen by a scrape (a new start time), within the shortened window.
for (let i = 0; i < 3; i++) {
  const before = await startTime();
  await stop(arbiter);
  await startArbiter();
  for (let k = 0; k < 100 && (await startTime()) === before; k++) await sleep(200);
}
log("arbiter restarted three times");
await firesThenResolves("QuantaArbiterRestarting", { severity: "warning" }, async () => {},
  { fireWithin: 30, resolveWithin: 90 });
await sampleDashboard();

for (const q of queries) report.check(q.seen, `the dashboard's "${q.title}" query returns data: ${expand(q.expr)}${q.error ? ` (${q.error})` : ""}`);
polling = false;
await poller;
await Promise.all(children.map((c) => stop(c)));
report.finish(`${((Date.now() - t0) / 1000).toFixed(0)} s`);
