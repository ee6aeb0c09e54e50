#!/usr/bin/env bash
# Bounded runs of every fuzz target of the gateway's input paths
# (gateway/fuzz, cargo-fuzz on the nightly toolchain): FUZZ_SECONDS each
# (default 60), one after the other, one process each. Prints each target's
# executions and coverage; fails if any target found a crash (its input is
# then in gateway/fuzz/artifacts/<target>/).
#
#   scripts/fuzz.sh                        # every target, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh frames
#
# Not part of scripts/test.sh (CI time): the checked-in seeds
# (gateway/fuzz/seeds/) replay through the same checks in `cargo test`
# (gateway/src/session/fuzzing/). Each run grows gateway/fuzz/corpus/
# (not checked in) and starts from it next time.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frames frame_script compressed compressed_script inflate decoders proto_command claims)
fuzz_dir=gateway/fuzz

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "cargo-fuzz needs the nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked

# Debug assertions on: overflow checks are part of what is checked.
cargo +nightly fuzz build --fuzz-dir "$fuzz_dir" --debug-assertions

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
failed=()
for target in "${targets[@]}"; do
    printf '\n== fuzz %s for %ss\n' "$target" "$seconds"
    mkdir -p "$fuzz_dir/corpus/$target"
    # The first folder gets what the run finds; the seeds are read only.
    if cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" --debug-assertions "$target" \
        "$fuzz_dir/corpus/$target" "$fuzz_dir/seeds/$target" -- \
        -max_total_time="$seconds" -timeout=20 -print_final_stats=1 \
        >"$logs/$target" 2>&1; then
        status=ok
    else
        status=CRASH
        failed+=("$target")
        grep -E 'panicked at|ERROR: |SUMMARY|Test unit written|artifact_prefix' "$logs/$target" | head -20 || true
    fi
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$target")"
    speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logs/$target")"
    # libFuzzer's last status line: edges covered (cov), features (ft), corpus.
    last="$(grep -E '^#[0-9]+' "$logs/$target" | tail -1 || true)"
    printf '%s: %s, %s executions (%s/s); %s\n' "$target" "$status" "${runs:-?}" "${speed:-?}" "$last"
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "crashes in: ${failed[*]} (inputs in $fuzz_dir/artifacts/)" >&2
    exit 1
fi
