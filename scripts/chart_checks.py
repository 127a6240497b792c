"""Assertions on the rendered manifests of helm/latchkey.

    chart_checks.py DIR

DIR holds the `helm template` output of scripts/test-helm.sh: default.yaml
(3 voters), five.yaml (cell.replicas=5), production.yaml
(values-production.yaml), learners.yaml (3 voters + 2 learners, no proxies,
restore and backup upload on), cells.yaml (the defaults and two more cells:
b, 3 voters owning jobs/ and queues/, and c, 5 voters) and
cells-production.yaml (production with the same cells, c with 2 learners,
networkPolicy.allowExternal=false). Prints one line per check, "ok   helm:
..." or "FAIL helm: ...: why", and exits 1 if any failed.

Checks read the manifests as Kubernetes would, not the templates' text:
the cell's --initial-cluster comes from running the rendered start script
with the rendered environment; metric and flag names come from the Rust
sources, so an alert or a setting that names something the binaries do
not have fails here.
"""

import base64
import collections
import json
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


RENDERS = {name: load(f"{name}.yaml") for name in ("default", "five", "production", "learners", "cells",
                                                    "cells-production")}
DEFAULT, FIVE, PROD, LEARN, CELLS, CELLS_PROD = (
    RENDERS[n] for n in ("default", "five", "production", "learners", "cells", "cells-production"))


def start_script_args(docs, ordinal, running=False, has_data=False, pod_ip=None, sts_name=CELL):
    """Runs the rendered start script as pod `ordinal` with the rendered
    environment. latchkey-cell and etcdctl are stubs, and so are getent,
    host, nslookup and dig, which only record that they were asked (the
    script must resolve nothing). etcdctl finds no cell, or with `running`
    a cell of the first three pods, known by their DNS names, that accepts
    a member add. `has_data`: the data directory holds a member's files.
    `sts_name`: the StatefulSet, the home cell's or another cell's. Returns
    (latchkey-cell's args, names looked up, etcdctl calls, exit status,
    stderr)."""
    sts = one(docs, "StatefulSet", sts_name)
    (script_cm,) = [v["configMap"]["name"] for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    cm = one(docs, "ConfigMap", script_cm)
    (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "cell"]
    env = {k: v for k, v in env_of(container).items() if v is not None}
    env.update(POD_NAME=f"{sts_name}-{ordinal}", POD_IP=pod_ip or f"10.1.0.{ordinal + 1}")
    with tempfile.TemporaryDirectory() as tmp:
        def stub(name, body):
            with open(f"{tmp}/{name}", "w") as f:
                f.write("#!/bin/sh\n" + body)
            os.chmod(f"{tmp}/{name}", 0o755)

        stub("latchkey-cell", f'for a in "$@"; do echo "$a"; done >{tmp}/args\n')
        for resolver in ("getent", "host", "nslookup", "dig"):
            stub(resolver, f'echo "{resolver} $*" >>{tmp}/names\nexit 2\n')
        peer, client = env["CELL_PEER_PORT"], env["CELL_CLIENT_PORT"]
        host = lambda i: pod_host(i, sts_name)
        members = "".join(f"{i + 1}, started, {sts_name}-{i}, http://{host(i)}:{peer}, http://{host(i)}:{client}, false\n"
                          for i in range(3))
        stub("etcdctl", f'echo "$*" >>{tmp}/etcdctl.calls\n' + (
            f'case "$*" in *"member list"*) printf "{members}" ;; *"member add"*) echo added ;; *) exit 1 ;; esac\n'
            if running else "exit 1\n"))
        with open(f"{tmp}/start.sh", "w") as f:
            f.write(cm["data"]["cell-start.sh"])
        if has_data:
            os.makedirs(f"{tmp}/root/data")
            open(f"{tmp}/root/data/CURRENT", "w").close()
        env.update(PATH=f"{tmp}:/usr/bin:/bin", CELL_DATA_ROOT=f"{tmp}/root")
        run = subprocess.run(container["command"][:1] + [f"{tmp}/start.sh"], env=env, capture_output=True, text=True, timeout=60)
        read = lambda name: open(f"{tmp}/{name}").read().split("\n")[:-1] if os.path.exists(f"{tmp}/{name}") else []
        return read("args"), read("names"), read("etcdctl.calls"), run.returncode, run.stderr


def started(docs, ordinal, **kw):
    """start_script_args of a start that must exec latchkey-cell."""
    args, names, calls, status, stderr = start_script_args(docs, ordinal, **kw)
    if status != 0 or not args:
        raise RuntimeError(f"start script exited {status}: {stderr.strip()}")
    return args, names, calls


def pod_host(i, sts_name=CELL):
    """Pod i of a cell's StatefulSet under its headless Service."""
    return f"{sts_name}-{i}.{sts_name}-headless.{NAMESPACE}.svc.{DOMAIN}"


def flag(args, name):
    return args[args.index(name) + 1]


def ports(docs, sts_name=CELL):
    svc = one(docs, "Service", f"{sts_name}-headless")["spec"]["ports"]
    return {p["name"]: p["port"] for p in svc}


def addresses_wrong(args, ordinal, docs, wildcard="0.0.0.0", sts_name=CELL):
    """Why the bind and advertised addresses of pod `ordinal` are wrong, or
    None: every port binds the wildcard, and the member advertises its own
    pod's DNS name for peers and clients."""
    p = ports(docs, sts_name)
    want = {"--peer-addr": f"{wildcard}:{p['peer']}", "--client-addr": f"{wildcard}:{p['client']}",
            "--metrics-addr": f"{wildcard}:{p['metrics']}",
            "--advertise-peer-addr": f"{pod_host(ordinal, sts_name)}:{p['peer']}",
            "--advertise-client-addr": f"{pod_host(ordinal, sts_name)}:{p['client']}"}
    got = {k: flag(args, k) if k in args else None for k in want}
    if got != want:
        return f"pod {ordinal}: {got}, want {want}"


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

    @check(f"{render}: every voter's --initial-cluster is exactly the {n} voters' DNS names, ids 1..{n}, nothing resolved")
    def _(docs=docs, n=n):
        want = ",".join(f"{i + 1}={pod_host(i)}:{ports(docs)['peer']}" for i in range(n))
        for ordinal in range(n):
            args, names, calls = started(docs, ordinal)
            if names:
                return f"pod {ordinal} looked up {names}"
            if flag(args, "--initial-cluster") != want:
                return f"pod {ordinal}: --initial-cluster {flag(args, '--initial-cluster')}, want {want}"
            if flag(args, "--id") != str(ordinal + 1) or "--join" in args:
                return f"pod {ordinal} starts with {args}"
            if any("10.1.0." in a for a in args):
                return f"pod {ordinal} passes its pod IP: {args}"

    @check(f"{render}: every voter binds 0.0.0.0 and advertises its own pod's DNS name (peer and client)")
    def _(docs=docs, n=n):
        for ordinal in range(n):
            why = addresses_wrong(started(docs, ordinal)[0], ordinal, docs)
            if why:
                return why


@check("IPv6 pod: the member binds [::] and still advertises its DNS name")
def _():
    args, names, _ = started(DEFAULT, 1, pod_ip="fd00::2")
    return addresses_wrong(args, 1, DEFAULT, wildcard="[::]") or (f"looked up {names}" if names else None)


@check("a restarted member (data on its volume) starts from it: no member update, no --initial-cluster, same names")
def _():
    for ordinal in (0, 2, 3):
        args, names, calls = started(LEARN, ordinal, running=True, has_data=True)
        client = ports(LEARN)["client"]
        everyone = ",".join(f"http://{pod_host(i)}:{client}" for i in range(5))
        if calls or names:
            return f"pod {ordinal}: etcdctl {calls}, looked up {names}"
        if "--initial-cluster" in args or "--id" in args or flag(args, "--join") != everyone:
            return f"pod {ordinal} restarted with {args}"
        why = addresses_wrong(args, ordinal, LEARN)
        if why:
            return why


@check("a voter with no data whose member has run in the cell (lost volume) is refused, naming member remove")
def _():
    args, _, calls, status, stderr = start_script_args(DEFAULT, 2, running=True)
    if status == 0 or args or "member remove 3" not in stderr or any("member add" in c for c in calls):
        return f"exit {status}, args {args}, etcdctl {calls}, stderr {stderr.strip()}"


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


@check("a learner pod (ordinal >= cell.replicas) adds its DNS name as a learner and joins, never bootstraps")
def _():
    sts = one(LEARN, "StatefulSet", CELL)
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    env = env_of(c)
    if (env.get("CELL_VOTERS"), env.get("CELL_PODS")) != ("3", "5"):
        return f"CELL_VOTERS={env.get('CELL_VOTERS')} CELL_PODS={env.get('CELL_PODS')}"
    args, names, calls = started(LEARN, 3, running=True)
    client = env["CELL_CLIENT_PORT"]
    others = ",".join(f"http://{pod_host(i)}:{client}" for i in (0, 1, 2, 4))
    if "--initial-cluster" in args or "--id" in args or flag(args, "--join") != others or names:
        return f"pod 3 started with {args}, looked up {names}"
    adds = [c for c in calls if "member add" in c]
    if len(adds) != 1 or f"--peer-urls=http://{pod_host(3)}:{env['CELL_PEER_PORT']}" not in adds[0] or "--learner" not in adds[0]:
        return f"etcdctl calls {calls}"
    return addresses_wrong(args, 3, LEARN)


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


@check("each proxy's share of tenants' request rates is 1/replicas (1/minReplicas with the HPA), or as set")
def _():
    for docs in (DEFAULT, FIVE):
        data = one(docs, "ConfigMap", PROXY)["data"]
        hpa = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
        n = hpa[0]["spec"]["minReplicas"] if hpa else one(docs, "Deployment", PROXY)["spec"]["replicas"]
        if abs(float(data.get("LATCHKEY_RATE_SHARE", "nan")) - 1 / n) > 1e-9:
            return f"LATCHKEY_RATE_SHARE={data.get('LATCHKEY_RATE_SHARE')} with {n} proxies"


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


@check("every LATCHKEY_* setting and every flag the start script passes is a flag of the binary it goes to")
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
        clash = sorted(k for k in env_of(c) if k in (
            "LATCHKEY_ID", "LATCHKEY_JOIN", "LATCHKEY_INITIAL_CLUSTER", "LATCHKEY_RESTORE", "LATCHKEY_PEER_ADDR",
            "LATCHKEY_CLIENT_ADDR", "LATCHKEY_ADVERTISE_PEER_ADDR", "LATCHKEY_ADVERTISE_CLIENT_ADDR"))
        if clash:
            return f"cell env sets {clash}"
    # The flags the start script gives latchkey-cell, on each of its paths.
    with open(os.path.join(ROOT, "cell/src/config.rs")) as f:
        fields = set(re.findall(r"pub ([a-z_]+):", f.read()))
    for args in (started(LEARN, 0)[0], started(LEARN, 3, running=True)[0], started(LEARN, 1, has_data=True)[0]):
        unknown = sorted(a for a in args if a.startswith("--") and a[2:].replace("-", "_") not in fields)
        if unknown:
            return f"the start script passes {unknown}, which latchkey-cell does not have"


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
    # The proxies' key is the members' too: it stays.
    if any(d["metadata"]["name"].startswith(PROXY) and d["kind"] != "Secret" for d in LEARN):
        return "proxy objects rendered with proxy.enabled=false"
    (snap,) = one(LEARN, "CronJob", f"{RELEASE}-latchkey-backup")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    if not env_of(snap)["ENDPOINT"].startswith(f"{CELL}.{NAMESPACE}.svc"):
        return f"backup endpoint {env_of(snap)['ENDPOINT']}"


@check("TLS (production): members serve and present the cell Secret, proxies theirs, etcdctl pods use the cell Secret; off by default")
def _():
    tls_flags = declared_env("shared/src/tls/flags.rs")
    d = "/etc/latchkey-tls"

    def mounted(spec, c, secret):
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        if mounts.get("tls", {}).get("mountPath") != d or not mounts["tls"].get("readOnly"):
            return f"{c['name']}: no read-only {d}"
        if vols.get("tls", {}).get("secret", {}).get("secretName") != secret:
            return f"{c['name']}: the tls volume is not Secret {secret}"

    cell_env = {"LATCHKEY_CERT_FILE": f"{d}/tls.crt", "LATCHKEY_KEY_FILE": f"{d}/tls.key",
                "LATCHKEY_TRUSTED_CA_FILE": f"{d}/ca.crt", "LATCHKEY_CLIENT_CERT_AUTH": "true",
                "LATCHKEY_PEER_CERT_FILE": f"{d}/tls.crt", "LATCHKEY_PEER_KEY_FILE": f"{d}/tls.key",
                "LATCHKEY_PEER_TRUSTED_CA_FILE": f"{d}/ca.crt"}
    proxy_env = {"LATCHKEY_CERT_FILE": f"{d}/tls.crt", "LATCHKEY_CACERT": f"{d}/ca.crt",
                 "LATCHKEY_CERT": f"{d}/tls.crt", "LATCHKEY_KEY": f"{d}/tls.key"}
    workloads = {}
    for kind, name, want, secret in (("StatefulSet", CELL, cell_env, "cell-tls"),
                                     ("Deployment", PROXY, proxy_env, "proxy-tls")):
        spec = one(PROD, kind, name)["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        got = {k: env_of(c).get(k) for k in want}
        if got != want:
            return f"{name}: TLS env {got}"
        why = mounted(spec, c, f"{RELEASE}-latchkey-{secret}")
        if why:
            return why
        workloads[name] = c
    c, p = workloads[CELL], workloads[PROXY]
    unknown = sorted(k for k in list(env_of(c)) + list(env_of(p))
                     if re.match(r"LATCHKEY_.*(CERT|KEY|CA)", k) and k not in tls_flags
                     and k != "LATCHKEY_PROXY_KEY_FILE")
    if unknown:
        return f"{unknown} are no TLS flags"
    backup = one(PROD, "CronJob", f"{RELEASE}-latchkey-backup")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    test = one(PROD, "Pod", f"{RELEASE}-latchkey-test")["spec"]
    for spec in (backup, test):
        (e,) = spec["containers"]
        if env_of(e).get("ETCDCTL_CACERT") != f"{d}/ca.crt" or env_of(e).get("ETCDCTL_CERT") != f"{d}/tls.crt":
            return f"{e['name']}: etcdctl without the CA and a certificate"
        why = mounted(spec, e, f"{RELEASE}-latchkey-cell-tls")
        if why:
            return why
    for owner, spec in pod_specs(DEFAULT):
        if any(v["name"] == "tls" for v in spec.get("volumes", [])):
            return f"default values: {owner} mounts a TLS Secret"


@check("auth on in production: the proxies authenticate as their user with the Secret's password file, "
       "the test pod as root, a post-install Job turns it on; none of it with the defaults")
def _():
    secret = f"{RELEASE}-latchkey-auth"
    proxy = one(PROD, "Deployment", PROXY)["spec"]["template"]["spec"]
    (c,) = proxy["containers"]
    env = env_of(c)
    if env.get("LATCHKEY_CELL_USER") != "latchkey-proxy":
        return f"proxy LATCHKEY_CELL_USER is {env.get('LATCHKEY_CELL_USER')!r}"
    path = env.get("LATCHKEY_CELL_PASSWORD_FILE") or ""
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in proxy.get("volumes", [])}
    auth = mounts.get("auth", {})
    if not auth.get("readOnly") or not path.startswith(auth.get("mountPath", "?") + "/"):
        return f"the password file {path!r} is not on a read-only auth mount"
    items = vols.get("auth", {}).get("secret", {})
    if items.get("secretName") != secret or [i["path"] for i in items.get("items", [])] != [path.rsplit("/", 1)[1]]:
        return f"the auth volume is not {secret}'s proxy-password"
    flags = declared_env("proxy/src/config.rs")
    if not {"LATCHKEY_CELL_USER", "LATCHKEY_CELL_PASSWORD_FILE"} <= flags:
        return "latchkey-proxy has no LATCHKEY_CELL_USER / LATCHKEY_CELL_PASSWORD_FILE"
    job = one(PROD, "Job", f"{RELEASE}-latchkey-auth-bootstrap")
    if "post-install" not in job["metadata"]["annotations"].get("helm.sh/hook", ""):
        return "the auth Job is not a post-install hook"
    (j,) = job["spec"]["template"]["spec"]["containers"]
    script = j["command"][-1]
    for step in ("auth enable", "grant-role \"$PROXY_USER\" latchkey-proxy", "grant-role \"$PROXY_USER\" root"):
        if step not in script:
            return f"the auth Job does not run {step!r}"
    refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef", {}) for e in j.get("env", [])}
    for var, key in (("ROOT_PASSWORD", "root-password"), ("PROXY_PASSWORD", "proxy-password")):
        if refs.get(var) != {"name": secret, "key": key}:
            return f"the auth Job's {var} is not {secret}/{key}"
    (t,) = one(PROD, "Pod", f"{RELEASE}-latchkey-test")["spec"]["containers"]
    if env_of(t).get("ETCDCTL_USER") != "root":
        return "the test pod does not authenticate"
    for owner, spec in pod_specs(DEFAULT):
        if any(v["name"] == "auth" for v in spec.get("volumes", [])) or owner.endswith("auth-bootstrap"):
            return f"default values: {owner} has auth"


@check("the proxies' key: members of every cell and proxies read one Secret's proxy.key from a read-only mount, "
       "in every render; the chart's Secret is random and kept on upgrade")
def _():
    secret = f"{RELEASE}-latchkey-proxy-key"
    flags = declared_env("cell/src/config.rs") & declared_env("proxy/src/config.rs")
    if "LATCHKEY_PROXY_KEY_FILE" not in flags:
        return "latchkey-cell and latchkey-proxy do not both take LATCHKEY_PROXY_KEY_FILE"
    for render, docs in RENDERS.items():
        cells = [("StatefulSet", d["metadata"]["name"]) for d in docs if d["kind"] == "StatefulSet"]
        if render.startswith("cells") and len(cells) != 3:
            return f"{render}: {len(cells)} StatefulSets"
        for kind, name in cells + [("Deployment", PROXY)]:
            if docs is LEARN and kind == "Deployment":
                continue  # no proxies there
            spec = one(docs, kind, name)["spec"]["template"]["spec"]
            (c,) = [c for c in spec["containers"] if c["name"] in ("cell", "proxy")]
            path = env_of(c).get("LATCHKEY_PROXY_KEY_FILE") or ""
            mount = {m["name"]: m for m in c.get("volumeMounts", [])}.get("proxy-key", {})
            if not mount.get("readOnly") or path != mount.get("mountPath", "?") + "/proxy.key":
                return f"{render}: {name}'s key file {path!r} is not on a read-only proxy-key mount"
            vol = {v["name"]: v for v in spec.get("volumes", [])}.get("proxy-key", {}).get("secret", {})
            if vol.get("secretName") != secret or [i["key"] for i in vol.get("items", [])] != ["proxy.key"]:
                return f"{render}: {name}'s proxy-key volume is not {secret}'s proxy.key"
        made = one(docs, "Secret", secret)
        if made["metadata"].get("annotations", {}).get("helm.sh/resource-policy") != "keep":
            return f"{render}: the key's Secret is not kept"
        key = base64.b64decode(made["data"]["proxy.key"]).decode()
        if len(key) != 64 or not key.isalnum():
            return f"{render}: the key is {len(key)} characters, not 64 alphanumeric"


@check("only core kinds and the Prometheus Operator's CRDs are rendered")
def _():
    core = {"ServiceAccount", "ConfigMap", "Service", "StatefulSet", "Deployment", "PodDisruptionBudget",
            "HorizontalPodAutoscaler", "NetworkPolicy", "CronJob", "PersistentVolumeClaim", "Pod", "Job",
            "Secret"}
    for render, docs in RENDERS.items():
        other = {d["kind"] for d in docs} - core - CRD_KINDS
        if other:
            return f"{render}: {sorted(other)}"
        for d in docs:
            if d["kind"] in CRD_KINDS and d["apiVersion"] != "monitoring.coreos.com/v1":
                return f"{d['kind']} as {d['apiVersion']}"


# ---------------------------------------------------------------------------
# More cells (values.yaml: cells): cells.yaml and cells-production.yaml,
# b (3 voters, jobs/ and queues/) and c (5 voters; 2 learners on production).
# ---------------------------------------------------------------------------
EXTRA = {"b": 3, "c": 5}
EXTRA_LEARNERS = {"cells": {"b": 0, "c": 0}, "cells-production": {"b": 0, "c": 2}}
DIRECTORY = f"{RELEASE}-latchkey-directory"


def sts_of(cell):
    """The StatefulSet (and client Service, PDB, NetworkPolicy) of a cell."""
    return CELL if cell == "home" else f"{CELL}-{cell}"


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def component(name):
    return {"app.kubernetes.io/name": "latchkey", "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/component": name}


@check("cells: one StatefulSet per cell (home, b 3 voters, c 5; c 2 learners on production), Parallel, "
       "each on its own headless Service, its selector taking no other cell's pods")
def _():
    for render in ("cells", "cells-production"):
        docs = RENDERS[render]
        stss = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
        if sorted(stss) != sorted(sts_of(c) for c in ("home", *EXTRA)):
            return f"{render}: StatefulSets {sorted(stss)}"
        voters = {"home": one(docs, "StatefulSet", CELL)["metadata"]["annotations"]["latchkey.io/voters"], **EXTRA}
        for cell, n in voters.items():
            n = int(n)
            sts = stss[sts_of(cell)]
            spec = sts["spec"]
            learners = EXTRA_LEARNERS[render].get(cell, 0)
            (c,) = spec["template"]["spec"]["containers"]
            env = env_of(c)
            got = (spec["replicas"], spec["podManagementPolicy"], spec["serviceName"],
                   sts["metadata"]["annotations"].get("latchkey.io/voters"), env.get("CELL_VOTERS"),
                   env.get("CELL_PODS"), env.get("CELL_STS"), c["image"])
            want = (n + learners, "Parallel", f"{sts_of(cell)}-headless", str(n), str(n), str(n + learners),
                    sts_of(cell), one(docs, "StatefulSet", CELL)["spec"]["template"]["spec"]["containers"][0]["image"])
            if got != want:
                return f"{render}: cell {cell}: {got}, want {want}"
        for a in stss.values():
            for b in stss.values():
                if selects(a["spec"]["selector"]["matchLabels"], b["spec"]["template"]["metadata"]["labels"]) != (a is b):
                    what = "misses its own pods" if a is b else f"takes the pods of {b['metadata']['name']}"
                    return f"{render}: the selector of {a['metadata']['name']} {what}"


@check("cells: every voter of b and c bootstraps with an --initial-cluster of its own cell's pods' DNS names "
       "and advertises its own; a learner of c adds itself to c and joins c")
def _():
    for cell, n in EXTRA.items():
        sts = sts_of(cell)
        want = ",".join(f"{i + 1}={pod_host(i, sts)}:{ports(CELLS, sts)['peer']}" for i in range(n))
        for ordinal in range(n):
            args, names, _ = started(CELLS, ordinal, sts_name=sts)
            if names:
                return f"{sts}-{ordinal} looked up {names}"
            if flag(args, "--initial-cluster") != want or flag(args, "--id") != str(ordinal + 1) or "--join" in args:
                return f"{sts}-{ordinal} starts with {args}, want --initial-cluster {want}"
            why = addresses_wrong(args, ordinal, CELLS, sts_name=sts)
            if why:
                return f"{sts}: {why}"
    # Production (TLS): pod 5 of c is its first learner.
    sts = sts_of("c")
    p = ports(CELLS_PROD, sts)
    args, names, calls = started(CELLS_PROD, 5, running=True, sts_name=sts)
    others = ",".join(f"https://{pod_host(i, sts)}:{p['client']}" for i in range(7) if i != 5)
    if "--initial-cluster" in args or flag(args, "--join") != others or names:
        return f"{sts}-5 started with {args}, looked up {names}"
    adds = [c for c in calls if "member add" in c]
    if len(adds) != 1 or f"--peer-urls=https://{pod_host(5, sts)}:{p['peer']}" not in adds[0] or "--learner" not in adds[0]:
        return f"etcdctl calls {calls}"
    if any(f"{sts}-" not in c for c in calls):
        return f"{sts}-5 asked another cell: {calls}"
    return addresses_wrong(args, 5, CELLS_PROD, sts_name=sts)


@check("cells: each cell has a headless Service (every pod, ready or not) and a client Service of its own, "
       "selecting only its pods")
def _():
    stss = [d for d in CELLS if d["kind"] == "StatefulSet"]
    for cell in ("home", *EXTRA):
        name = sts_of(cell)
        headless, client = one(CELLS, "Service", f"{name}-headless"), one(CELLS, "Service", name)
        h = headless["spec"]
        if h.get("clusterIP") != "None" or h.get("publishNotReadyAddresses") is not True:
            return f"{name}-headless is not headless with publishNotReadyAddresses"
        if headless["metadata"]["labels"].get("latchkey.io/service") != "headless":
            return f"{name}-headless lacks the label its ServiceMonitor selects"
        if sorted(p["name"] for p in h["ports"]) != ["client", "metrics", "peer"] or \
                [p["name"] for p in client["spec"]["ports"]] != ["client"]:
            return f"{name}: ports {h['ports']}, {client['spec']['ports']}"
        for svc in (headless, client):
            owners = [d["metadata"]["name"] for d in stss
                      if selects(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
            if owners != [name]:
                return f"Service {svc['metadata']['name']} selects the pods of {owners}"


@check("cells: a PDB per cell keeping its quorum (b 2 of 3, c 3 of 5; c with 2 learners 5 of 7), on its own pods")
def _():
    for render, want in (("cells", {"home": 2, "b": 2, "c": 3}), ("cells-production", {"home": 3, "b": 2, "c": 5})):
        docs = RENDERS[render]
        stss = [d for d in docs if d["kind"] == "StatefulSet"]
        for cell, n in want.items():
            pdb = one(docs, "PodDisruptionBudget", sts_of(cell))["spec"]
            if pdb.get("minAvailable") != n or "maxUnavailable" in pdb:
                return f"{render}: cell {cell}: minAvailable {pdb.get('minAvailable')}, want {n}"
            owners = [d["metadata"]["name"] for d in stss
                      if selects(pdb["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])]
            if owners != [sts_of(cell)]:
                return f"{render}: the PDB of cell {cell} selects the pods of {owners}"


@check("cells: still one proxy Deployment, started with the home cell's members only (LATCHKEY_CELLS)")
def _():
    for render in ("cells", "cells-production"):
        docs = RENDERS[render]
        deps = [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"]
        if deps != [PROXY]:
            return f"{render}: Deployments {deps}"
        home = int(one(docs, "StatefulSet", CELL)["spec"]["replicas"])
        want = [f"{pod_host(i)}:{ports(docs)['client']}" for i in range(home)]
        got = one(docs, "ConfigMap", PROXY)["data"]["LATCHKEY_CELLS"].split(",")
        if got != want:
            return f"{render}: LATCHKEY_CELLS={got}"


def by_key(docs):
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def but_random_key(d):
    """The object, without the random key of the chart's proxy-key Secret."""
    if d["kind"] == "Secret" and d["metadata"]["name"] == f"{RELEASE}-latchkey-proxy-key":
        return {k: v for k, v in d.items() if k != "data"}
    return d


@check("cells: every object of the default and production renders stays exactly as it was with `cells` "
       "(but the test pod, which checks the new cells too; on production, the proxies' NetworkPolicy, "
       "allowExternal=false there, and new alert groups next to the same old ones)")
def _():
    rule = ("PrometheusRule", f"{RELEASE}-latchkey")
    for render, before, after, skip in (("default", DEFAULT, CELLS, set()),
                                        ("production", PROD, CELLS_PROD, {("NetworkPolicy", PROXY), rule})):
        now = by_key(after)
        for k, d in by_key(before).items():
            if k == ("Pod", f"{RELEASE}-latchkey-test") or k in skip:
                continue
            if k not in now:
                return f"{render}: {k[0]} {k[1]} is gone"
            if but_random_key(now[k]) != but_random_key(d):
                return f"{render}: {k[0]} {k[1]} changed"
    old, new = (one(docs, *rule) for docs in (PROD, CELLS_PROD))
    if old["metadata"] != new["metadata"]:
        return "the PrometheusRule's metadata changed"
    groups = {g["name"]: g for g in new["spec"]["groups"]}
    for g in old["spec"]["groups"]:
        if groups.get(g["name"]) != g:
            return f"alert group {g['name']} changed"


def directory_container(docs, name="directory"):
    job = one(docs, "Job", DIRECTORY)
    spec = job["spec"]["template"]["spec"]
    (c,) = [c for c in containers(spec) if c["name"] == name]
    return job, spec, c


def directory_cells(env):
    """The CELLS of the directory Job: {name: body of its PUT}."""
    return {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in env["CELLS"].splitlines()}


@check("cells: the directory Job, a post-install/post-upgrade hook after the auth Job, lists each cell with "
       "its voters' client addresses and each prefix with its cell, at the proxies' HTTP Service; none without cells")
def _():
    for render, scheme in (("cells", "http"), ("cells-production", "https")):
        docs = RENDERS[render]
        job, _, c = directory_container(docs)
        ann = job["metadata"]["annotations"]
        if set(ann.get("helm.sh/hook", "").split(",")) != {"post-install", "post-upgrade"}:
            return f"{render}: hooks {ann.get('helm.sh/hook')}"
        if int(ann.get("helm.sh/hook-weight", "0")) <= 0:
            return f"{render}: the Job may run before the auth-bootstrap Job (hook weight 0)"
        env = env_of(c)
        client = ports(docs)["client"]
        want = {cell: {"endpoints": [f"{pod_host(i, sts_of(cell))}:{client}" for i in range(n)]}
                for cell, n in EXTRA.items()}
        if directory_cells(env) != want:
            return f"{render}: CELLS {env['CELLS']!r}, want {want}"
        prefixes = [json.loads(line) for line in env["PREFIXES"].splitlines()]
        if prefixes != [{"cell": "b", "prefix": "jobs/"}, {"cell": "b", "prefix": "queues/"}]:
            return f"{render}: PREFIXES {prefixes}"
        (http,) = [p["port"] for p in one(docs, "Service", PROXY)["spec"]["ports"] if p["name"] == "http"]
        if env.get("API") != f"{scheme}://{PROXY}.{NAMESPACE}.svc.{DOMAIN}:{http}":
            return f"{render}: API={env.get('API')}"
    for render in ("default", "five", "production", "learners"):
        if any(d["metadata"]["name"] == DIRECTORY for d in RENDERS[render]):
            return f"{render}: a directory Job without cells"


# curl, as the directory Job calls it: records the call, answers from
# answers.json ("METHOD /path": [[status, body], ...], the last one
# repeating; 200 by default; status 0: no connection).
CURL_STUB = r'''
import json, os, sys
args, call, i = sys.argv[1:], {"headers": [], "flags": []}, 0
valued = {"-o", "-w", "-X", "-H", "--data-binary", "--cacert", "--cert", "--key", "--connect-timeout", "--max-time"}
while i < len(args):
    if args[i] in valued:
        if args[i] == "-H":
            call["headers"].append(args[i + 1])
        else:
            call[args[i]] = args[i + 1]
        i += 2
    elif args[i].startswith("-"):
        call["flags"].append(args[i])
        i += 1
    else:
        call["url"] = args[i]
        i += 1
d = os.environ["STUB_DIR"]
with open(f"{d}/calls", "a") as f:
    f.write(json.dumps(call) + "\n")
with open(f"{d}/answers.json") as f:
    answers = json.load(f)
what = call.get("-X", "GET") + " /" + call["url"].split("://", 1)[1].split("/", 1)[1]
token = '{"token": "tok-%d", "ttl_seconds": 300}' % sum(1 for _ in open(f"{d}/calls"))
queue = answers.get(what) or [[200, token if what.endswith("/v1/auth/token") else "{}"]]
status, body = queue.pop(0) if len(queue) > 1 else queue[0]
with open(f"{d}/answers.json", "w") as f:
    json.dump(answers, f)
if status == 0:
    sys.stderr.write("curl: (7) Failed to connect\n")
    sys.stdout.write("000")
    sys.exit(7)
with open(call["-o"], "w") as f:
    f.write(body)
sys.stdout.write(str(status))
'''


def run_directory(docs, answers=None, timeout="30", pause="0", root_password=None):
    """Runs the directory Job's script with its rendered environment and a
    stub curl. Returns (calls, exit status, stderr)."""
    _, _, c = directory_container(docs)
    env = {k: v for k, v in env_of(c).items() if v is not None}
    if root_password is not None:
        env["ROOT_PASSWORD"] = root_password
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/curl", "w") as f:
            f.write(f"#!{sys.executable}\n{CURL_STUB}")
        os.chmod(f"{tmp}/curl", 0o755)
        with open(f"{tmp}/answers.json", "w") as f:
            json.dump(answers or {}, f)
        env.update(PATH=f"{tmp}:/usr/bin:/bin", TMPDIR=tmp, STUB_DIR=tmp, TIMEOUT=timeout, PAUSE=pause)
        run = subprocess.run(c["command"], env=env, capture_output=True, text=True, timeout=120)
        calls = [json.loads(line) for line in open(f"{tmp}/calls")] if os.path.exists(f"{tmp}/calls") else []
        return calls, run.returncode, run.stderr


def request(call):
    return call.get("-X", "GET") + " /" + call["url"].split("://", 1)[1].split("/", 1)[1]


@check("cells: the directory Job's script (against a stub curl) waits for the proxies' /readyz, adds b and c "
       "with their endpoints, then assigns jobs/ and queues/ to b")
def _():
    calls, status, stderr = run_directory(CELLS)
    if status != 0:
        return f"exit {status}: {stderr.strip()[-400:]}"
    env = env_of(directory_container(CELLS)[2])
    bodies = directory_cells(env)
    got = [(request(c), json.loads(c["--data-binary"]) if "--data-binary" in c else None) for c in calls]
    want = [("GET /readyz", None),
            ("PUT /v1/admin/directory/cells/b", bodies["b"]), ("PUT /v1/admin/directory/cells/c", bodies["c"]),
            ("PUT /v1/admin/directory/prefixes", {"prefix": "jobs/", "cell": "b"}),
            ("PUT /v1/admin/directory/prefixes", {"prefix": "queues/", "cell": "b"}),
            ("GET /v1/admin/directory", None)]
    if got != want:
        return f"calls {got}"
    for c in calls:
        if not c["url"].startswith(env["API"] + "/"):
            return f"called {c['url']}"
        if any(h.lower().startswith("authorization:") for h in c["headers"]) or "--cacert" in c:
            return f"a token or TLS with neither on: {c}"
        if "--data-binary" in c and "content-type: application/json" not in c["headers"]:
            return f"a JSON body without its content type: {c}"


@check("cells: the directory Job retries what may pass later (proxies not ready, no answer, 412), "
       "stops at once on a 400, and fails at its deadline")
def _():
    calls, status, stderr = run_directory(CELLS, {
        "GET /readyz": [[503, "{}"], [0, ""], [200, "{}"]],
        "PUT /v1/admin/directory/cells/b": [[412, '{"error": "precondition_failed"}'], [0, ""], [200, "{}"]]})
    n = [request(c) for c in calls]
    if status != 0 or (n.count("GET /readyz"), n.count("PUT /v1/admin/directory/cells/b"),
                       n.count("PUT /v1/admin/directory/prefixes")) != (3, 3, 2):
        return f"retries: exit {status}, calls {dict(collections.Counter(n))}: {stderr.strip()[-300:]}"
    calls, status, stderr = run_directory(CELLS, {
        "PUT /v1/admin/directory/prefixes": [[400, '{"error": "invalid_argument"}']]})
    n = [request(c) for c in calls]
    if status == 0 or "refused: 400" not in stderr or n.count("PUT /v1/admin/directory/prefixes") != 1:
        return f"a 400: exit {status}, calls {dict(collections.Counter(n))}: {stderr.strip()[-300:]}"
    calls, status, stderr = run_directory(CELLS, {
        "PUT /v1/admin/directory/cells/c": [[412, '{"error": "precondition_failed"}']]}, timeout="2", pause="1")
    n = [request(c) for c in calls]
    if status == 0 or "giving up after 2s" not in stderr or "PUT /v1/admin/directory/prefixes" in n:
        return f"the deadline: exit {status}, calls {dict(collections.Counter(n))}: {stderr.strip()[-300:]}"


@check("cells with authentication and TLS (production): the directory Job takes root's token with the auth "
       "Secret's password and sends it, over https with the members' certificate and CA; a 401 takes a new token")
def _():
    _, spec, c = directory_container(CELLS_PROD)
    refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c["env"]}
    if refs.get("ROOT_PASSWORD") != {"name": f"{RELEASE}-latchkey-auth", "key": "root-password"}:
        return f"ROOT_PASSWORD from {refs.get('ROOT_PASSWORD')}"
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    if mounts.get("tls", {}).get("mountPath") != "/etc/latchkey-tls" or \
            vols.get("tls", {}).get("secret", {}).get("secretName") != f"{RELEASE}-latchkey-cell-tls":
        return "no cell Secret at /etc/latchkey-tls"
    password = 'pa"ss\\word 1'
    calls, status, stderr = run_directory(CELLS_PROD, {
        "PUT /v1/admin/directory/cells/c": [[401, '{"error": "invalid_auth_token"}'], [200, "{}"]]},
        root_password=password)
    if status != 0:
        return f"exit {status}: {stderr.strip()[-400:]}"
    tokens = [i for i, c in enumerate(calls) if request(c) == "POST /v1/auth/token"]
    if len(tokens) != 2 or json.loads(calls[tokens[0]]["--data-binary"]) != {"name": "root", "password": password}:
        return f"token requests {[calls[i].get('--data-binary') for i in tokens]}"
    for i, c in enumerate(calls):
        if not c["url"].startswith("https://"):
            return f"plain http: {c['url']}"
        if (c.get("--cacert"), c.get("--cert"), c.get("--key")) != (
                "/etc/latchkey-tls/ca.crt", "/etc/latchkey-tls/tls.crt", "/etc/latchkey-tls/tls.key"):
            return f"{request(c)} without the members' certificate and CA"
        if request(c).startswith("PUT"):
            token = f"tok-{max(t for t in tokens if t < i) + 1}"
            if f"authorization: Bearer {token}" not in c["headers"]:
                return f"{request(c)} without the latest token ({token}): {c['headers']}"


def run_auth_init(docs, auth_on):
    """Runs the directory Job's init container with a stub etcdctl that finds
    authentication on (root's `user get` passes) or off. Returns (etcdctl
    calls, exit status, stderr)."""
    _, _, c = directory_container(docs, "auth")
    env = {k: v for k, v in env_of(c).items() if v is not None}
    env.update(ROOT_PASSWORD="rootpw", PROXY_PASSWORD="proxypw", PAUSE="0", TIMEOUT="30")
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/etcdctl", "w") as f:
            f.write(f'#!/bin/sh\necho "$*" >>{tmp}/calls\n'
                    f'case "$*" in *"--user root"*) exit {0 if auth_on else 1} ;; esac\n')
        os.chmod(f"{tmp}/etcdctl", 0o755)
        env.update(PATH=f"{tmp}:/usr/bin:/bin")
        run = subprocess.run(c["command"], env=env, capture_output=True, text=True, timeout=60)
        calls = open(f"{tmp}/calls").read().splitlines() if os.path.exists(f"{tmp}/calls") else []
        return calls, run.returncode, run.stderr


@check("cells with authentication (production): the directory Job first adds root and the proxies' user to b and c "
       "and turns authentication on there, as the auth Job does in home; where it is on, only checks")
def _():
    if any(c["name"] == "auth" for c in containers(directory_container(CELLS)[1])):
        return "an auth init container with authentication off"
    calls, status, stderr = run_auth_init(CELLS_PROD, auth_on=False)
    if status != 0:
        return f"exit {status}: {stderr.strip()[-300:]}"
    client = ports(CELLS_PROD)["client"]
    for cell, n in EXTRA.items():
        at = "--endpoints=" + ",".join(f"{pod_host(i, sts_of(cell))}:{client}" for i in range(n)) + " "
        steps = [c.split("--command-timeout=20s ", 1)[-1] for c in calls if c.startswith(at)]
        for step in ("user add root ", "user add latchkey-proxy ", "user grant-role root root",
                     "user grant-role latchkey-proxy root", "user grant-role latchkey-proxy latchkey-proxy",
                     "auth enable"):
            if not any(s.startswith(step) for s in steps):
                return f"cell {cell}: no {step.strip()!r} in {steps}"
    if len([c for c in calls if c.endswith("auth enable")]) != len(EXTRA) or any(f"{CELL}-0." in c for c in calls):
        return f"auth enable elsewhere than in b and c once each: {calls}"
    calls, status, stderr = run_auth_init(CELLS_PROD, auth_on=True)
    if status != 0 or any("auth enable" in c or "user add" in c for c in calls) or \
            sum("user get latchkey-proxy" in c for c in calls) != len(EXTRA):
        return f"with authentication on: exit {status}, calls {calls}"


@check("cells: a NetworkPolicy per cell: its peer port from its own members only, its client port from its "
       "members, the proxies, the test pod and (other cells) the directory Job; the proxies admit the directory Job")
def _():
    docs = CELLS_PROD
    p = ports(docs)
    selectors = {cell: one(docs, "StatefulSet", sts_of(cell))["spec"]["selector"]["matchLabels"] for cell in ("home", *EXTRA)}
    for cell, own in selectors.items():
        np = one(docs, "NetworkPolicy", sts_of(cell))["spec"]
        if np["podSelector"]["matchLabels"] != own:
            return f"the NetworkPolicy of cell {cell} is on other pods"

        def sources(port):
            rules = [r for r in np["ingress"] if any(x["port"] == port for x in r.get("ports", []))]
            return [f.get("podSelector", {}).get("matchLabels") for r in rules for f in r.get("from", [])]

        if sources(p["peer"]) != [own]:
            return f"cell {cell}: peer port from {sources(p['peer'])}"
        need = [own, component("proxy"), component("test")] + ([component("directory")] if cell != "home" else [])
        missing = [n for n in need if n not in sources(p["client"])]
        others = [o for o, sel in selectors.items() if o != cell and sel in sources(p["client"])]
        if missing or others:
            return f"cell {cell}: client port misses {missing}, admits the members of {others}"
    np = one(docs, "NetworkPolicy", PROXY)["spec"]
    (http,) = [x["port"] for x in one(docs, "Service", PROXY)["spec"]["ports"] if x["name"] == "http"]
    api = [f.get("podSelector", {}).get("matchLabels") for r in np["ingress"]
           if any(x["port"] == http for x in r["ports"]) for f in r.get("from", [])]
    if component("directory") not in api:
        return f"the proxies' API admits {api}, not the directory Job"


@check("cells with TLS (production): every cell's members serve and present the cell Secret, as home's do")
def _():
    (home,) = one(CELLS_PROD, "StatefulSet", CELL)["spec"]["template"]["spec"]["containers"]
    want = {k: v for k, v in env_of(home).items() if k.startswith("LATCHKEY_") and k != "LATCHKEY_PROXY_KEY_FILE"
            and re.search(r"CERT|KEY|CA_FILE", k)}
    if len(want) < 7:
        return f"home's TLS settings: {want}"
    for cell in EXTRA:
        spec = one(CELLS_PROD, "StatefulSet", sts_of(cell))["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        got = {k: env_of(c).get(k) for k in want}
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        if got != want or not mounts.get("tls", {}).get("readOnly") or \
                vols.get("tls", {}).get("secret", {}).get("secretName") != f"{RELEASE}-latchkey-cell-tls":
            return f"cell {cell}: TLS env {got}, mounts {mounts.get('tls')}"


@check("cells: a ServiceMonitor and an alert group per cell, on that cell's headless Service, with its own quorum")
def _():
    services = {d["metadata"]["name"]: d for d in CELLS_PROD if d["kind"] == "Service"}
    groups = {g["name"]: g for g in one(CELLS_PROD, "PrometheusRule", f"{RELEASE}-latchkey")["spec"]["groups"]}
    for cell, n in EXTRA.items():
        name = sts_of(cell)
        sm = one(CELLS_PROD, "ServiceMonitor", name)["spec"]
        hits = [s for s, svc in services.items() if selects(sm["selector"]["matchLabels"], svc["metadata"]["labels"])]
        if hits != [f"{name}-headless"] or [e["port"] for e in sm["endpoints"]] != ["metrics"]:
            return f"ServiceMonitor {name} scrapes {hits}"
        g = groups.get(f"latchkey-cell-{cell}")
        if not g:
            return f"no alert group latchkey-cell-{cell} in {sorted(groups)}"
        if [r["alert"] for r in g["rules"]] != [r["alert"] for r in groups["latchkey-cell"]["rules"]]:
            return f"cell {cell}'s alerts differ from home's"
        jobs = {j for r in g["rules"] for j in re.findall(r'job="([^"]+)"', r["expr"])}
        if jobs != {f"{name}-headless"}:
            return f"cell {cell}'s alerts select jobs {jobs}"
        for r in g["rules"]:
            promql_parser.parse(r["expr"])
        (quorum,) = [r["expr"] for r in g["rules"] if r["alert"] == "LatchkeyCellNoQuorum"]
        if not quorum.strip().endswith(f"< {n // 2 + 1}"):
            return f"cell {cell}: {quorum}"


failed = [n for n, why in results if why is not None]
sys.exit(1 if failed else 0)
