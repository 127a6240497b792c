"""Assertions on the rendered manifests of helm/latchkey.

    chart_checks.py DIR

DIR holds the `helm template` output of scripts/test-helm.sh: default.yaml
(3 voters), five.yaml (cell.replicas=5), production.yaml
(values-production.yaml), learners.yaml (3 voters + 2 learners, no proxies,
restore and backup upload on). Prints one line per check, "ok   helm: ..."
or "FAIL helm: ...: why", and exits 1 if any failed.

Checks read the manifests as Kubernetes would, not the templates' text:
the cell's --initial-cluster comes from running the rendered start script
with the rendered environment; metric and flag names come from the Rust
sources, so an alert or a setting that names something the binaries do
not have fails here.
"""

import os
import re
import subprocess
import sys
import tempfile

import promql_parser
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE, NAMESPACE, DOMAIN = "t", "default", "cluster.local"
CELL = f"{RELEASE}-latchkey-cell"
HEADLESS = f"{CELL}-headless"
PROXY = f"{RELEASE}-latchkey-proxy"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

results = []


def check(name):
    """Records the decorated function's verdict: it returns None (ok) or why not."""

    def run(fn):
        try:
            why = fn()
        except Exception as e:  # a missing object is a failure, not a crash
            why = f"{type(e).__name__}: {e}"
        results.append((name, why))
        print(f"ok   helm: {name}" if why is None else f"FAIL helm: {name}: {why}")
        return fn

    return run


def load(name):
    with open(os.path.join(sys.argv[1], name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} {kind} named {name}")
    return found[0]


def pod_specs(docs):
    """(owner, pod spec) of every workload, however deep its template."""
    for d in docs:
        spec = d.get("spec", {})
        if d["kind"] == "Pod":
            yield d["metadata"]["name"], spec
        elif d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d["metadata"]["name"], spec["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield d["metadata"]["name"], spec["jobTemplate"]["spec"]["template"]["spec"]


def containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", [])


def every_container():
    """(where, pod spec, container) for every container of every render."""
    for render, docs in RENDERS.items():
        for owner, spec in pod_specs(docs):
            for c in containers(spec):
                yield f"{render}/{owner}/{c['name']}", spec, c


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


RENDERS = {name: load(f"{name}.yaml") for name in ("default", "five", "production", "learners")}
DEFAULT, FIVE, PROD, LEARN = (RENDERS[n] for n in ("default", "five", "production", "learners"))


def start_script_args(docs, ordinal, running=False):
    """Runs the rendered start script as pod `ordinal` with the rendered
    environment. latchkey-cell, getent and etcdctl are stubs: getent
    resolves this cell's pod names (recording each name asked for); etcdctl
    finds no cell, or with `running` a cell of the first three pods that
    accepts a member add. Returns (latchkey-cell's args, names resolved,
    etcdctl calls)."""
    sts = one(docs, "StatefulSet", CELL)
    cm = one(docs, "ConfigMap", f"{CELL}-scripts")
    (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "cell"]
    env = {k: v for k, v in env_of(container).items() if v is not None}
    env.update(POD_NAME=f"{CELL}-{ordinal}", POD_IP=f"10.1.0.{ordinal + 1}")
    with tempfile.TemporaryDirectory() as tmp:
        def stub(name, body):
            with open(f"{tmp}/{name}", "w") as f:
                f.write("#!/bin/sh\n" + body)
            os.chmod(f"{tmp}/{name}", 0o755)

        stub("latchkey-cell", f'for a in "$@"; do echo "$a"; done >{tmp}/args\n')
        # getent ahostsv4 NAME: 10.2.0.<ordinal+1> for this cell's pods.
        stub("getent", f'echo "$2" >>{tmp}/names\n'
             f'case "$2" in {CELL}-*.{HEADLESS}.*) n=${{2%%.*}}; n=${{n##*-}}; echo "10.2.0.$((n + 1)) STREAM $2" ;; *) exit 2 ;; esac\n')
        members = "".join(f"{i + 1}, started, {CELL}-{i}, http://10.2.0.{i + 1}:7901, http://0.0.0.0:7801, false\n" for i in range(3))
        stub("etcdctl", f'echo "$*" >>{tmp}/etcdctl.calls\n' + (
            f'case "$*" in *"member list"*) printf "{members}" ;; *"member add"*) echo added ;; *) exit 1 ;; esac\n'
            if running else "exit 1\n"))
        with open(f"{tmp}/start.sh", "w") as f:
            f.write(cm["data"]["cell-start.sh"])
        env.update(PATH=f"{tmp}:/usr/bin:/bin", CELL_DATA_ROOT=f"{tmp}/root", CELL_DNS_WAIT_SECONDS="2")
        run = subprocess.run(container["command"][:1] + [f"{tmp}/start.sh"], env=env, capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            raise RuntimeError(f"start script exited {run.returncode}: {run.stderr.strip()}")
        read = lambda name: open(f"{tmp}/{name}").read().split("\n")[:-1] if os.path.exists(f"{tmp}/{name}") else []
        return read("args"), read("names"), read("etcdctl.calls")


def flag(args, name):
    return args[args.index(name) + 1]


for render, n in (("default", 3), ("five", 5)):
    docs = RENDERS[render]

    @check(f"{render}: StatefulSet of {n} pods, Parallel, on the headless service")
    def _(docs=docs, n=n):
        sts = one(docs, "StatefulSet", CELL)["spec"]
        svc = one(docs, "Service", HEADLESS)["spec"]
        if (sts["replicas"], sts["podManagementPolicy"], sts["serviceName"]) != (n, "Parallel", HEADLESS):
            return f"replicas/policy/service: {sts['replicas']}, {sts['podManagementPolicy']}, {sts['serviceName']}"
        if svc.get("clusterIP") != "None" or svc.get("publishNotReadyAddresses") is not True:
            return "peers' service is not headless with publishNotReadyAddresses"
        if sts["selector"]["matchLabels"] != svc["selector"]:
            return "headless service selects other pods than the StatefulSet"

    @check(f"{render}: --initial-cluster has exactly the {n} voters' pod names and ids 1..{n}")
    def _(docs=docs, n=n):
        peer_port = one(docs, "Service", HEADLESS)["spec"]["ports"]
        peer_port = [p["port"] for p in peer_port if p["name"] == "peer"][0]
        for ordinal in (0, n - 1):
            args, names, _ = start_script_args(docs, ordinal)
            want_names = [f"{CELL}-{i}.{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}" for i in range(n)]
            if names != want_names:
                return f"pod {ordinal} resolved {names}, want {want_names}"
            want = ",".join(f"{i + 1}=10.2.0.{i + 1}:{peer_port}" for i in range(n))
            if flag(args, "--initial-cluster") != want:
                return f"pod {ordinal}: --initial-cluster {flag(args, '--initial-cluster')}, want {want}"
            if flag(args, "--id") != str(ordinal + 1):
                return f"pod {ordinal} starts as --id {flag(args, '--id')}"
            if flag(args, "--peer-addr") != f"10.1.0.{ordinal + 1}:{peer_port}":
                return f"pod {ordinal}: --peer-addr {flag(args, '--peer-addr')} is not its pod IP"


@check("PDB minAvailable is the quorum: 2 of 3, 3 of 5, 3 of 5 in production")
def _():
    for docs, want in ((DEFAULT, 2), (FIVE, 3), (PROD, 3)):
        pdb = one(docs, "PodDisruptionBudget", CELL)["spec"]
        if pdb.get("minAvailable") != want or "maxUnavailable" in pdb:
            return f"minAvailable {pdb.get('minAvailable')}, want {want}"
        if pdb["selector"]["matchLabels"] != one(docs, "StatefulSet", CELL)["spec"]["selector"]["matchLabels"]:
            return "the PDB selects other pods than the StatefulSet"


@check("PDB with learners: 3 voters + 2 learners keep minAvailable 4 (one pod may go)")
def _():
    pdb = one(LEARN, "PodDisruptionBudget", CELL)["spec"]
    sts = one(LEARN, "StatefulSet", CELL)["spec"]
    if (pdb.get("minAvailable"), sts["replicas"]) != (4, 5):
        return f"minAvailable {pdb.get('minAvailable')} of {sts['replicas']} pods"


@check("a learner pod (ordinal >= cell.replicas) adds itself as a learner and joins, never bootstraps")
def _():
    sts = one(LEARN, "StatefulSet", CELL)
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    env = env_of(c)
    if (env.get("CELL_VOTERS"), env.get("CELL_PODS")) != ("3", "5"):
        return f"CELL_VOTERS={env.get('CELL_VOTERS')} CELL_PODS={env.get('CELL_PODS')}"
    args, names, calls = start_script_args(LEARN, 3, running=True)
    client = env["CELL_CLIENT_PORT"]
    others = ",".join(f"http://{CELL}-{i}.{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}:{client}" for i in (0, 1, 2, 4))
    if "--initial-cluster" in args or "--id" in args or flag(args, "--join") != others:
        return f"pod 3 started with {args}"
    adds = [c for c in calls if "member add" in c]
    if len(adds) != 1 or f"--peer-urls=http://10.1.0.4:{env['CELL_PEER_PORT']}" not in adds[0] or "--learner" not in adds[0]:
        return f"etcdctl calls {calls}"


def probe_on(container, kind, path):
    p = container.get(kind)
    return p and p.get("httpGet", {}).get("path") == path and p["httpGet"].get("port") == "metrics"


@check("probes: cells ready on /readyz, live and started on /healthz; proxies ready and live")
def _():
    for docs in (DEFAULT, PROD):
        (cell,) = one(docs, "StatefulSet", CELL)["spec"]["template"]["spec"]["containers"]
        (proxy,) = one(docs, "Deployment", PROXY)["spec"]["template"]["spec"]["containers"]
        for c, kind, path in ((cell, "readinessProbe", "/readyz"), (cell, "livenessProbe", "/healthz"),
                              (cell, "startupProbe", "/healthz"), (proxy, "readinessProbe", "/readyz"),
                              (proxy, "livenessProbe", "/healthz")):
            if not probe_on(c, kind, path):
                return f"{c['name']}: no {kind} on {path} (metrics port)"
            if "metrics" not in [p["name"] for p in c["ports"]]:
                return f"{c['name']} has no port named metrics"


@check("restricted securityContext on every pod and container of every render")
def _():
    for where, spec, c in every_container():
        psc = spec.get("securityContext", {})
        sc = c.get("securityContext", {})
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        bad = [k for k, ok in (
            ("pod runAsNonRoot", psc.get("runAsNonRoot") is True),
            ("runAsNonRoot", sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True),
            ("readOnlyRootFilesystem", sc.get("readOnlyRootFilesystem") is True),
            ("allowPrivilegeEscalation", sc.get("allowPrivilegeEscalation") is False),
            ("capabilities.drop ALL", "ALL" in sc.get("capabilities", {}).get("drop", [])),
            ("seccompProfile RuntimeDefault", seccomp == "RuntimeDefault"),
            ("privileged", sc.get("privileged") is not True),
        ) if not ok]
        if bad:
            return f"{where}: {', '.join(bad)}"


@check("resources: every container requests cpu and memory and limits memory")
def _():
    for where, _, c in every_container():
        r = c.get("resources", {})
        if not {"cpu", "memory"} <= set(r.get("requests", {})) or "memory" not in r.get("limits", {}):
            return f"{where}: {r}"


@check("images: a tag or digest, never latest")
def _():
    for where, _, c in every_container():
        image = c["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        if "@sha256:" not in image and (not tag or tag == "latest"):
            return f"{where}: {image}"


@check("topology spread over zones and nodes for cells and proxies")
def _():
    for docs in (DEFAULT, PROD):
        for kind, name in (("StatefulSet", CELL), ("Deployment", PROXY)):
            spec = one(docs, kind, name)["spec"]
            tsc = spec["template"]["spec"].get("topologySpreadConstraints", [])
            keys = {t["topologyKey"] for t in tsc if t["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]}
            if keys != {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}:
                return f"{name}: spread over {sorted(keys)}"
    hard = one(PROD, "StatefulSet", CELL)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    if "requiredDuringSchedulingIgnoredDuringExecution" not in hard:
        return "production cells lack required anti-affinity"


@check("proxies: Deployment, Service, HPA and PDB on the same pods; --cells names every cell pod")
def _():
    for docs, pods in ((DEFAULT, 3), (FIVE, 5)):
        dep = one(docs, "Deployment", PROXY)["spec"]
        labels = dep["template"]["metadata"]["labels"]
        svc = one(docs, "Service", PROXY)["spec"]
        pdb = one(docs, "PodDisruptionBudget", PROXY)["spec"]
        hpa = one(docs, "HorizontalPodAutoscaler", PROXY)["spec"]
        for what, sel in (("service", svc["selector"]), ("pdb", pdb["selector"]["matchLabels"])):
            if any(labels.get(k) != v for k, v in sel.items()):
                return f"the proxy {what} does not select the proxy pods"
        if hpa["scaleTargetRef"] != {"apiVersion": "apps/v1", "kind": "Deployment", "name": PROXY}:
            return f"HPA targets {hpa['scaleTargetRef']}"
        if "replicas" in dep:
            return "the Deployment sets replicas while the HPA owns them"
        cells = one(docs, "ConfigMap", PROXY)["data"]["LATCHKEY_CELLS"].split(",")
        client = [p["port"] for p in one(docs, "Service", HEADLESS)["spec"]["ports"] if p["name"] == "client"][0]
        want = [f"{CELL}-{i}.{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}:{client}" for i in range(pods)]
        if cells != want:
            return f"LATCHKEY_CELLS={cells}"


@check("services target container ports that exist")
def _():
    for render, docs in RENDERS.items():
        workloads = [(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]) for d in docs
                     if d["kind"] in ("Deployment", "StatefulSet")]
        for svc in (d for d in docs if d["kind"] == "Service"):
            sel = svc["spec"]["selector"]
            pods = [t for _, t in workloads if all(t["metadata"]["labels"].get(k) == v for k, v in sel.items())]
            if not pods:
                return f"{render}: service {svc['metadata']['name']} selects no pods"
            names = {p["name"] for t in pods for c in t["spec"]["containers"] for p in c.get("ports", [])}
            for port in svc["spec"]["ports"]:
                if port["targetPort"] not in names:
                    return f"{render}: {svc['metadata']['name']} targets {port['targetPort']}, pods have {sorted(names)}"


def declared_env(path):
    with open(os.path.join(ROOT, path)) as f:
        return set(re.findall(r'env\s*=\s*"(LATCHKEY_[A-Z_]+)"', f.read()))


@check("every LATCHKEY_* setting the chart passes is a flag of the binary it goes to")
def _():
    cell_env = declared_env("cell/src/config.rs")
    proxy_env = declared_env("proxy/src/config.rs")
    if not cell_env or not proxy_env:
        return "no LATCHKEY_* flags found in the config sources"
    for docs in (DEFAULT, PROD):
        for cm, known in ((f"{CELL}", cell_env), (PROXY, proxy_env)):
            unknown = sorted(k for k in one(docs, "ConfigMap", cm)["data"] if k not in known)
            if unknown:
                return f"ConfigMap {cm}: {unknown} are no flags of the binary"
        (c,) = one(docs, "StatefulSet", CELL)["spec"]["template"]["spec"]["containers"]
        # The start script passes these itself; a LATCHKEY_ variable would fight it.
        clash = sorted(k for k in env_of(c) if k in ("LATCHKEY_ID", "LATCHKEY_JOIN", "LATCHKEY_INITIAL_CLUSTER", "LATCHKEY_RESTORE", "LATCHKEY_PEER_ADDR"))
        if clash:
            return f"cell env sets {clash}"


def metric_names():
    names = set()
    for d in ("cell/src", "proxy/src", "shared/src"):
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith(".rs"):
                    with open(os.path.join(base, f)) as fh:
                        names |= set(re.findall(r'"(latchkey_[a-z_]+)"', fh.read()))
    return names


@check("alerts: every expression parses as PromQL and names only metrics the binaries export")
def _():
    known = metric_names()
    rules = [r for g in one(PROD, "PrometheusRule", f"{RELEASE}-latchkey")["spec"]["groups"] for r in g["rules"]]
    if len(rules) < 10:
        return f"only {len(rules)} rules"
    for r in rules:
        promql_parser.parse(r["expr"])
        for m in re.findall(r"\b(latchkey_[a-z_]+)", r["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", m)
            if m not in known and base not in known:
                return f"{r['alert']} uses {m}, which no binary exports"
        jobs = set(re.findall(r'job="([^"]+)"', r["expr"]))
        if not jobs or not jobs <= {HEADLESS, PROXY}:
            return f"{r['alert']} selects jobs {jobs}"
    wanted = {"LatchkeyCellNoLeader", "LatchkeyCellFrequentLeaderChanges", "LatchkeyCellSlowFsync",
              "LatchkeyCellSlowProposals", "LatchkeyCellLeaseExpirySpike", "LatchkeyProxyUpstreamErrors",
              "LatchkeyProxyWatchesCancelled"}
    missing = wanted - {r["alert"] for r in rules}
    if missing:
        return f"missing alerts {sorted(missing)}"


@check("ServiceMonitors scrape the metrics port of the services the alerts name")
def _():
    services = {d["metadata"]["name"]: d for d in PROD if d["kind"] == "Service"}
    for name, target in ((f"{RELEASE}-latchkey-cell", HEADLESS), (f"{RELEASE}-latchkey-proxy", PROXY)):
        sm = one(PROD, "ServiceMonitor", name)["spec"]
        sel = sm["selector"]["matchLabels"]
        hits = [n for n, s in services.items() if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        if hits != [target]:
            return f"{name} selects services {hits}, want [{target}]"
        if [e["port"] for e in sm["endpoints"]] != ["metrics"] or "metrics" not in [p["name"] for p in services[target]["spec"]["ports"]]:
            return f"{name} does not scrape a port named metrics"


@check("NetworkPolicy: the peer port admits cell members only")
def _():
    np = one(PROD, "NetworkPolicy", CELL)["spec"]
    sts = one(PROD, "StatefulSet", CELL)["spec"]
    peer = [p["containerPort"] for p in sts["template"]["spec"]["containers"][0]["ports"] if p["name"] == "peer"][0]
    rules = [r for r in np["ingress"] if any(p["port"] == peer for p in r.get("ports", []))]
    if len(rules) != 1 or [f.get("podSelector", {}).get("matchLabels") for f in rules[0].get("from", [])] != [sts["selector"]["matchLabels"]]:
        return f"peer-port rules {rules}"


@check("backup: a CronJob saves etcdctl snapshots to a PVC and prunes past the retention")
def _():
    cj = one(PROD, "CronJob", f"{RELEASE}-latchkey-backup")["spec"]
    spec = cj["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    script = c["command"][-1]
    if "etcdctl" not in script or "snapshot save" not in script or "tail -n +$((KEEP + 1))" not in script:
        return "the job does not save a snapshot and prune"
    if env_of(c).get("KEEP") != "84":
        return f"KEEP={env_of(c).get('KEEP')}, production keeps 84"
    claim = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
    one(PROD, "PersistentVolumeClaim", claim[0])
    up = one(LEARN, "CronJob", f"{RELEASE}-latchkey-backup")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if [c["name"] for c in up.get("initContainers", [])] != ["snapshot"] or [c["name"] for c in up["containers"]] != ["upload"]:
        return "with an upload, the snapshot does not run before the upload"


@check("restore: voters get the snapshot path and a read-only mount of its claim")
def _():
    spec = one(LEARN, "StatefulSet", CELL)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    if env_of(c).get("CELL_RESTORE_FILE") != "/restore/cell.snap":
        return f"CELL_RESTORE_FILE={env_of(c).get('CELL_RESTORE_FILE')}"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    if mounts.get("restore", {}).get("mountPath") != "/restore" or vols["restore"]["persistentVolumeClaim"] != {"claimName": "snaps", "readOnly": True}:
        return "no read-only /restore mount of the claim"


@check("no proxies: no proxy objects, backup and test fall back to the cell's client service")
def _():
    if any(d["metadata"]["name"].startswith(PROXY) for d in LEARN):
        return "proxy objects rendered with proxy.enabled=false"
    (snap,) = one(LEARN, "CronJob", f"{RELEASE}-latchkey-backup")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    if not env_of(snap)["ENDPOINT"].startswith(f"{CELL}.{NAMESPACE}.svc"):
        return f"backup endpoint {env_of(snap)['ENDPOINT']}"


@check("only core kinds and the Prometheus Operator's CRDs are rendered")
def _():
    core = {"ServiceAccount", "ConfigMap", "Service", "StatefulSet", "Deployment", "PodDisruptionBudget",
            "HorizontalPodAutoscaler", "NetworkPolicy", "CronJob", "PersistentVolumeClaim", "Pod"}
    for render, docs in RENDERS.items():
        other = {d["kind"] for d in docs} - core - CRD_KINDS
        if other:
            return f"{render}: {sorted(other)}"
        for d in docs:
            if d["kind"] in CRD_KINDS and d["apiVersion"] != "monitoring.coreos.com/v1":
                return f"{d['kind']} as {d['apiVersion']}"


failed = [n for n, why in results if why is not None]
sys.exit(1 if failed else 0)
