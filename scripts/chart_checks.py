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

import base64
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


def start_script_args(docs, ordinal, running=False, has_data=False, pod_ip=None):
    """Runs the rendered start script as pod `ordinal` with the rendered
    environment. latchkey-cell and etcdctl are stubs, and so are getent,
    host, nslookup and dig, which only record that they were asked (the
    script must resolve nothing). etcdctl finds no cell, or with `running`
    a cell of the first three pods, known by their DNS names, that accepts
    a member add. `has_data`: the data directory holds a member's files.
    Returns (latchkey-cell's args, names looked up, etcdctl calls, exit
    status, stderr)."""
    sts = one(docs, "StatefulSet", CELL)
    cm = one(docs, "ConfigMap", f"{CELL}-scripts")
    (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "cell"]
    env = {k: v for k, v in env_of(container).items() if v is not None}
    env.update(POD_NAME=f"{CELL}-{ordinal}", POD_IP=pod_ip or f"10.1.0.{ordinal + 1}")
    with tempfile.TemporaryDirectory() as tmp:
        def stub(name, body):
            with open(f"{tmp}/{name}", "w") as f:
                f.write("#!/bin/sh\n" + body)
            os.chmod(f"{tmp}/{name}", 0o755)

        stub("latchkey-cell", f'for a in "$@"; do echo "$a"; done >{tmp}/args\n')
        for resolver in ("getent", "host", "nslookup", "dig"):
            stub(resolver, f'echo "{resolver} $*" >>{tmp}/names\nexit 2\n')
        peer, client = env["CELL_PEER_PORT"], env["CELL_CLIENT_PORT"]
        members = "".join(f"{i + 1}, started, {CELL}-{i}, http://{pod_host(i)}:{peer}, http://{pod_host(i)}:{client}, false\n"
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


def pod_host(i):
    return f"{CELL}-{i}.{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}"


def flag(args, name):
    return args[args.index(name) + 1]


def ports(docs):
    svc = one(docs, "Service", HEADLESS)["spec"]["ports"]
    return {p["name"]: p["port"] for p in svc}


def addresses_wrong(args, ordinal, docs, wildcard="0.0.0.0"):
    """Why the bind and advertised addresses of pod `ordinal` are wrong, or
    None: every port binds the wildcard, and the member advertises its own
    pod's DNS name for peers and clients."""
    p = ports(docs)
    want = {"--peer-addr": f"{wildcard}:{p['peer']}", "--client-addr": f"{wildcard}:{p['client']}",
            "--metrics-addr": f"{wildcard}:{p['metrics']}",
            "--advertise-peer-addr": f"{pod_host(ordinal)}:{p['peer']}",
            "--advertise-client-addr": f"{pod_host(ordinal)}:{p['client']}"}
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


@check("the proxies' key: members and proxies read one Secret's proxy.key from a read-only mount, "
       "in every render; the chart's Secret is random and kept on upgrade")
def _():
    secret = f"{RELEASE}-latchkey-proxy-key"
    flags = declared_env("cell/src/config.rs") & declared_env("proxy/src/config.rs")
    if "LATCHKEY_PROXY_KEY_FILE" not in flags:
        return "latchkey-cell and latchkey-proxy do not both take LATCHKEY_PROXY_KEY_FILE"
    for render, docs in RENDERS.items():
        for kind, name in (("StatefulSet", CELL), ("Deployment", PROXY)):
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


failed = [n for n, why in results if why is not None]
sys.exit(1 if failed else 0)
