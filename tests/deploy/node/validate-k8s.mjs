// validate-k8s.mjs - checks Kubernetes manifests: every YAML document of
// every file against the API's OpenAPI schema (kubernetes-models'
// validate()), then the references between the objects that the schema
// cannot see. Prints one line per check; exits 1 if any failed.
//
//   node validate-k8s.mjs FILE.yaml...
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { parseAllDocuments } from "yaml";

let failures = 0;
const ok = (what) => console.log(`  ok: ${what}`);
const fail = (what, why) => {
  failures++;
  console.log(`  FAILED: ${what}${why ? `\n    ${String(why).replace(/\n/g, "\n    ")}` : ""}`);
};
const check = (what, cond, why) => (cond ? ok(what) : fail(what, why));

// apiVersion "apps/v1" -> kubernetes-models/apps/v1; the core group "v1"
// -> kubernetes-models/v1. The class is named after the kind.
async function modelClass(apiVersion, kind) {
  if (!/^([a-z0-9.-]+\/)?v[0-9]+((alpha|beta)[0-9]+)?$/.test(apiVersion) || !/^[A-Z][A-Za-z]+$/.test(kind)) {
    return null;
  }
  try {
    const mod = await import(`kubernetes-models/${apiVersion}/${kind}`);
    return mod[kind] ?? null;
  } catch {
    return null;
  }
}

// Every object of every file, or a failure for a file that does not parse.
const objects = [];
for (const file of process.argv.slice(2)) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"), { prettyErrors: true });
  docs.forEach((doc, i) => {
    const where = `${basename(file)} document ${i + 1}`;
    if (doc.errors.length) {
      fail(`${where}: YAML`, doc.errors.map((e) => e.message).join("\n"));
      return;
    }
    const obj = doc.toJS();
    if (obj === null) return; // an empty document (a trailing ---)
    objects.push({ where, obj });
  });
}

console.log("schema (kubernetes-models validate())");
for (const { where, obj } of objects) {
  const what = `${where}: ${obj.kind} ${obj.metadata?.name}`;
  const Model = await modelClass(String(obj.apiVersion), String(obj.kind));
  if (!Model) {
    fail(what, `no model for apiVersion ${obj.apiVersion} kind ${obj.kind}`);
    continue;
  }
  try {
    new Model(obj).validate();
    ok(what);
  } catch (e) {
    fail(what, e.message);
  }
}

// ---------------------------------------------------------------- references
console.log("references between objects");
const of = (kind) => objects.map((o) => o.obj).filter((o) => o.kind === kind);
const byName = (kind, name) => of(kind).find((o) => o.metadata?.name === name);
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => (labels ?? {})[k] === v);
const podLabels = (o) => o.spec?.template?.metadata?.labels ?? {};
const containers = (o) => o.spec?.template?.spec?.containers ?? [];

// A Service selects the pods of some workload; the StatefulSet's pods also
// carry statefulset.kubernetes.io/pod-name = NAME-ORDINAL.
for (const svc of of("Service")) {
  const sel = svc.spec?.selector ?? {};
  const owners = of("StatefulSet").filter((ss) => {
    const { "statefulset.kubernetes.io/pod-name": pod, ...rest } = sel;
    if (!matches(rest, podLabels(ss))) return false;
    if (pod === undefined) return true;
    const m = new RegExp(`^${ss.metadata.name}-(\\d+)$`).exec(pod);
    return m !== null && Number(m[1]) < (ss.spec.replicas ?? 1);
  });
  check(`Service ${svc.metadata.name}: its selector matches a StatefulSet's pods`, owners.length > 0,
    `selector ${JSON.stringify(sel)}`);
  const ports = owners.flatMap((ss) => containers(ss).flatMap((c) => c.ports ?? []));
  for (const p of svc.spec?.ports ?? []) {
    const t = p.targetPort ?? p.port;
    check(`Service ${svc.metadata.name} port ${p.name}: target ${t} is a container port`,
      ports.some((cp) => cp.name === t || cp.containerPort === t));
  }
}

for (const ss of of("StatefulSet")) {
  const name = `StatefulSet ${ss.metadata.name}`;
  const headless = byName("Service", ss.spec.serviceName);
  check(`${name}: serviceName ${ss.spec.serviceName} is a headless Service`,
    headless && headless.spec?.clusterIP === "None");
  check(`${name}: selector matches its pod labels`, matches(ss.spec.selector?.matchLabels, podLabels(ss)));
  const claims = (ss.spec.volumeClaimTemplates ?? []).map((t) => t.metadata.name);
  const volumes = (ss.spec.template.spec.volumes ?? []).map((v) => v.name);
  for (const c of containers(ss)) {
    for (const m of c.volumeMounts ?? []) {
      check(`${name}: mount ${m.name} is a volume or a claim template`,
        claims.includes(m.name) || volumes.includes(m.name));
    }
  }
  check(`${name}: a PersistentVolumeClaim template for checkpoints`, claims.length > 0);
  check(`${name}: pods start in parallel (a shard is ready only with all the others)`,
    ss.spec.podManagementPolicy === "Parallel");
}

// Probes name a container port; envFrom names a ConfigMap, and the key
// files it names are mounted; pods run as non-root.
for (const w of [...of("StatefulSet"), ...of("Job"), ...of("Deployment")]) {
  const name = `${w.kind} ${w.metadata.name}`;
  const pod = w.spec.template.spec;
  check(`${name}: pods run as non-root`, pod.securityContext?.runAsNonRoot === true);
  for (const c of containers(w)) {
    for (const probe of ["livenessProbe", "readinessProbe", "startupProbe"]) {
      const port = c[probe]?.httpGet?.port;
      if (port === undefined) continue;
      check(`${name}: ${probe} port ${port} is a container port`,
        (c.ports ?? []).some((p) => p.name === port || p.containerPort === port));
    }
    for (const ref of c.envFrom ?? []) {
      if (!ref.configMapRef) continue;
      check(`${name}: envFrom ConfigMap ${ref.configMapRef.name} exists`,
        byName("ConfigMap", ref.configMapRef.name) !== undefined);
      // CurveZMQ's key files and key directories must be in a mounted volume.
      const env = byName("ConfigMap", ref.configMapRef.name)?.data ?? {};
      for (const k of ["ZPS_CURVE_SECRET", "ZPS_SERVER_KEY", "ZPS_AUTHORIZED_KEYS", "ZPS_SHARD_KEYS",
                       "ZPS_OPERATOR_KEYS"]) {
        if (env[k] === undefined) continue;
        const mounts = (c.volumeMounts ?? []).map((m) => m.mountPath);
        check(`${name}: ${k} ${env[k]} is in a mounted volume`,
          mounts.some((p) => env[k] === p || env[k].startsWith(`${p}/`)));
      }
    }
  }
}

// The counts the ConfigMap states and the objects that make them real.
const job = byName("ConfigMap", "zps-job");
if (job) {
  for (const ss of of("StatefulSet")) {
    check(`ZPS_SHARDS ${job.data.ZPS_SHARDS} = StatefulSet ${ss.metadata.name} replicas ${ss.spec.replicas}`,
      Number(job.data.ZPS_SHARDS) === ss.spec.replicas);
    const c = containers(ss)[0];
    check(`StatefulSet ${ss.metadata.name}: liveness on /healthz, readiness on /readyz`,
      c.livenessProbe?.httpGet?.path === "/healthz" && c.readinessProbe?.httpGet?.path === "/readyz");
  }
  for (const j of of("Job")) {
    check(`ZPS_WORKERS ${job.data.ZPS_WORKERS} = Job ${j.metadata.name} completions and parallelism`,
      Number(job.data.ZPS_WORKERS) === j.spec.completions && j.spec.completions === j.spec.parallelism);
  }
}
for (const j of of("Job").filter((j) => /gpu/.test(j.metadata.name))) {
  check(`Job ${j.metadata.name}: each container limits nvidia.com/gpu to 1`,
    containers(j).every((c) => String(c.resources?.limits?.["nvidia.com/gpu"]) === "1"));
}

console.log(`${objects.length} objects: ${failures === 0 ? "all checks passed" : `${failures} check(s) FAILED`}`);
process.exit(failures === 0 ? 0 : 1);
