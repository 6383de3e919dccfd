#!/usr/bin/env bash
# Builds the ckf-relay runtime image (default tag ckf-relay:local) from host-built release
# binaries; see the header of deploy/Dockerfile for why and for the image layout.
#
# Usage: deploy/build-image.sh
# Environment:
#   CKF_IMAGE          image tag                         (default ckf-relay:local)
#   CKF_IMAGE_BASE     base image; `scratch` makes the script stage libc, the loader and
#                      /etc/passwd itself, anything else must provide glibc (default scratch)
#   CKF_SKIP_CARGO=1   do not run cargo; use the binaries already in the release dir
#   CKF_BIN_DIR        where the release binaries are (default: cargo's target dir + /release)
#   CKF_KEEP_DEBUG=1   keep the binaries' debug line tables (default: objcopy --strip-debug)
#   CARGO_TARGET_DIR   honoured by cargo as usual
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${CKF_IMAGE:-ckf-relay:local}"
BASE="${CKF_IMAGE_BASE:-scratch}"
BINARIES=(ckf-indexer ckf-producer ckf)

log() { printf '[build-image] %s\n' "$*" >&2; }
die() { printf '[build-image] ERROR: %s\n' "$*" >&2; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "Docker engine unreachable (docker info failed)"

cd "$ROOT"
if [[ "${CKF_SKIP_CARGO:-0}" != 1 ]]; then
    # The same command as scripts/test.sh, so that in CI (where the tests ran first) this is a
    # no-op instead of a rebuild with a different feature set.
    log "cargo build --release --workspace --bins"
    cargo build --release --workspace --bins
fi

if [[ -z "${CKF_BIN_DIR:-}" ]]; then
    target_dir="$(cargo metadata --format-version 1 --no-deps \
        | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
    [[ -n "$target_dir" ]] || die "could not read the target directory from cargo metadata"
    CKF_BIN_DIR="$target_dir/release"
fi
for b in "${BINARIES[@]}"; do
    [[ -x "$CKF_BIN_DIR/$b" ]] || die "missing release binary $CKF_BIN_DIR/$b (build it first)"
done

ctx="$(mktemp -d "${TMPDIR:-/tmp}/ckf-image.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
rootfs="$ctx/rootfs"
mkdir -p "$rootfs/usr/local/bin"
for b in "${BINARIES[@]}"; do
    install -m 0755 "$CKF_BIN_DIR/$b" "$rootfs/usr/local/bin/$b"
    # The release profile keeps line tables for backtraces; the image drops them (symbols stay,
    # so a backtrace still names functions): about 30 MB less per binary.
    if [[ "${CKF_KEEP_DEBUG:-0}" != 1 ]] && command -v objcopy >/dev/null; then
        objcopy --strip-debug "$rootfs/usr/local/bin/$b"
    fi
done

if [[ "$BASE" == scratch ]]; then
    # Every shared object the binaries load, at the path the loader looks for it, plus the loader
    # itself (its path is written into each binary's PT_INTERP). `cp -L` resolves the /lib64 and
    # merged-/usr symlinks so the image needs none of them.
    declare -A libs=()
    for b in "${BINARIES[@]}"; do
        while read -r path; do
            libs["$path"]=1
        done < <(ldd "$CKF_BIN_DIR/$b" | awk '
            $2 == "=>" && $3 ~ /^\// { print $3 }   # libc.so.6 => /lib/.../libc.so.6 (0x..)
            $1 ~ /^\// { print $1 }                  # /lib64/ld-linux-x86-64.so.2 (0x..)
            $2 == "=>" && $3 == "not" { print "MISSING:" $1 }')
    done
    for path in "${!libs[@]}"; do
        [[ "$path" != MISSING:* ]] || die "ldd: ${path#MISSING:} not found on the host"
        mkdir -p "$rootfs$(dirname "$path")"
        cp -L "$path" "$rootfs$path"
    done
    log "staged ${#libs[@]} shared objects: $(printf '%s ' "${!libs[@]}")"

    mkdir -p "$rootfs/etc" "$rootfs/tmp"
    chmod 1777 "$rootfs/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nckf:x:10001:10001:ckf-relay:/tmp:/sbin/nologin\n' \
        >"$rootfs/etc/passwd"
    printf 'root:x:0:\nckf:x:10001:\n' >"$rootfs/etc/group"
    # glibc >= 2.34 has files/dns built in; this only fixes the lookup order (docker's /etc/hosts
    # first, then the embedded DNS that resolves compose service names).
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
fi

# The producer's state directory (durability.data_dir in compose and Kubernetes): owned by the
# service user through the Dockerfile's COPY --chown, so a fresh named volume mounted there
# starts writable.
mkdir -p "$ctx/state"
printf 'ckf-producer state: the journal of [durability] data_dir (README "Operations").\n' \
    >"$ctx/state/README"

old_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
log "docker build -t $IMAGE (BASE=$BASE)"
# Plain `docker build`: works with BuildKit and with the legacy builder (no buildx here).
if ! docker build --build-arg "BASE=$BASE" -f "$ROOT/deploy/Dockerfile" -t "$IMAGE" "$ctx" \
    >"$ctx/build.log" 2>&1; then
    cat "$ctx/build.log" >&2
    die "docker build failed"
fi
new_id="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
# The image this tag replaced, now untagged: remove it unless a container still uses it.
if [[ -n "$old_id" && "$old_id" != "$new_id" ]]; then
    docker image rm "$old_id" >/dev/null 2>&1 || true
fi
log "built $IMAGE ${new_id:7:12}: $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f MB", $1/1e6}')"
