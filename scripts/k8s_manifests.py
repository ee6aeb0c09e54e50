"""Checks on rendered Kubernetes manifests, for scripts/check-k8s.sh.

Schema validation is kubernetes-validate's job; this file does what a schema
cannot see: which objects a render holds, that they fit together (selectors,
ports, the drain arithmetic, the security settings), that the herald.toml a
render ships is accepted by the real `herald --check`, and that k8s/ renders
the same objects as the chart. Needs PyYAML (kubernetes-validate brings it).

    split RENDER OUT [--expect KIND[/NAME] ...] [--absent KIND ...]
    invariants RENDER HERALD_BINARY [--open]
    same CHART_RENDER KUSTOMIZE_RENDER [--only KIND/NAME ...]
    write-base CHART_RENDER DIR [--only KIND/NAME ...] [--file NAME] [--kustomization]
    chart-files FILES_DIR
    dev-overlay KUSTOMIZE_RENDER
"""

import argparse
import base64
import copy
import difflib
import glob
import json
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
# The pod's ports: http for clients (/ws, probes), api for the backend API and
# /metrics, grpc for the gRPC API. The last two never reach clients.
CLIENT_PORTS = {"http"}
BACKEND_PORTS = {"api", "grpc"}
# Credentials: environment variables from a Secret, never values in the
# Deployment or keys in herald.toml (a ConfigMap).
API_KEYS_ENV = "HERALD_HTTP__API_KEYS"
# Or, as the chart mounts them, a file from a Secret volume (re-read when the
# kubelet updates it: a rotation restarts nothing).
API_KEYS_FILE_ENV = "HERALD_HTTP__API_KEYS_FILE"
TOKEN_KEY_ENVS = ("HERALD_AUTH__HMAC_SECRET", "HERALD_AUTH__PUBLIC_KEY")
# The webhooks' HMAC secret (docs/hooks.md): a Secret's too, never herald.toml.
WEBHOOKS_SECRET_ENV = "HERALD_WEBHOOKS__SECRET"
SECRET_TOML_KEYS = (("http", "api_keys"), ("auth", "hmac_secret"), ("auth", "public_key"),
                    ("webhooks", "secret"))
# Stand-ins of the right form for what a Secret the user manages holds, so
# that herald --check sees the pod's configuration whole.
STAND_INS = {
    "HERALD_REDIS__URL": "redis://redis.example:6379",
    "HERALD_REDIS__PASSWORD": "stand-in-redis-password",
    "HERALD_REDIS__SENTINEL__PASSWORD": "stand-in-sentinel-password",
    WEBHOOKS_SECRET_ENV: "stand-in-webhooks-secret",
    API_KEYS_ENV: "stand-in-key-one,stand-in-key-two",
    "HERALD_AUTH__HMAC_SECRET": "stand-in-hmac-secret-0123456789abcdef0123456789abcdef",
    # An EC P-256 public key made for this check; nobody holds its private key.
    "HERALD_AUTH__PUBLIC_KEY": (
        "-----BEGIN PUBLIC KEY-----\n"
        "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE0F7Jrp0/sUPDUo6gzhO+IxZdy32L\n"
        "2eLgRq17kct02qqsQv9+nXCWJaCSHc+uz0y8om8bC+uev8FjPOOXVzKhJQ==\n"
        "-----END PUBLIC KEY-----\n"),
}

# Stand-ins for the PEM files a pod reads from a Secret it mounts (herald
# --check reads them): a self-signed CA made for this check, whose private
# key was thrown away.
STAND_IN_FILES = {
    "tls_ca": (
        "-----BEGIN CERTIFICATE-----\n"
        "MIIBpTCCAUugAwIBAgIUboLRrUY9ucylIQcjfnRYdA8WpG8wCgYIKoZIzj0EAwIw\n"
        "JzElMCMGA1UEAwwcaGVyYWxkIGNoZWNrLWs4cyBzdGFuZC1pbiBDQTAgFw0yNjEy\n"
        "MDExODE4MTlaGA8yMTI2MTEwNzE4MTgxOVowJzElMCMGA1UEAwwcaGVyYWxkIGNo\n"
        "ZWNrLWs4cyBzdGFuZC1pbiBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABOHO\n"
        "4DWlsP0XA0TsM/gQYBlfY/aNrhpIdGStpgajiGonf4HrT+oWUdGWEWi29uGjkPUB\n"
        "38oZllPDKh1Yv47BMAOjUzBRMB0GA1UdDgQWBBRqy5JTeGOi07yOxm6QOJZiazNv\n"
        "pTAfBgNVHSMEGDAWgBRqy5JTeGOi07yOxm6QOJZiazNvpTAPBgNVHRMBAf8EBTAD\n"
        "AQH/MAoGCCqGSM49BAMCA0gAMEUCICSCiKpkc570ST03i9yySk8nJehfQPxzmM6Y\n"
        "ByCi/wceAiEA7s2oCG/1WfckztjZm5apIquHfHTljwgGLjgbrRXsUBI=\n"
        "-----END CERTIFICATE-----\n"),
}


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


def secret_value(objects, secret_ref):
    """A Secret's value as the pod would read it (stringData from the chart,
    data from a kustomize secretGenerator); None for a Secret not rendered."""
    secret = objects.get(f"Secret/{secret_ref.get('name')}")
    if secret is None:
        return None
    key = secret_ref.get("key")
    if key in secret.get("stringData", {}):
        return secret["stringData"][key]
    if key in secret.get("data", {}):
        return base64.b64decode(secret["data"][key]).decode()
    raise CheckFailed(f"{ref(secret)} has no key {key}, which the pod reads")


def port_target(service, port):
    """The container port a Service port (by name or number) leads to."""
    for p in service["spec"]["ports"]:
        if port in (p.get("name"), p.get("port")):
            return p.get("targetPort")
    return None


def check_exposure(name, labels, ports, objects):
    """Clients reach only the http port; the api and grpc ports only the
    backends: by Service, Ingress, ServiceMonitor and NetworkPolicy."""
    services = [s for s in objects.values() if s["kind"] == "Service"
                and selects(s["spec"].get("selector", {}), labels)]
    if not services:
        raise CheckFailed(f"{name}: no Service selects its pods")
    for s in services:
        targets = {p.get("targetPort") for p in s["spec"]["ports"]}
        unknown = targets - set(ports)
        if unknown:
            raise CheckFailed(f"{ref(s)}: targetPort {sorted(unknown)} is not a container port")
        if targets & CLIENT_PORTS and targets & BACKEND_PORTS:
            raise CheckFailed(f"{ref(s)} carries the clients' port and the API's ({sorted(targets)}): "
                              "the API would be as exposed as the WebSocket")
        if targets & BACKEND_PORTS and s["spec"].get("type", "ClusterIP") != "ClusterIP":
            raise CheckFailed(f"{ref(s)} carries {sorted(targets)} as a {s['spec']['type']}: the API "
                              "Service must stay inside the cluster (ClusterIP)")
    carried = {p.get("targetPort") for s in services for p in s["spec"]["ports"]}
    if not {"http", "api", "grpc"} <= carried:
        raise CheckFailed(f"{name}: the Services carry {sorted(carried)}, not http, api and grpc")

    for o in objects.values():
        if o["kind"] == "Ingress":
            for rule in o["spec"].get("rules", []):
                for path in rule.get("http", {}).get("paths", []):
                    backend = path["backend"]["service"]
                    svc = objects.get(f"Service/{backend['name']}")
                    port = backend["port"].get("name", backend["port"].get("number"))
                    if svc is None or port_target(svc, port) not in CLIENT_PORTS:
                        raise CheckFailed(f"{ref(o)}: {path['path']} leads to {backend['name']}:{port}, "
                                          "not to the pods' http port")
        if o["kind"] == "ServiceMonitor":
            picked = [s for s in services
                      if selects(o["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
            for e in o["spec"]["endpoints"]:
                reached = {port_target(s, e["port"]) for s in picked} - {None}
                if reached != {"api"} or e.get("path") != "/metrics":
                    raise CheckFailed(f"{ref(o)}: endpoint {e['port']} {e.get('path')} reaches {sorted(reached)} "
                                      f"of {[ref(s) for s in picked]}, not GET /metrics on the api port")
        if o["kind"] == "NetworkPolicy" and selects(o["spec"]["podSelector"].get("matchLabels", {}), labels) \
                and "Ingress" in o["spec"].get("policyTypes", ["Ingress"]):
            opened = set()
            for rule in o["spec"].get("ingress", []):
                named = {p.get("port") for p in rule.get("ports", [])}
                for port in named:
                    if port not in ports and port not in ports.values():
                        raise CheckFailed(f"{ref(o)}: port {port} is not a container port")
                named = {n for n, number in ports.items() if n in named or number in named} \
                    if rule.get("ports") else set(ports)
                if named & BACKEND_PORTS and not rule.get("from"):
                    raise CheckFailed(f"{ref(o)}: a rule without `from` opens {sorted(named & BACKEND_PORTS)} "
                                      "to everyone")
                opened |= named
            if "http" not in opened:
                raise CheckFailed(f"{ref(o)} shuts the clients' http port")
    print(f"   {name}: clients reach only http "
          f"({', '.join(ref(s) for s in services if {p.get('targetPort') for p in s['spec']['ports']} <= CLIENT_PORTS)}); "
          f"api and grpc only inside "
          f"({', '.join(ref(s) for s in services if {p.get('targetPort') for p in s['spec']['ports']} <= BACKEND_PORTS)})")
    return services


# herald's defaults (gateway/src/config/defaults.rs) where herald.toml leaves a key out.
DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_QUEUE_BYTES = 1024 * 1024
# Each running replay holds a page of history besides its queue.
DEFAULT_REPLAY_MAX_CONCURRENT = 64
DEFAULT_REPLAY_PAGE_BYTES = 256 * 1024
# The state of an idle subscribed connection (BENCHMARKS.md: 5,984 B,
# rounded up) and an idle pod's RSS with slack (values.yaml, config.queue).
CONNECTION_STATE_BYTES = 6 * 1024
BASELINE_BYTES = 128 * 1024 * 1024
QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text):
    m = QUANTITY.match(str(text))
    if not m:
        raise CheckFailed(f"cannot read the memory quantity {text!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def check_memory_budget(name, c, config):
    """Every connection's queue full at once, plus each connection's state
    and the pod's baseline, fits the container's memory limit."""
    limit = c.get("resources", {}).get("limits", {}).get("memory")
    if limit is None:
        raise CheckFailed(f"{name}: no memory limit to fit the queues in")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    # HERALD_<KEY> overrides herald.toml (the dev overlay sets one).
    connections = int(env.get("HERALD_WEBSOCKET__MAX_CONNECTIONS")
                      or config.get("websocket", {}).get("max_connections", DEFAULT_MAX_CONNECTIONS))
    queue = int(env.get("HERALD_QUEUE__BYTES") or config.get("queue", {}).get("bytes", DEFAULT_QUEUE_BYTES))
    replay = config.get("replay", {})
    replays = int(env.get("HERALD_REPLAY__MAX_CONCURRENT")
                  or replay.get("max_concurrent", DEFAULT_REPLAY_MAX_CONCURRENT))
    page = int(env.get("HERALD_REPLAY__PAGE_BYTES") or replay.get("page_bytes", DEFAULT_REPLAY_PAGE_BYTES))
    worst = connections * (queue + CONNECTION_STATE_BYTES) + replays * page + BASELINE_BYTES
    if worst > quantity(limit):
        raise CheckFailed(f"{name}: {connections} connections x ({queue} B queue + "
                          f"{CONNECTION_STATE_BYTES} B state) + {replays} replays x {page} B page + "
                          f"{BASELINE_BYTES >> 20} MiB = "
                          f"{worst / 2**20:,.0f} MiB, over the memory limit {limit}: lower "
                          "config.queue.bytes or config.websocket.max_connections, or raise the limit")
    print(f"   {name}: memory budget {connections} x ({queue >> 10} KiB + {CONNECTION_STATE_BYTES >> 10} KiB)"
          f" + {replays} x {page >> 10} KiB + {BASELINE_BYTES >> 20} MiB = {worst / 2**20:,.0f} MiB, "
          f"{worst / quantity(limit):.0%} of the {limit} limit")


def secret_mount(c, volumes, path):
    """The Secret volume the container mounts `path` from, or None."""
    for m in c.get("volumeMounts", []):
        if path.startswith(m["mountPath"].rstrip("/") + "/"):
            volume = volumes.get(m["name"], {})
            return volume.get("secret", {}).get("secretName")
    return None


def check_credentials(name, c, volumes, config, open_ok):
    """Keys come from a Secret, and unless the render is meant to be open,
    there are API keys and a way to check clients' tokens."""
    env = {e["name"]: e for e in c.get("env", [])}
    for var in (API_KEYS_ENV, WEBHOOKS_SECRET_ENV) + TOKEN_KEY_ENVS:
        if var in env and "secretKeyRef" not in env[var].get("valueFrom", {}):
            raise CheckFailed(f"{name}: {var} is not read from a Secret")
    if API_KEYS_FILE_ENV in env:
        path = env[API_KEYS_FILE_ENV].get("value", "")
        if not secret_mount(c, volumes, path):
            raise CheckFailed(f"{name}: {API_KEYS_FILE_ENV} = {path} is on no Secret volume the pod mounts")
    for table, key in SECRET_TOML_KEYS:
        if key in config.get(table, {}):
            raise CheckFailed(f"{name}: herald.toml (a ConfigMap) holds {table}.{key}: it belongs in a Secret")
    missing = []
    if API_KEYS_ENV not in env and API_KEYS_FILE_ENV not in env:
        missing.append("API keys")
    if not any(v in env for v in TOKEN_KEY_ENVS) and not config.get("auth", {}).get("jwks_url"):
        missing.append("token key")
    if config.get("webhooks", {}).get("url") and WEBHOOKS_SECRET_ENV not in env:
        raise CheckFailed(f"{name}: webhooks.url without {WEBHOOKS_SECRET_ENV} from a Secret")
    if missing and not open_ok:
        raise CheckFailed(f"{name}: open: no {' and no '.join(missing)}")
    if not missing and open_ok:
        raise CheckFailed(f"{name}: expected an open render, but it has its keys")
    print(f"   {name}: " + (f"open as meant (no {' and no '.join(missing)})" if missing else
                            "API keys and token key from Secrets: "
                            + ", ".join([f"{v} <- {env[v]['valueFrom']['secretKeyRef']['name']}"
                                         for v in (API_KEYS_ENV,) + TOKEN_KEY_ENVS if v in env]
                                        + [f"API keys file <- {secret_mount(c, volumes, env[v]['value'])}"
                                           for v in (API_KEYS_FILE_ENV,) if v in env])
                            + (f", jwks_url {config['auth']['jwks_url']}" if config.get("auth", {}).get("jwks_url") else "")))


def check_gateway(deploy, objects, herald, open_ok=False):
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
    need(set(ports) >= CLIENT_PORTS | BACKEND_PORTS, "container ports http, api and grpc")
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
    for key, port_name in (("listen", "http"), ("http.api_listen", "api"), ("grpc.listen", "grpc")):
        table, _, field = key.rpartition(".")
        listen = (config.get(table, {}) if table else config).get(field, "")
        if not listen.endswith(f":{ports[port_name]}"):
            raise CheckFailed(f"{name}: {key} = {listen!r} but the {port_name} port is {ports[port_name]}")

    # The drain: preStop sleep, then up to drain_timeout, within the grace period.
    drain = seconds(config.get("shutdown", {}).get("drain_timeout", "10s"))
    sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < sleep + drain:
        raise CheckFailed(f"{name}: terminationGracePeriodSeconds {grace} < preStop {sleep} + drain {drain:g}")
    print(f"   {name}: drain fits: preStop {sleep}s + drain_timeout {drain:g}s <= grace {grace}s")

    check_memory_budget(name, c, config)

    # Services, the Ingress, the ServiceMonitor and NetworkPolicies: each
    # port reaches whom it should; the PDB and the HPA point at these pods.
    check_exposure(name, labels, ports, objects)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    check_credentials(name, c, volumes, config, open_ok)
    for o in objects.values():
        if o["kind"] == "PodDisruptionBudget" and not selects(o["spec"]["selector"]["matchLabels"], labels):
            raise CheckFailed(f"{ref(o)} does not select {name}'s pods")
        if o["kind"] == "HorizontalPodAutoscaler":
            target = o["spec"]["scaleTargetRef"]
            if f"{target['kind']}/{target['name']}" not in objects:
                raise CheckFailed(f"{ref(o)} scales {target['name']}, which is not rendered")
            if "replicas" in deploy["spec"]:
                raise CheckFailed(f"{name} sets replicas although {ref(o)} owns the count")

    # The real parser: herald --check with the pod's file and variables.
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for e in c.get("env", []):
        if "value" in e:
            run_env[e["name"]] = e["value"]
        elif "fieldRef" in e.get("valueFrom", {}):
            # The downward API (the pod's name): a stand-in.
            run_env[e["name"]] = "herald-stand-in-0"
        else:
            value = secret_value(objects, e.get("valueFrom", {}).get("secretKeyRef", {}))
            # A Secret the user manages: a stand-in of the right form.
            if value is None:
                if e["name"] not in STAND_INS:
                    raise CheckFailed(f"{name}: no stand-in for {e['name']} from a Secret not rendered")
                value = STAND_INS[e["name"]]
            run_env[e["name"]] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "herald.toml")
        with open(path, "w") as f:
            f.write(toml_text)
        run_env["HERALD_CONFIG"] = path
        if API_KEYS_FILE_ENV in run_env:
            # The API keys file the Secret volume holds: a stand-in.
            stand_in = os.path.join(tmp, "api-keys")
            with open(stand_in, "w") as f:
                f.write(STAND_INS[API_KEYS_ENV].replace(",", "\n") + "\n")
            run_env[API_KEYS_FILE_ENV] = stand_in
        # Files from a mounted Secret: stand-ins at the same keys.
        for key, value in config.get("redis", {}).items():
            if not key.startswith("tls_") or not value:
                continue
            if key not in STAND_IN_FILES:
                raise CheckFailed(f"{name}: no stand-in for the file redis.{key} ({value})")
            if not any(value.startswith(m["mountPath"] + "/") for m in c.get("volumeMounts", [])):
                raise CheckFailed(f"{name}: redis.{key} = {value} is on no volume the pod mounts")
            stand_in = os.path.join(tmp, key + ".pem")
            with open(stand_in, "w") as f:
                f.write(STAND_IN_FILES[key])
            run_env["HERALD_REDIS__" + key.upper()] = stand_in
        result = subprocess.run([herald, "--check"], env=run_env, capture_output=True, text=True)
    if result.returncode != 0:
        raise CheckFailed(f"{name}: herald --check refused its configuration: "
                          f"{result.stderr.strip() or result.stdout.strip()}")
    shown = " ".join(k for k in sorted(run_env) if k.startswith("HERALD_") and k != "HERALD_CONFIG")
    broker = run_env.get("HERALD_BROKER", config.get("broker"))
    print(f"   {name}: herald --check accepts its herald.toml"
          + (f" with {shown}" if shown else "") + f" (broker {broker})")


# A metric name in PromQL, and the selector braces after it if any.
PROMQL_METRIC = re.compile(r"(?<![\w:\"])((?:herald|process|kube)_[a-z0-9_]+|up)\b(\{[^}]*\})?")
RUNBOOK = "docs/runbook.md"


def check_rules(objects):
    """The PrometheusRule is this release's: every selector of the gateway's
    metrics names the API Service's job (a ServiceMonitor's job label) and
    one namespace, none matches jobs by pattern; every alert links its own
    section of the runbook."""
    rules = [o for o in objects.values() if o["kind"] == "PrometheusRule"]
    if not rules:
        return
    apis = [s for s in objects.values() if s["kind"] == "Service"
            and s["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "api"]
    if len(apis) != 1:
        raise CheckFailed(f"PrometheusRule: expected one API Service, found {[ref(s) for s in apis]}")
    job = apis[0]["metadata"]["name"]
    namespaces = set()
    alerts = 0
    for o in rules:
        for group in o["spec"]["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule.get("record")
                expr = str(rule["expr"])
                if "=~" in expr and re.search(r'job=~', expr):
                    raise CheckFailed(f"{ref(o)}: {name} matches jobs by pattern: {expr}")
                for metric, selector in PROMQL_METRIC.findall(expr):
                    if metric.startswith("kube_"):
                        continue  # joined on (namespace, pod) to the release's own series
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', selector))
                    if labels.get("job") != job or "namespace" not in labels:
                        raise CheckFailed(f"{ref(o)}: {name}: {metric}{selector} is not scoped to "
                                          f'job="{job}" and a namespace: {expr}')
                    namespaces.add(labels["namespace"])
                if "alert" in rule:
                    alerts += 1
                    url = rule.get("annotations", {}).get("runbook_url", "")
                    if not url.endswith(f"{RUNBOOK}#{rule['alert'].lower()}"):
                        raise CheckFailed(f"{ref(o)}: {name}: runbook_url {url!r} is not "
                                          f"{RUNBOOK}#{rule['alert'].lower()}")
    if len(namespaces) != 1:
        raise CheckFailed(f"PrometheusRule: selectors name namespaces {sorted(namespaces)}, not one")
    print(f"   PrometheusRule: {alerts} alerts, every selector scoped to "
          f'job="{job}", namespace="{namespaces.pop()}"; runbook_url {url.rsplit("#", 1)[0]}#<alert>')


def cmd_invariants(args):
    objects = by_ref(load(args.render))
    deployments = list(gateway_deployments(objects))
    if not deployments:
        raise CheckFailed("no herald Deployment in the render")
    for d in deployments:
        check_gateway(d, objects, args.herald, args.open)
    check_rules(objects)


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
            f.write(header + "# The chart's defaults: herald with its embedded broker, one pod. Its keys\n"
                    "# come from a Secret herald-secrets you create first (the overlay\n"
                    "# k8s/overlays/dev makes one with dev keys):\n"
                    "#   kubectl create secret generic herald-secrets \\\n"
                    "#     --from-literal=api-keys=\"$(openssl rand -hex 24)\" \\\n"
                    "#     --from-literal=hmac-secret=\"$(openssl rand -hex 32)\"\n"
                    "# api-keys: the backends' bearer keys, comma-separated; hmac-secret: the\n"
                    "# HS256 secret of clients' tokens.\n"
                    "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
                    + "".join(f"  - {n}\n" for n in sorted(names)))
    print(f"   wrote {', '.join(os.path.join(args.dir, n) for n in names)}")


def cmd_chart_files(args):
    """The chart's files/alerts.yaml (rule groups, bare or as a
    PrometheusRule) and files/dashboards/*.json parse."""
    with open(os.path.join(args.files, "alerts.yaml")) as f:
        rules = yaml.safe_load(f)
    if isinstance(rules, dict) and rules.get("kind") == "PrometheusRule":
        rules = rules["spec"]
    if not isinstance(rules, dict) or not isinstance(rules.get("groups"), list):
        raise CheckFailed("alerts.yaml: no groups list")
    dashboards = sorted(glob.glob(os.path.join(args.files, "dashboards", "*.json")))
    if not dashboards:
        raise CheckFailed("no dashboards")
    for path in dashboards:
        with open(path) as f:
            try:
                json.load(f)
            except json.JSONDecodeError as e:
                raise CheckFailed(f"{path}: {e}") from e
    print(f"   alerts.yaml: {len(rules['groups'])} rule groups; dashboards: "
          + ", ".join(os.path.basename(p) for p in dashboards))


def cmd_dev_overlay(args):
    """k8s/overlays/dev: one herald pod on the Redis broker, at the overlay's
    own Service herald-redis."""
    objects = by_ref(load(args.render))
    for r in ("Deployment/herald", "Service/herald-redis"):
        if r not in objects:
            raise CheckFailed(f"dev: no {r}")
    spec = objects["Deployment/herald"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    port = objects["Service/herald-redis"]["spec"]["ports"][0]["port"]
    want_url = f"redis://herald-redis:{port}"
    if spec.get("replicas") != 1:
        raise CheckFailed(f"dev: replicas {spec.get('replicas')}, not 1")
    if env.get("HERALD_BROKER") != "redis":
        raise CheckFailed(f"dev: HERALD_BROKER={env.get('HERALD_BROKER')}, not redis")
    if env.get("HERALD_REDIS__URL") != want_url:
        raise CheckFailed(f"dev: HERALD_REDIS__URL={env.get('HERALD_REDIS__URL')}, not {want_url}")
    print(f"   dev: 1 replica, HERALD_BROKER=redis, HERALD_REDIS__URL={want_url} (Service herald-redis)")


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
    p.add_argument("--open", action="store_true",
                   help="the render is meant to run open (auth.open): no API keys or no token key")
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
    p = sub.add_parser("chart-files")
    p.add_argument("files")
    p.set_defaults(func=cmd_chart_files)
    p = sub.add_parser("dev-overlay")
    p.add_argument("render")
    p.set_defaults(func=cmd_dev_overlay)
    args = parser.parse_args()
    try:
        args.func(args)
    except CheckFailed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
