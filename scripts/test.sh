#!/usr/bin/env bash
# The README's test command: installs what the tests need (scripts/install-deps.sh: the
# lab's proxies, chromium, the local cluster's control plane and controllers, buildah and
# umoci for the image), then runs every test of the workspace, optimised (the `tests`
# profile: release without its link-time optimisation, Cargo.toml). Arguments go to
# `cargo test` (a filter, `--no-fail-fast`). Works on a fresh Debian machine as root, on
# its own or after scripts/demo.sh.
#
# The capacity searches, which need the cores to themselves, are a test binary of their
# own that cargo runs alone (tests/capacity.rs); the end-to-end tests that keep every core
# busy hold a lock that lets one of them run at a time (tests/it/common.rs, `heavy`).
# Most end-to-end tests wait (on a cluster, a proxy, a timer: the cluster test alone used
# 13% of the two cores), so three run at once; RUST_TEST_THREADS, if set, says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-3}"
exec cargo test --workspace --profile tests "$@"
