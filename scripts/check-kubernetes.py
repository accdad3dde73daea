"""Checks deploy/kubernetes/ without a cluster (scripts/check-deploy.sh runs it): every
file parses as YAML, kustomization.yaml lists them all, and the Deployment keeps the
decisions docs/operations.md#kubernetes explains. Exits 1 naming each problem."""

import pathlib
import re
import sys

import yaml

root = pathlib.Path(__file__).resolve().parent.parent
here = root / "deploy" / "kubernetes"
problems = []


def check(ok, message):
    if not ok:
        problems.append(message)


docs = {}
for path in sorted(here.glob("*.yaml")):
    try:
        docs[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as err:
        problems.append(f"{path.name}: not valid YAML: {err}")
objects = {(d.get("kind"), d.get("metadata", {}).get("name")): d
           for name, ds in docs.items() if name != "kustomization.yaml" for d in ds}

kustomization = docs.get("kustomization.yaml", [{}])[0]
listed = set(kustomization.get("resources", []))
check(listed == set(docs) - {"kustomization.yaml"},
      f"kustomization.yaml lists {sorted(listed)}, the directory has {sorted(set(docs))}")

deployment = objects.get(("Deployment", "pgoutbox"))
secret = objects.get(("Secret", "pgoutbox"))
service = objects.get(("Service", "pgoutbox"))
check(deployment is not None, "no Deployment named pgoutbox")
check(secret is not None, "no Secret named pgoutbox")
check(service is not None, "no Service named pgoutbox (its name is the job label the rules expect)")
if deployment and secret and service:
    spec = deployment["spec"]
    check(spec.get("replicas") == 2, "replicas must be 2: one streams, one waits as hot standby")
    rolling = spec.get("strategy", {}).get("rollingUpdate", {})
    check(rolling.get("maxUnavailable") == 0,
          "rollingUpdate.maxUnavailable must be 0: a standby must exist before an old replica stops")
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    addr = env.get("PGOUTBOX_HTTP_ADDR", "")
    check(addr == f"0.0.0.0:{ports.get('http')}",
          f"PGOUTBOX_HTTP_ADDR {addr!r} must listen on all interfaces on the http port {ports}")
    for probe in ("livenessProbe", "readinessProbe"):
        get = container.get(probe, {}).get("httpGet", {})
        check(get.get("path") == "/healthz",
              f"{probe} must ask /healthz (a standby answers 503 on /readyz, so a rollout "
              f"would never complete), not {get.get('path')!r}")
        check(get.get("port") in ports or get.get("port") in ports.values(),
              f"{probe} port {get.get('port')!r} is not a container port {ports}")
    resources = container.get("resources", {})
    for kind in ("requests", "limits"):
        for what in ("cpu", "memory"):
            check(what in resources.get(kind, {}), f"resources.{kind}.{what} missing")
    sources = [e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e]
    check(sources == ["pgoutbox"], f"envFrom must read the Secret pgoutbox, reads {sources}")
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    check({"PGOUTBOX_DATABASE_URL", "PGOUTBOX_NATS_URL"} <= keys,
          f"the Secret must hold PGOUTBOX_DATABASE_URL and PGOUTBOX_NATS_URL, holds {sorted(keys)}")
    check(service["spec"].get("publishNotReadyAddresses") is True,
          "the Service must publish not-ready addresses, so every replica is scraped")
    check(service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items(),
          "the Service does not select the Deployment's pods")

# Every PGOUTBOX_ variable named anywhere here (comments included) is one pgoutbox reads:
# docs/configuration.md is generated from --help and tested against it.
known = set(re.findall(r"PGOUTBOX_[A-Z_]+", (root / "docs/configuration.md").read_text()))
for path in sorted(here.glob("*.yaml")):
    for name in sorted(set(re.findall(r"PGOUTBOX_[A-Z_]+", path.read_text())) - known):
        problems.append(f"{path.name}: {name} is not a pgoutbox variable (docs/configuration.md)")

for p in problems:
    print(f"deploy/kubernetes: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
