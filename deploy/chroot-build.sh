#!/usr/bin/env bash
# Reproduce the image's build without a Docker engine: the Dockerfile's two stages
# in debootstrap chroots of the same Debian release (bookworm), each with exactly
# the packages its base image has plus those the Dockerfile installs.
#
#   sudo deploy/chroot-build.sh          # about 15 minutes on 2 cores (see README)
#
# Builder: minbase bookworm + the packages rust:*-slim-bookworm adds to
# debian:bookworm-slim (ca-certificates gcc libc6-dev wget) + the Dockerfile's
# BUILD_PACKAGES; the build context as .dockerignore leaves it; then the
# Dockerfile's `cargo build --release --locked --bin quota-worker`.
# Runtime: minbase bookworm + the Dockerfile's RUNTIME_PACKAGES, the user 10001,
# the binary; run as that user: --version, config check, and health (which must
# fail cleanly: nothing listens).
#
# A Rust toolchain cannot be downloaded here, so the host's toolchain (the version
# the Dockerfile pins) is copied in where the rust image keeps it; crates come from
# crates.io through cargo inside the chroot (verified with the host's CA bundle). The Debian mirror is the host's own
# (first URI of its apt sources), or MIRROR=... . ROOT=... (default
# /var/tmp/qw-chroot) holds the chroots; KEEP=1 keeps them afterwards.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ROOT:-/var/tmp/qw-chroot}
SUITE=bookworm
[ "$(id -u)" = 0 ] || { echo "needs root (debootstrap, chroot, mount)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }

host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] && awk '/^URIs:/ {print $2; exit}' "$f" && return
  done
  awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null
}
MIRROR=${MIRROR:-$(host_mirror)}
[ -n "$MIRROR" ] || { echo "no Debian mirror in the host's apt sources; set MIRROR" >&2; exit 1; }

# The Dockerfile is the source of truth for what each stage installs.
dockerfile_arg() { sed -n "s/^ARG $1=\"\(.*\)\"$/\1/p" "$repo/Dockerfile"; }
BUILD_PACKAGES=$(dockerfile_arg BUILD_PACKAGES)
RUNTIME_PACKAGES=$(dockerfile_arg RUNTIME_PACKAGES)
RUST_IMAGE_PACKAGES="ca-certificates gcc libc6-dev wget"
rust_version=$(sed -n 's/^FROM rust:\([0-9.]*\)-slim-bookworm AS builder$/\1/p' "$repo/Dockerfile")
host_version=$(rustc --version | awk '{print $2}')
case "$host_version" in
  "$rust_version"|"$rust_version".*) ;;
  *) echo "the Dockerfile pins Rust $rust_version; this host has $host_version" >&2; exit 1 ;;
esac

mounted=()
cleanup() {
  local m
  for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if [ "${KEEP:-0}" != 1 ]; then
    # never remove through a mount that is still there
    if mount | grep -q " $ROOT/"; then
      echo "not removing $ROOT: something is still mounted under it" >&2
    else
      rm -rf "$ROOT"
    fi
  fi
}
trap cleanup EXIT
bind() { mkdir -p "$2"; mount "${@:3}" "$1" "$2"; mounted+=("$2"); }

stage() {  # stage NAME PACKAGES...
  local dir="$ROOT/$1"; shift
  local include; include=$(echo "$@" | tr ' ' ',')
  echo "== debootstrap $SUITE into $dir, with: $*"
  debootstrap --variant=minbase --include="$include" "$SUITE" "$dir" "$MIRROR" >"$ROOT/$(basename "$dir").debootstrap.log" 2>&1 \
    || { tail -20 "$ROOT/$(basename "$dir").debootstrap.log" >&2; exit 1; }
}

mkdir -p "$ROOT"
start=$(date +%s)

# ---- builder
stage builder $RUST_IMAGE_PACKAGES $BUILD_PACKAGES
b="$ROOT/builder"
sysroot=$(rustc --print sysroot)
toolchain="/usr/local/rustup/toolchains/$rust_version-x86_64-unknown-linux-gnu"
mkdir -p "$b$toolchain" "$b/usr/local/cargo/bin"
cp -a "$sysroot/." "$b$toolchain/"
for tool in cargo rustc; do ln -sf "$toolchain/bin/$tool" "$b/usr/local/cargo/bin/$tool"; done
cp /etc/resolv.conf "$b/etc/resolv.conf"
# Where the host reaches crates.io through a TLS-inspecting proxy, its CA bundle
# (not the chroot's) is what verifies the download; cargo gets it for that alone.
cp /etc/ssl/certs/ca-certificates.crt "$b/etc/ssl/host-ca-bundle.crt"
bind proc "$b/proc" -t proc
bind /dev "$b/dev" --bind
# the build context, as .dockerignore leaves it
excludes=()
while IFS= read -r line; do
  line=${line%%#*}; line=${line%/}; [ -n "${line// }" ] && excludes+=("--exclude=./$line")
done <"$repo/.dockerignore"
mkdir -p "$b/build"
tar -C "$repo" "${excludes[@]}" -cf - . | tar -C "$b/build" -xf -
built=$(date +%s)
echo "== cargo build --release --locked --bin quota-worker (in the builder chroot)"
chroot "$b" /usr/bin/env -i HOME=/root PATH=/usr/local/cargo/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup CARGO_HTTP_CAINFO=/etc/ssl/host-ca-bundle.crt \
  sh -c 'cd /build && cargo build --release --locked --bin quota-worker && cp target/release/quota-worker /usr/local/bin/quota-worker'
echo "   built in $(( $(date +%s) - built )) s"

# ---- runtime
stage runtime $RUNTIME_PACKAGES
r="$ROOT/runtime"
chroot "$r" useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin quota
cp "$b/usr/local/bin/quota-worker" "$r/usr/local/bin/quota-worker"
bind proc "$r/proc" -t proc
as_quota() {
  chroot --userspec=10001:10001 "$r" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin \
    QUOTA_WORKER__HTTP__LISTEN=0.0.0.0:9464 "$@"
}
echo "== in the runtime chroot, as uid 10001"
as_quota quota-worker --version
as_quota quota-worker config check --strict >/dev/null 2>&1 && { echo "config check --strict passed with the built-in hash key" >&2; exit 1; }
as_quota env QUOTA_WORKER__REDIS__HASH_KEY=chroot-check quota-worker config check --strict >/dev/null
echo "config check: ok (and --strict flags the built-in hash key)"
if as_quota quota-worker health 2>"$ROOT/health.err"; then
  echo "health passed with nothing listening" >&2; exit 1
fi
echo "health, nothing listening: $(cat "$ROOT/health.err")"
echo "== done in $(( $(date +%s) - start )) s: the image's two stages build and run"
