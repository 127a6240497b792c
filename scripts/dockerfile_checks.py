"""Structural checks of the Dockerfile and .dockerignore (no docker daemon
here: nothing is built). hadolint lints the same file for the rest.

    dockerfile_checks.py [DOCKERFILE [DOCKERIGNORE]]

Prints one line per check, "ok   helm: ..." or "FAIL helm: ...: why", and
exits 1 if any failed.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
dockerfile = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "Dockerfile")
dockerignore = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, ".dockerignore")

with open(dockerfile) as f:
    # Instructions, with continuation lines joined and comments dropped.
    text = re.sub(r"\\\n", " ", "\n".join(l for l in f.read().split("\n") if not l.lstrip().startswith("#")))
instructions = [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)]
args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))

stages = []  # (image, name, [instructions])
for op, rest in instructions:
    if op == "FROM":
        m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
        stages.append((m.group(1), m.group(2), []))
    elif stages:
        stages[-1][2].append((op, rest))

results = []


def check(name, why):
    results.append(why is None)
    print(f"ok   helm: {name}" if why is None else f"FAIL helm: {name}: {why}")


def expand(image):
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)


names = {n for _, n, _ in stages if n}
external = [expand(i) for i, _, _ in stages if i not in names]
check("Dockerfile: multi-stage, the runtime stage built from neither the toolchain nor the builder",
      None if len(stages) >= 2 and stages[-1][0] not in names else f"stages {[(i, n) for i, n, _ in stages]}")
bad = [i for i in external if ":" not in i.rsplit("/", 1)[-1] or i.endswith(":latest") or "$" in i]
check("Dockerfile: every base image has a fixed tag (no latest)", f"{bad}" if bad else None)

runtime = stages[-1][2]
users = [rest.split(":")[0] for op, rest in runtime if op == "USER"]
check("Dockerfile: the runtime stage runs as a numeric non-root user",
      None if users and users[-1].isdigit() and int(users[-1]) != 0 else f"USER {users}")
health = [rest for op, rest in runtime if op == "HEALTHCHECK"]
check("Dockerfile: the runtime stage has a HEALTHCHECK that probes /healthz",
      None if health and "/healthz" in health[-1] and not health[-1].strip().upper().startswith("NONE") else f"{health}")
copied = " ".join(rest for op, rest in runtime if op == "COPY" and "--from=" in rest)
check("Dockerfile: the runtime stage gets both binaries from a build stage",
      None if "latchkey-cell" in copied and "latchkey-proxy" in copied else f"COPY --from: {copied!r}")


def dependency_layer():
    """A stage that runs a release build, then copies the sources, then
    builds both binaries again: the first build's layer holds the
    dependencies and survives source edits."""
    for _, _, ins in stages:
        builds = [k for k, (op, rest) in enumerate(ins) if op == "RUN" and "cargo build" in rest and "--release" in rest]
        sources = [k for k, (op, rest) in enumerate(ins) if op == "COPY" and "--from=" not in rest]
        if len(builds) >= 2 and any(builds[0] < c < builds[-1] for c in sources):
            last = ins[builds[-1]][1]
            if all(w in last for w in ("--locked", "latchkey-cell", "latchkey-proxy")):
                return None
            return f"the last build is not a --locked build of both binaries: {last}"
    return "no stage builds, copies the sources, then builds again"


check("Dockerfile: dependencies build in a cached layer before the sources are copied", dependency_layer())

with open(dockerignore) as f:
    ignored = {l.strip().rstrip("/") for l in f if l.strip() and not l.startswith("#")}
missing = {"target", ".git", "latchkey-data"} - ignored
check(".dockerignore leaves out target/, .git and local data", f"missing {sorted(missing)}" if missing else None)

sys.exit(0 if all(results) else 1)
