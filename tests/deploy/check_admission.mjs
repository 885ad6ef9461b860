// deploy/admission/pod-policy.yaml evaluated as the API server evaluates a
// ValidatingAdmissionPolicy (match conditions, then variables in order, then every
// validation; an evaluation error fails closed, as failurePolicy Fail does), by a real CEL
// evaluator (@bufbuild/cel with the strings extension Kubernetes also has), against the pods
// an attacker would write and the shipped examples.
import fs from "node:fs";
import path from "node:path";
import { run, isCelError } from "@bufbuild/cel";
import { strings } from "@bufbuild/cel/ext";
import { Report, loadYamlDocs, root } from "./lib.mjs";

const report = new Report("admission policy");
const docs = loadYamlDocs(path.join(root, "deploy/admission/pod-policy.yaml")).map((d) => d.object ?? d);
const policy = docs.find((d) => d.kind === "ValidatingAdmissionPolicy");
const binding = docs.find((d) => d.kind === "ValidatingAdmissionPolicyBinding");
if (!report.check(policy && binding, "the file holds a ValidatingAdmissionPolicy and its binding")) report.finish();
report.check(binding.spec.policyName === policy.metadata.name, "the binding names the policy");
report.check(binding.spec.validationActions?.includes("Deny"), "the binding denies");
report.check(policy.spec.failurePolicy === "Fail", "an expression that cannot be evaluated refuses the pod");

// JSON as CEL values: objects as maps, as the API server presents them.
const toCel = (v) => Array.isArray(v) ? v.map(toCel)
  : v !== null && typeof v === "object" ? new Map(Object.entries(v).map(([k, x]) => [k, toCel(x)])) : v;

function evaluate(expr, bindings) {
  try {
    const r = run(expr, bindings, { funcs: strings });
    return isCelError(r) ? { error: String(r.message ?? r) } : { value: r };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
}

// {admitted, message}: what the policy decides for `pod` in a namespace with `labels`.
function admit(pod, labels = {}) {
  const bindings = { object: toCel(pod), namespaceObject: toCel({ metadata: { name: pod.metadata.namespace ?? "default", labels } }) };
  for (const c of policy.spec.matchConditions ?? []) {
    const r = evaluate(c.expression, bindings);
    if (r.error) return { admitted: false, message: `match condition ${c.name}: ${r.error}` };
    if (r.value !== true) return { admitted: true, message: "(not matched)" };
  }
  const variables = new Map();
  bindings.variables = variables;
  for (const v of policy.spec.variables ?? []) {
    const r = evaluate(v.expression, bindings);
    if (r.error) return { admitted: false, message: `variable ${v.name}: ${r.error}` };
    variables.set(v.name, r.value);
  }
  for (const v of policy.spec.validations) {
    const r = evaluate(v.expression, bindings);
    if (r.error) return { admitted: false, message: `error: ${r.error}` };
    if (r.value !== true) return { admitted: false, message: v.message };
  }
  return { admitted: true, message: "" };
}

const gpuPod = (annotations, ns = "team-a") => ({
  apiVersion: "v1", kind: "Pod",
  metadata: { name: "p", namespace: ns, annotations },
  spec: { containers: [{ name: "c", image: "x", resources: { limits: { "nvidia.com/gpu": "1" } } }] },
});
const trusted = { "quanta.dev/trusted": "true" };

const cases = [
  // [what, pod, namespace labels, admitted, message fragment]
  ["a pod without a GPU or quanta.dev/ annotation is not matched",
    { apiVersion: "v1", kind: "Pod", metadata: { name: "web" }, spec: { containers: [{ name: "c", image: "x" }] } }, {}, true, ""],
  ["a GPU pod without a memory-limit", gpuPod(undefined), {}, false, "must set quanta.dev/memory-limit"],
  ["a capped batch pod", gpuPod({ "quanta.dev/weight": "4", "quanta.dev/memory-limit": "10Gi" }), {}, true, ""],
  ["weight 1000 (the attack)", gpuPod({ "quanta.dev/weight": "1000", "quanta.dev/memory-limit": "1Gi" }), {}, false, "quanta.dev/weight"],
  ["weight 1000 in a trusted namespace", gpuPod({ "quanta.dev/weight": "1000", "quanta.dev/memory-limit": "1Gi" }), trusted, true, ""],
  ["weight 0", gpuPod({ "quanta.dev/weight": "0", "quanta.dev/memory-limit": "1Gi" }), trusted, false, "quanta.dev/weight"],
  ["weight not a number", gpuPod({ "quanta.dev/weight": "lots", "quanta.dev/memory-limit": "1Gi" }), {}, false, "quanta.dev/weight"],
  ["interactive (the attack)", gpuPod({ "quanta.dev/priority": "interactive", "quanta.dev/memory-limit": "1Gi" }), {}, false, "quanta.dev/priority"],
  ["interactive in a trusted namespace", gpuPod({ "quanta.dev/priority": "interactive", "quanta.dev/memory-limit": "1Gi" }), trusted, true, ""],
  ["min-share 100% (the attack)", gpuPod({ "quanta.dev/min-share": "100%", "quanta.dev/memory-limit": "1Gi" }), {}, false, "quanta.dev/min-share"],
  ["min-share 20%", gpuPod({ "quanta.dev/min-share": "20%", "quanta.dev/memory-limit": "1Gi" }), {}, true, ""],
  ["min-share 0.25", gpuPod({ "quanta.dev/min-share": "0.25", "quanta.dev/memory-limit": "1Gi" }), {}, true, ""],
  ["min-share 0.3", gpuPod({ "quanta.dev/min-share": "0.3", "quanta.dev/memory-limit": "1Gi" }), {}, false, "quanta.dev/min-share"],
  ["min-share not a share", gpuPod({ "quanta.dev/min-share": "most", "quanta.dev/memory-limit": "1Gi" }), trusted, false, "quanta.dev/min-share"],
  ["memory-limit none (the attack)", gpuPod({ "quanta.dev/memory-limit": "none" }), {}, false, "quanta.dev/memory-limit"],
  ["memory-limit none in a trusted namespace", gpuPod({ "quanta.dev/memory-limit": "none" }), trusted, true, ""],
  ["an unknown quanta.dev/ key", gpuPod({ "quanta.dev/wieght": "4", "quanta.dev/memory-limit": "1Gi" }), {}, false, "unknown quanta.dev/ annotation"],
  ["a namespace label of another value is not trust", gpuPod({ "quanta.dev/weight": "1000", "quanta.dev/memory-limit": "1Gi" }),
    { "quanta.dev/trusted": "yes" }, false, "quanta.dev/weight"],
];
for (const [what, pod, labels, expected, fragment] of cases) {
  const r = admit(pod, labels);
  report.check(r.admitted === expected && (expected || r.message.includes(fragment)),
    `${what}: ${expected ? "admitted" : "refused"}${r.admitted === expected ? "" : ` (got ${r.admitted ? "admitted" : "refused: " + r.message})`}` +
    (!expected && r.admitted === expected && !r.message.includes(fragment) ? ` (message "${r.message}" lacks "${fragment}")` : ""));
}

// The shipped examples: batch and best-effort pass anywhere; the interactive one needs a
// namespace an administrator trusts (the node config allows it in `default`).
for (const f of fs.readdirSync(path.join(root, "deploy/examples"))) {
  for (const d of loadYamlDocs(path.join(root, "deploy/examples", f))) {
    const pod = d.object ?? d;
    if (pod.kind !== "Pod") continue;
    const interactive = pod.metadata.annotations?.["quanta.dev/priority"] === "interactive";
    const plain = admit(pod, {});
    report.check(plain.admitted === !interactive,
      `deploy/examples/${f} is ${interactive ? "refused" : "admitted"} in an untrusted namespace${plain.admitted === !interactive ? "" : ": " + plain.message}`);
    report.check(admit(pod, trusted).admitted, `deploy/examples/${f} is admitted in a trusted namespace`);
  }
}
report.finish();
