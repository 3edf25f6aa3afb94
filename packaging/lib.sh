# Shared by the packaging scripts (sourced, not run). Everything built lands under var/packaging/
# of the checkout (the Debian base tarball in the machine's cache, see base_store) and is reused
# while its inputs are unchanged: each product carries a key, the hash of what made it, next to it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PACKAGING=$ROOT/packaging
VAR=${GEMINI_PACKAGING_VAR:-$ROOT/var/packaging}
SUITE=bookworm
MIRROR=${GEMINI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}
mkdir -p "$VAR"

log() { echo "packaging: $*" >&2; }
die() { echo "packaging: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || die "$1 is missing (packaging/install-tools.sh installs it)"; }

# version FOLDER: the version in FOLDER/pyproject.toml, which is also the image tag.
version() {
  "$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$ROOT/$1/pyproject.toml"
}

# key FILE...: one hash over the contents of the given files, in order (not their paths, which
# differ between callers).
key() { cat "$@" | sha256sum | cut -c1-16; }

# wheelhouse: gemini-api, gemini-agent and gemini-booster built from this checkout, and every
# dependency as a wheel, into $VAR/wheelhouse. Our own wheels are rebuilt every time, from a
# clean build directory and with fixed timestamps, so that unchanged code gives the same bytes
# (and an image built from them is kept); dependencies come from pip's cache after the first.
wheelhouse() {
  local wh=$VAR/wheelhouse c
  rm -f "$wh"/gemini_*.whl
  mkdir -p "$wh"
  for c in api agent booster; do rm -rf "${ROOT:?}/$c/build"; done
  SOURCE_DATE_EPOCH=315532800 "$PYTHON" -m pip wheel --quiet --wheel-dir "$wh" \
    "$ROOT/api" "$ROOT/agent" "$ROOT/booster" >&2
  for c in api agent booster; do rm -rf "${ROOT:?}/$c/build"; done
  echo "$wh"
}

# base_store: where the base tarball is kept: $GEMINI_CACHE/packaging (/var/cache/gemini by
# default, as the trixie chroot and the Go tools are), so that a clean clone does not
# debootstrap again; var/packaging where the cache is `off` or cannot be written.
base_store() {
  local cache=${GEMINI_CACHE:-/var/cache/gemini}
  if [ "$cache" != off ] && mkdir -p "$cache/packaging" 2>/dev/null && [ -w "$cache/packaging" ]; then
    echo "$cache/packaging"
  else
    echo "$VAR"
  fi
}

# base_rootfs: Debian $SUITE, minbase variant, with Python; a tarball reused while this function
# and the package list are unchanged. Debootstrap is the only step that needs a mirror.
BASE_PACKAGES=python3,python3-venv,ca-certificates
base_rootfs() {
  local tar k
  tar=$(base_store)/base-$SUITE.tar
  k=$({ echo "$SUITE $BASE_PACKAGES"; declare -f base_rootfs; } | sha256sum | cut -c1-16)
  if [ -f "$tar" ] && [ "$(cat "$tar.key" 2>/dev/null)" = "$k" ]; then echo "$tar"; return; fi
  need debootstrap
  local dir=$VAR/base-$SUITE.d
  rm -rf "$dir"
  log "debootstrap $SUITE (minbase + $BASE_PACKAGES) from $MIRROR, log in $VAR/debootstrap.log"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$dir" "$MIRROR" \
    >"$VAR/debootstrap.log" 2>&1 || { tail -20 "$VAR/debootstrap.log" >&2; die "debootstrap failed"; }
  chroot "$dir" apt-get clean
  # documentation, manual pages and translations are of no use in an image; copyright files
  # stay, and packages installed later leave theirs out too (as Debian's slim images do)
  cat >"$dir/etc/dpkg/dpkg.cfg.d/gemini-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG
  find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$dir"/usr/share/man/* "$dir"/usr/share/info/* "$dir"/usr/share/locale/*
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/log/* "$dir"/var/cache/debconf/*-old "$dir"/dev/*
  # written aside and renamed into place: clones that share the cache may build at once
  tar -C "$dir" --numeric-owner -cf "$tar.tmp.$$" .
  mv "$tar.tmp.$$" "$tar"
  echo "$k" >"$tar.key"
  rm -rf "$dir"
  echo "$tar"
}

# in_chroot ROOTFS CMD...: run CMD inside ROOTFS with /proc and /dev, in a mount namespace of
# its own so that nothing stays mounted when it ends. The network is the host's.
in_chroot() {
  local rootfs=$1
  shift
  mkdir -p "$rootfs/proc" "$rootfs/dev"
  unshare --mount --fork -- sh -c '
    r=$1; shift
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"' sh "$rootfs" "$@"
}
