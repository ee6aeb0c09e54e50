"""Checks on rendered Kubernetes manifests, for scripts/check-k8s.sh.

Schema validation is kubernetes-validate's job; this file does what a schema
cannot see: which objects a render holds, that they fit together (selectors,
ports, the drain arithmetic, the security settings), that the herald.toml a
render ships is accepted by the real `herald --check`, and that k8s/ renders
the same objects as the chart. Needs PyYAML (kubernetes-validate brings it).

    split RENDER OUT [--expect KIND[/NAME] ...] [--absent KIND ...]
    invariants RENDER HERALD_BINARY
    same CHART_RENDER KUSTOMIZE_RENDER [--only KIND/NAME ...]
    write-base CHART_RENDER DIR [--only KIND/NAME ...] [--file NAME] [--kustomization]
"""

import argparse
import copy
import difflib
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml

# Kinds served by CustomResourceDefinitions: no schema in kubernetes-validate.
CRD_GROUPS = ("monitoring.coreos.com/",)
# Labels Helm's own bookkeeping adds; the kustomize base has neither.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
GATEWAY_CONTAINER = "herald"


class CheckFailed(Exception):
    pass


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def ref(doc):
    return f"{doc['kind']}/{doc['metadata']['name']}"


def by_ref(docs):
    out = {}
    for d in docs:
        for key in ("apiVersion", "kind", "metadata"):
            if key not in d:
                raise CheckFailed(f"an object without {key}: {d!r:.200}")
        if not d["metadata"].get("name"):
            raise CheckFailed(f"a {d['kind']} without a name")
        if ref(d) in out:
            raise CheckFailed(f"{ref(d)} appears twice")
        out[ref(d)] = d
    return out


def is_crd_kind(doc):
    return doc["apiVersion"].startswith(CRD_GROUPS)


def cmd_split(args):
    docs = load(args.render)
    objects = by_ref(docs)
    kept = [d for d in docs if not is_crd_kind(d)]
    for d in docs:
        if is_crd_kind(d):
            print(f"   note: {ref(d)} ({d['apiVersion']}) is a custom resource: "
                  "no schema to validate it against, skipped")
    for want in args.expect or []:
        if "/" in want:
            found = want in objects
        else:
            found = any(r.startswith(want + "/") for r in objects)
        if not found:
            raise CheckFailed(f"expected {want} in the render, found {sorted(objects)}")
    for kind in args.absent or []:
        present = [r for r in objects if r.startswith(kind + "/")]
        if present:
            raise CheckFailed(f"expected no {kind} in the render, found {present}")
    with open(args.out, "w") as f:
        yaml.safe_dump_all(kept, f, sort_keys=False)
    print(f"   {len(docs)} objects: {', '.join(sorted(objects))}")


def seconds(duration):
    """humantime's common forms: 30s, 250ms, 2m, 1h, 1m 30s."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    parts = re.findall(r"(\d+)\s*([a-z]+)", duration)
    if not parts or re.sub(r"[\d\sa-z]", "", duration):
        raise CheckFailed(f"cannot read the duration {duration!r}")
    for number, unit in parts:
        if unit not in units:
            raise CheckFailed(f"unknown unit in {duration!r}")
        total += int(number) * units[unit]
    return total


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def gateway_deployments(objects):
    for d in objects.values():
        if d["kind"] != "Deployment":
            continue
        containers = d["spec"]["template"]["spec"]["containers"]
        if any(c["name"] == GATEWAY_CONTAINER for c in containers):
            yield d


def check_gateway(deploy, objects, herald):
    name = ref(deploy)
    pod = deploy["spec"]["template"]
    spec = pod["spec"]
    labels = pod["metadata"]["labels"]
    c = next(c for c in spec["containers"] if c["name"] == GATEWAY_CONTAINER)
    problems = []

    def need(ok, what):
        if not ok:
            problems.append(what)

    # Security: what the chart promises.
    psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
    need(psc.get("runAsNonRoot") is True, "pod runAsNonRoot")
    need(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccomp RuntimeDefault")
    need(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem")
    need(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation false")
    need(csc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities drop ALL")
    need(spec.get("enableServiceLinks") is False, "enableServiceLinks false")
    need("limits" in c.get("resources", {}) and "requests" in c.get("resources", {}),
         "resources with requests and limits")
    need(bool(spec.get("topologySpreadConstraints")), "topology spread")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    need(set(ports) >= {"http", "grpc"}, "container ports http and grpc")
    live = c.get("livenessProbe", {}).get("httpGet", {})
    ready = c.get("readinessProbe", {}).get("httpGet", {})
    need(live.get("path") == "/healthz" and live.get("port") == "http", "liveness GET /healthz on http")
    need(ready.get("path") == "/readyz" and ready.get("port") == "http", "readiness GET /readyz on http")

    # The configuration file: mounted where HERALD_CONFIG says.
    env = {e["name"]: e for e in c.get("env", [])}
    config_path = env.get("HERALD_CONFIG", {}).get("value")
    need(config_path is not None, "HERALD_CONFIG set")
    toml_text = None
    if config_path:
        mount_dir, key = os.path.split(config_path)
        mount = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == mount_dir), None)
        volume = mount and next((v for v in spec["volumes"] if v["name"] == mount["name"]), None)
        cm_name = volume and volume.get("configMap", {}).get("name")
        cm = objects.get(f"ConfigMap/{cm_name}")
        need(cm is not None and key in cm.get("data", {}),
             f"a ConfigMap mounted at {mount_dir} with the key {key}")
        if cm is not None:
            toml_text = cm["data"].get(key)
    if problems:
        raise CheckFailed(f"{name}: missing {'; '.join(problems)}")

    config = tomllib.loads(toml_text)
    for key, port_name in (("listen", "http"), ("grpc.listen", "grpc")):
        table = config.get("grpc", {}) if key == "grpc.listen" else config
        listen = table.get("listen", "")
        if not listen.endswith(f":{ports[port_name]}"):
            raise CheckFailed(f"{name}: {key} = {listen!r} but the {port_name} port is {ports[port_name]}")

    # The drain: preStop sleep, then up to drain_timeout, within the grace period.
    drain = seconds(config.get("shutdown", {}).get("drain_timeout", "10s"))
    sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < sleep + drain:
        raise CheckFailed(f"{name}: terminationGracePeriodSeconds {grace} < preStop {sleep} + drain {drain:g}")
    print(f"   {name}: drain fits: preStop {sleep}s + drain_timeout {drain:g}s <= grace {grace}s")

    # Services, the PDB, the HPA and ServiceMonitors point at these pods.
    services = [s for s in objects.values() if s["kind"] == "Service"
                and selects(s["spec"].get("selector", {}), labels)]
    if not services:
        raise CheckFailed(f"{name}: no Service selects its pods")
    for s in services:
        for p in s["spec"]["ports"]:
            if p.get("targetPort") not in ports:
                raise CheckFailed(f"{ref(s)}: targetPort {p.get('targetPort')} is not a container port")
    for o in objects.values():
        if o["kind"] == "PodDisruptionBudget" and not selects(o["spec"]["selector"]["matchLabels"], labels):
            raise CheckFailed(f"{ref(o)} does not select {name}'s pods")
        if o["kind"] == "HorizontalPodAutoscaler":
            target = o["spec"]["scaleTargetRef"]
            if f"{target['kind']}/{target['name']}" not in objects:
                raise CheckFailed(f"{ref(o)} scales {target['name']}, which is not rendered")
            if "replicas" in deploy["spec"]:
                raise CheckFailed(f"{name} sets replicas although {ref(o)} owns the count")
        if o["kind"] == "ServiceMonitor":
            picked = [s for s in services
                      if selects(o["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
            names = {p["name"] for s in picked for p in s["spec"]["ports"]}
            if not picked or any(e["port"] not in names for e in o["spec"]["endpoints"]):
                raise CheckFailed(f"{ref(o)} does not reach a port of {name}'s Service")

    # The real parser: herald --check with the pod's file and variables.
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for e in c.get("env", []):
        if "value" in e:
            run_env[e["name"]] = e["value"]
        else:
            secret_ref = e.get("valueFrom", {}).get("secretKeyRef", {})
            secret = objects.get(f"Secret/{secret_ref.get('name')}")
            value = (secret or {}).get("stringData", {}).get(secret_ref.get("key"))
            # A Secret the user manages: a stand-in of the right form.
            if value is None:
                value = "redis://redis.example:6379" if e["name"] == "HERALD_REDIS__URL" else "placeholder-key"
            run_env[e["name"]] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "herald.toml")
        with open(path, "w") as f:
            f.write(toml_text)
        run_env["HERALD_CONFIG"] = path
        result = subprocess.run([herald, "--check"], env=run_env, capture_output=True, text=True)
    if result.returncode != 0:
        raise CheckFailed(f"{name}: herald --check refused its configuration: "
                          f"{result.stderr.strip() or result.stdout.strip()}")
    shown = " ".join(k for k in sorted(run_env) if k.startswith("HERALD_") and k != "HERALD_CONFIG")
    broker = run_env.get("HERALD_BROKER", config.get("broker"))
    print(f"   {name}: herald --check accepts its herald.toml"
          + (f" with {shown}" if shown else "") + f" (broker {broker})")


def cmd_invariants(args):
    objects = by_ref(load(args.render))
    deployments = list(gateway_deployments(objects))
    if not deployments:
        raise CheckFailed("no herald Deployment in the render")
    for d in deployments:
        check_gateway(d, objects, args.herald)


def normalized(doc):
    doc = copy.deepcopy(doc)
    for meta in (doc["metadata"], doc.get("spec", {}).get("template", {}).get("metadata")):
        if meta and "labels" in meta:
            for label in HELM_LABELS:
                meta["labels"].pop(label, None)
    return doc


def cmd_same(args):
    chart = {r: normalized(d) for r, d in by_ref(load(args.chart)).items()}
    kustomized = {r: normalized(d) for r, d in by_ref(load(args.kustomized)).items()}
    if args.only:
        chart = {r: d for r, d in chart.items() if r in args.only}
        kustomized = {r: d for r, d in kustomized.items() if r in args.only}
        if set(chart) != set(args.only):
            raise CheckFailed(f"the chart render lacks {sorted(set(args.only) - set(chart))}")
    if set(chart) != set(kustomized):
        raise CheckFailed(f"different objects: only in the chart {sorted(set(chart) - set(kustomized))}, "
                          f"only in k8s/ {sorted(set(kustomized) - set(chart))}")
    for r in sorted(chart):
        if chart[r] != kustomized[r]:
            a = yaml.safe_dump(chart[r], sort_keys=True).splitlines()
            b = yaml.safe_dump(kustomized[r], sort_keys=True).splitlines()
            diff = "\n".join(difflib.unified_diff(a, b, "chart", "k8s", lineterm=""))
            raise CheckFailed(f"{r} differs from the chart's:\n{diff}\n"
                              "regenerate with scripts/check-k8s.sh --write-k8s")
    print(f"   same {len(chart)} objects as the chart: {', '.join(sorted(chart))}")


def cmd_write_base(args):
    """Splits a helm template output into one file per object, keeping its
    comments and dropping Helm's own labels, for k8s/."""
    with open(args.render) as f:
        text = f.read()
    header = ("# Generated from the herald chart (helm/herald) by\n"
              "# `scripts/check-k8s.sh --write-k8s`: change the chart, then regenerate.\n"
              "# scripts/check-k8s.sh fails while this differs from the chart's render.\n")
    files = []
    for chunk in re.split(r"^---\s*$", text, flags=re.M):
        doc = yaml.safe_load(chunk)
        if not doc:
            continue
        if args.only and ref(doc) not in args.only:
            continue
        lines = [l for l in chunk.strip("\n").splitlines()
                 if not l.startswith("# Source:")
                 and not re.match(r"^\s+(%s):" % "|".join(map(re.escape, HELM_LABELS)), l)]
        if args.file:
            files.append((args.file, "\n".join(lines)))
        else:
            files.append((f"{doc['kind'].lower()}.yaml", "\n".join(lines)))
    names = []
    by_name = {}
    for name, body in files:
        by_name.setdefault(name, []).append(body)
        if name not in names:
            names.append(name)
    for name in names:
        with open(os.path.join(args.dir, name), "w") as f:
            f.write(header + "---\n" + "\n---\n".join(by_name[name]) + "\n")
    if args.kustomization:
        with open(os.path.join(args.dir, "kustomization.yaml"), "w") as f:
            f.write(header + "# The chart's defaults: herald with its embedded broker, one pod.\n"
                    "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
                    + "".join(f"  - {n}\n" for n in sorted(names)))
    print(f"   wrote {', '.join(os.path.join(args.dir, n) for n in names)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("split")
    p.add_argument("render")
    p.add_argument("out")
    p.add_argument("--expect", action="append")
    p.add_argument("--absent", action="append")
    p.set_defaults(func=cmd_split)
    p = sub.add_parser("invariants")
    p.add_argument("render")
    p.add_argument("herald")
    p.set_defaults(func=cmd_invariants)
    p = sub.add_parser("same")
    p.add_argument("chart")
    p.add_argument("kustomized")
    p.add_argument("--only", action="append")
    p.set_defaults(func=cmd_same)
    p = sub.add_parser("write-base")
    p.add_argument("render")
    p.add_argument("dir")
    p.add_argument("--only", action="append")
    p.add_argument("--file")
    p.add_argument("--kustomization", action="store_true")
    p.set_defaults(func=cmd_write_base)
    args = parser.parse_args()
    try:
        args.func(args)
    except CheckFailed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
