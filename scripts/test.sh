#!/usr/bin/env bash
# The README's test command: installs what the tests need (scripts/install-deps.sh: the
# lab's proxies, chromium, the local cluster's control plane and controllers, buildah and
# umoci for the image), then runs every test of the workspace, optimised (the `tests`
# profile: release without its link-time optimisation, Cargo.toml). Works on a fresh
# Debian machine as root, on its own or after scripts/demo.sh.
#
# With arguments (a filter, `--no-fail-fast`), they go to `cargo test` and cargo runs the
# test binaries in turn, three tests at a time. Without, the binaries are run in an
# order that keeps the two cores busy (docs/ARCHITECTURE.md, "CI's time"):
#   1. the capacity searches (tests/capacity.rs), which need the cores to themselves, alone;
#   2. the local cluster test, whose parts run in turn on one cluster and mostly wait (13%
#      of the two cores), in a process of its own, beside the other end-to-end tests three
#      at a time (most wait on proxies and timers; those that keep every core busy take a
#      lock, so one of them at a time: tests/it/common.rs, `heavy`);
#   3. when those have ended, every other test binary (each crate's unit tests, the load
#      crate's and the local cluster's own: about a minute in turn) in two lanes, the load
#      crate's end-to-end tests and the local cluster's in one, the rest in the other;
#      then the doc tests; beside the cluster test's last parts.
# Every binary runs whatever an earlier one did; the script fails if any failed, naming
# them. RUST_TEST_THREADS, if set, replaces the three.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ $# -gt 0 ]; then
    export RUST_TEST_THREADS="${RUST_TEST_THREADS:-3}"
    exec cargo test --workspace --profile tests "$@"
fi

# Each test binary as "package-directory<TAB>name<TAB>path", from cargo's build.
binaries=$(cargo test --workspace --profile tests --no-run --message-format=json-render-diagnostics |
    python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(os.path.dirname(m["manifest_path"]), m["target"]["name"], m["executable"], sep="\t")
')
failed=()
start=$SECONDS
took() { echo "test.sh: $1 ended at $((SECONDS - start)) s"; }
# Runs one test binary from its package's directory, as cargo does.
run() {
    local dir=$1 name=$2 exe=$3
    shift 3
    echo "     Running $name ($exe)"
    (cd "$dir" && "$exe" "$@") || failed+=("$name")
}
binary() { awk -F'\t' -v n="$1" '$2 == n' <<<"$binaries"; }
cluster_test=cluster::a_local_cluster_comes_up_runs_scenarios_and_goes_down_without_a_trace

IFS=$'\t' read -r dir name exe <<<"$(binary capacity)"
run "$dir" "$name" "$exe"
took "the capacity searches"

IFS=$'\t' read -r it_dir it_name it_exe <<<"$(binary it)"
cluster_log=$(mktemp)
trap 'rm -f "$cluster_log"' EXIT
echo "     Running $it_name $cluster_test ($it_exe), its output below when it ends"
(cd "$it_dir" && "$it_exe" --exact "$cluster_test" --test-threads 1 --nocapture) >"$cluster_log" 2>&1 &
cluster_pid=$!
run "$it_dir" "$it_name" "$it_exe" --skip "$cluster_test" --test-threads "${RUST_TEST_THREADS:-3}"
took "the other end-to-end tests"

# Runs the binaries named by `pick` (an awk condition on the name, $2) in turn, each
# one's output to a file of its own under $logs; the names of those that failed, to
# $logs/failed.
lane() {
    local dir name exe
    while IFS=$'\t' read -r dir name exe <&3; do
        (cd "$dir" && "$exe" >"$logs/$name" 2>&1) || echo "$name" >>"$logs/failed"
    done 3< <(awk -F'\t' "$1" <<<"$binaries")
}
logs=$(mktemp -d)
trap 'rm -rf "$cluster_log" "$logs"' EXIT
lane '$2 == "load" || $2 == "local"' &
lane_pid=$!
lane '$2 != "load" && $2 != "local" && $2 != "capacity" && $2 != "it"'
wait "$lane_pid"
while IFS=$'\t' read -r dir name exe; do
    case $name in capacity | it) continue ;; esac
    echo "     Running $name ($exe)"
    cat "$logs/$name"
done <<<"$binaries"
if [ -f "$logs/failed" ]; then
    mapfile -t lost <"$logs/failed"
    failed+=("${lost[@]}")
fi
cargo test --workspace --profile tests --doc || failed+=("doc tests")
took "the other binaries and the doc tests"

wait "$cluster_pid" || failed+=("$it_name $cluster_test")
took "the cluster test"
cat "$cluster_log"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'test.sh: failed: %s\n' "${failed[@]}" >&2
    exit 101
fi
echo "test.sh: every test binary passed"
