# The one Python environment of Herald's scripts, sourced by scripts/test.sh,
# scripts/check-k8s.sh and scripts/bench.sh:
#
#   . scripts/python-venv.sh
#   venv_install 'websockets>=12,<16'      # idempotent: pip runs once per list
#   export PATH="$VENV/bin:$PATH"          # python3 is now the venv's
#
# A virtual environment, not the system Python: Debian marks its Python as
# externally managed (PEP 668) and pip refuses to install into it. The venv
# lives in Cargo's target directory ($CARGO_TARGET_DIR when set, else
# target/), next to what the scripts build; `cargo clean` removes it and the
# next run makes it again. Expects to be sourced from the repository root.

# Cargo's target directory, absolute (cargo reads a relative one from here).
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$PWD/$TARGET_DIR" ;; esac
VENV="$TARGET_DIR/venv"

# venv_create: makes $VENV unless it holds a working python. A stock Debian
# python3 has no venv module (nor ensurepip) without the python3-venv
# package: installed with apt, only then.
venv_create() {
    if [ -x "$VENV/bin/python3" ] && "$VENV/bin/python3" -c '' 2>/dev/null; then return 0; fi
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        local sudo=sudo
        [ "$(id -u)" -ne 0 ] || sudo=""
        $sudo apt-get update -q
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends python3-venv
        python3 -m venv "$VENV"
    fi
}

# venv_install REQUIREMENT...: pip-installs these requirements into $VENV,
# once: a stamp named for the list records that they are there.
venv_install() {
    venv_create
    local stamp
    stamp="$VENV/.installed-$(printf '%s\n' "$@" | sha256sum | cut -c1-16)"
    [ -f "$stamp" ] && return 0
    printf -- '-- pip install %s (in %s)\n' "$*" "$VENV"
    "$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check "$@"
    printf '%s\n' "$@" > "$stamp"
}
