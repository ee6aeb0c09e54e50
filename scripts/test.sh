#!/usr/bin/env bash
# Herald's whole test suite, on a fresh Debian machine with a Rust toolchain:
# installs what the tests need, checks formatting and lints, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n== %s\n' "$*"; }

say "test dependencies"
# Debian packages the tests run, installed only when missing: redis-server
# and redis-cli (the cluster tests start their own Redis, over TLS too, and
# its sentinels: `redis-server --sentinel` is the binary Debian's
# redis-sentinel package links to, without that package's service on 26379),
# prometheus and promtool (the observability test scrapes herald with a real
# Prometheus), ip and tc (the Redis fault tests put Redis in a network
# namespace behind `tc netem` when run as root on a kernel with netem;
# otherwise a proxy in the test process plays the bad network), chromium (the
# TypeScript SDK's browser tests drive Debian's Chromium, headless, through
# playwright-core, which never downloads a browser of its own), node and npm
# (that SDK's build and tests; Node >= 20).
missing=()
{ command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || missing+=(redis-server redis-tools)
{ command -v ip && command -v tc; } >/dev/null 2>&1 || missing+=(iproute2)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || missing+=(prometheus)
[ -x /usr/bin/chromium ] || missing+=(chromium)
{ command -v node && command -v npm; } >/dev/null 2>&1 || missing+=(nodejs npm)
# setpriv (util-linux, essential on Debian): every process a test starts
# (herald, redis-server, Prometheus) runs under `setpriv --pdeathsig KILL`,
# so that a test process killed outright takes them with it.
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
redis-server --version
prometheus --version 2>&1 | sed -n 1p
/usr/bin/chromium --version
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || { echo "node $(node --version): the TypeScript SDK needs Node >= 20" >&2; exit 1; }
echo "node $(node --version), npm $(npm --version)"
# Python packages go in the scripts' venv (scripts/python-venv.sh: Debian's
# own Python refuses pip installs), whose bin/ comes first on PATH from here
# on, so that the tests' `python3` is the venv's. The Python client test talks
# to herald through `websockets`; the auth tests mint their tokens with PyJWT
# (an implementation other than ours), its RS/ES algorithms and test keys
# coming from `cryptography`. The conformance test runs Autobahn|Testsuite's
# cases with `kosoku` (a Python 3 runner of them, its core in a binary wheel).
. scripts/python-venv.sh
venv_install 'websockets>=12,<16' 'pyjwt[crypto]>=2.8,<3' 'kosoku==0.1.0'
export PATH="$VENV/bin:$PATH"
python3 -c 'import websockets, jwt, cryptography, kosoku, sys
print("python", sys.prefix, "websockets", websockets.__version__, "pyjwt", jwt.__version__,
      "cryptography", cryptography.__version__)'

scripts/check-k8s.sh    # section "kubernetes manifests": helm, kustomize, schemas

say "format"
cargo fmt --all --check

say "lints"
# Also checks the code against `rust-version` (Cargo.toml, 1.88: let-chains):
# clippy's incompatible_msrv refuses any std API stabilised after it. The
# workspace lints deny unwrap/expect outside tests (clippy.toml).
cargo clippy --workspace --all-targets --locked -- -D warnings
# No cycle between a crate's top-level modules (gateway, router): data flows one way.
python3 scripts/module-deps.py
# No file over 600 lines outside its tests (every crate's src/): one noun per
# file. The doctests are the script's own tests.
python3 -m doctest scripts/file_size.py
python3 scripts/file_size.py

say "docs"
# Intra-doc links are checked, so that the maps in the crate roots (the path
# of a publish, of a replay) cannot drift from the code. Private items are
# documented too: the maps name modules a reader of the code needs.
RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" \
    cargo doc --workspace --no-deps --document-private-items --locked --quiet

say "tests"
if cargo nextest --version >/dev/null 2>&1; then
    # nextest runs no doctests; run them first so that its summary closes the Rust tests.
    cargo test --workspace --locked --doc
    cargo nextest run --workspace --locked --profile "${NEXTEST_PROFILE:-default}"
else
    # The gateway's tests are one binary, run on threads of one process: the
    # rollout proof, which needs the whole machine (.config/nextest.toml),
    # runs alone after the rest.
    cargo test --workspace --locked -- --skip rollout::
    cargo test --locked -p gateway --test it -- rollout::
fi

say "TypeScript SDK (clients/js): Node and headless Chromium against the herald binary"
clients/js/test.sh
