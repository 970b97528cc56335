#!/bin/sh
# Builds inferd's container image from the Dockerfile with podman or buildah (docker works
# too: `docker build .`; this script is for hosts without a docker engine).
#
#   scripts/build-image.sh                      localhost/inferd:<version>, CPU
#   scripts/build-image.sh --gpu                localhost/inferd:<version>-gpu (onnxruntime-gpu)
#   scripts/build-image.sh --allocator jemalloc with libjemalloc2 (LD_PRELOAD it: docs/deploy.md)
#   scripts/build-image.sh --debootstrap        the base from a Debian root made here by
#                                               debootstrap (root only), for hosts that
#                                               cannot pull the Python base image
#   scripts/build-image.sh --tag NAME:TAG -- --build-arg EXTRAS= --isolation chroot
#                                               anything after -- goes to the build command
#
# It fails, saying why, when neither podman nor buildah is installed or can run here (a
# sandbox without user namespaces or cgroups may allow neither).
set -eu
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
TAG=""
SUFFIX=""
ALLOCATOR=none
DEBOOTSTRAP=""
ONNXRUNTIME=onnxruntime
EXTRAS=torch
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG=$2; shift 2 ;;
        --gpu) SUFFIX=-gpu; ONNXRUNTIME=onnxruntime-gpu; EXTRAS=torch,gpu; shift ;;
        --allocator) ALLOCATOR=$2; shift 2 ;;
        --debootstrap) DEBOOTSTRAP=1; shift ;;
        --) shift; break ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "build-image: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
TAG=${TAG:-localhost/inferd:$VERSION$SUFFIX}

fail() {
    echo "build-image: $*" >&2
    exit 1
}

# The engine: podman, else buildah; each must actually run here, not just be installed.
ENGINE=""
for candidate in podman buildah; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if probe=$("$candidate" info 2>&1); then
        ENGINE=$candidate
        break
    fi
    echo "build-image: $candidate is installed but cannot run here:" >&2
    echo "$probe" | tail -n 3 >&2
done
if [ -z "$ENGINE" ]; then
    fail "no container engine can run here: install Debian's podman or buildah package" \
        "(apt-get install podman), on a host that allows user namespaces or as root"
fi

BASE_ARG=""
if [ -n "$DEBOOTSTRAP" ]; then
    [ "$(id -u)" -eq 0 ] || fail "--debootstrap needs root (debootstrap makes device nodes)"
    command -v debootstrap >/dev/null 2>&1 || fail "--debootstrap needs Debian's debootstrap package"
    ROOTFS=$(mktemp -d)
    trap 'rm -rf "$ROOTFS"' EXIT
    echo "build-image: making a Debian bookworm root with Python 3.11 (debootstrap)" >&2
    # Debian's own mirror, as debootstrap chooses it; python3 is 3.11 in bookworm.
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$ROOTFS/tree" >"$ROOTFS/debootstrap.log" 2>&1 \
        || { tail -n 20 "$ROOTFS/debootstrap.log" >&2; fail "debootstrap failed"; }
    rm -rf "$ROOTFS/tree/var/cache/apt/archives"/*.deb "$ROOTFS/tree/var/lib/apt/lists"/*
    BASE=localhost/inferd-base:bookworm
    tar -C "$ROOTFS/tree" -cf "$ROOTFS/root.tar" .
    if [ "$ENGINE" = podman ]; then
        podman import "$ROOTFS/root.tar" "$BASE" >/dev/null
    else
        container=$(buildah from scratch)
        buildah add "$container" "$ROOTFS/root.tar" / >/dev/null
        buildah commit --rm "$container" "$BASE" >/dev/null
    fi
    BASE_ARG="--build-arg=BASE_IMAGE=$BASE"
fi

echo "build-image: building $TAG with $ENGINE" >&2
# --format docker: the OCI image format has no HEALTHCHECK; Docker's keeps it.
# shellcheck disable=SC2086  # BASE_ARG is one word or none
"$ENGINE" build --format docker --file Dockerfile --tag "$TAG" \
    --build-arg "ALLOCATOR=$ALLOCATOR" --build-arg "ONNXRUNTIME=$ONNXRUNTIME" \
    --build-arg "EXTRAS=$EXTRAS" $BASE_ARG "$@" .
echo "build-image: built $TAG" >&2
