#!/usr/bin/env bash
# The README's test command: installs what the tests need (scripts/install-deps.sh: the
# lab's proxies, chromium, the local cluster's control plane and controllers, buildah and
# umoci for the image), then runs every test of the workspace in release mode. Arguments
# go to `cargo test` (a filter, `--no-fail-fast`). Works on a fresh Debian machine as root,
# on its own or after scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
exec cargo test --workspace --release "$@"
