#!/usr/bin/env bash
# Builds the OCI image of ingressbench without a Docker daemon: the release binary and the
# shared libraries it links (ldd), staged as a root filesystem, then deploy/Containerfile
# (FROM scratch) through buildah. Labelled with the version and the git revision.
#
#   bash scripts/image.sh                        # build the binary, then the image
#   bash scripts/image.sh --binary PATH          # the image of a binary already built
#   bash scripts/image.sh --push REGISTRY/ingressbench:0.1.0   # and push it (buildah push)
#   bash scripts/image.sh --stage-only DIR       # stage the context only (for docker build)
#
# The image goes into buildah's store (localhost/ingressbench:VERSION) and into an OCI
# layout, by default ~/.cache/ingressbench/image (--out DIR), tagged VERSION and latest:
# the local test cluster's node agent unpacks it from there (umoci) and runs its pods in
# it. Prints the layout's path, the tag, the digest and the size.
set -euo pipefail
cd "$(dirname "$0")/.."

binary= out="${HOME:-/root}/.cache/ingressbench/image" push= stage_only=
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --push) push=$2; shift 2 ;;
    --stage-only) stage_only=$2; shift 2 ;;
    *) echo "image.sh: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done

if [ -z "$binary" ]; then
  cargo build --release -q -p ingressbench
  binary="${CARGO_TARGET_DIR:-target}/release/ingressbench"
fi
[ -x "$binary" ] || { echo "image.sh: $binary is not an executable (build it: cargo build --release -p ingressbench)" >&2; exit 1; }
version=$("$binary" --version | awk '{print $2}')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && ! git diff --quiet HEAD 2>/dev/null; then revision="$revision-dirty"; fi

# The context: rootfs/ with the binary and every library ldd names, at the same paths.
context=${stage_only:-$(mktemp -d)}
[ -n "$stage_only" ] || trap 'rm -rf "$context"' EXIT
rm -rf "$context/rootfs"
mkdir -p "$context/rootfs/usr/local/bin"
# Without its line tables (a quarter of the size); the code is the same.
strip --strip-debug -o "$context/rootfs/usr/local/bin/ingressbench" "$binary" 2>/dev/null \
  || cp "$binary" "$context/rootfs/usr/local/bin/ingressbench"
for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
  cp -L --parents "$lib" "$context/rootfs/"
done
cp deploy/Containerfile "$context/Containerfile"
if [ -n "$stage_only" ]; then
  echo "image.sh: staged in $stage_only; build with: docker build -f deploy/Containerfile -t ingressbench:$version $stage_only"
  exit 0
fi

command -v buildah >/dev/null || { echo "image.sh: buildah is missing (apt-get install buildah umoci)" >&2; exit 1; }
# vfs and chroot: no overlay mount and no namespaces needed, and FROM scratch with COPY
# alone runs nothing inside the image.
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
name="localhost/ingressbench:$version"
# The image this replaces goes, so that the store does not grow with every build.
buildah rmi -f "$name" >/dev/null 2>&1 || true
buildah bud -q --layers=false -f "$context/Containerfile" -t "$name" \
  --label "org.opencontainers.image.title=ingressbench" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  "$context" >/dev/null
mkdir -p "$out"
for tag in "$version" latest; do
  buildah push -q "$name" "oci:$out:$tag" >/dev/null
done
# Blobs no tag names any more (an earlier build's) go.
command -v umoci >/dev/null && umoci gc --layout "$out" >/dev/null 2>&1 || true
if [ -n "$push" ]; then
  buildah push "$name" "docker://$push"
fi
digest=$(python3 -c 'import json,sys; print(next(m["digest"] for m in json.load(open(sys.argv[1]))["manifests"] if m.get("annotations",{}).get("org.opencontainers.image.ref.name")==sys.argv[2]))' "$out/index.json" "$version")
size=$(du -sk "$context/rootfs" | cut -f1)
compressed=$(buildah images --format '{{.Size}}' "$name" 2>/dev/null | head -1)
echo "image.sh: $name, revision $revision, $digest; root filesystem $((size / 1024)) MiB (${compressed:-?} in the store); in the OCI layout $out, tags $version and latest"
