#!/usr/bin/env bash
# build.sh [agent] [dkms]: the Debian packages (both by default), into var/packaging/debs/:
#   gemini-agent_<version>_amd64.deb   the agent's virtualenv taken from the agent image (the same
#                                      files the image runs; built for Debian's Python 3.11), its
#                                      systemd unit and /etc/gemini/agent.toml (a conffile)
#   gemini-fusion-dkms_<version>_all.deb  fusion-kmod's sources and dkms.conf under
#                                      /usr/src/<name>-<version>, loaded at boot (modules-load.d)
# Builds the agent image first if it is not there (packaging/images/build.sh agent).
source "$(dirname "$0")/../lib.sh"
need dpkg-deb
OUT=$VAR/debs
DEB=$PACKAGING/debian
mkdir -p "$OUT"

# fill TEMPLATE: @VERSION@, @DKMS_NAME@ and @SIZE@ (KiB under the staging root) replaced.
fill() {
  sed -e "s|@VERSION@|$VERSION|g" -e "s|@DKMS_NAME@|${DKMS_NAME:-}|g" -e "s|@SIZE@|$SIZE|g" "$1"
}

# control STAGE PKGDIR: DEBIAN/ from the package's templates; maintainer scripts 0755.
control() {
  local stage=$1 pkg=$2 f
  SIZE=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
  install -d -m 0755 "$stage/DEBIAN"
  fill "$pkg/control" >"$stage/DEBIAN/control"
  for f in conffiles postinst prerm postrm; do
    [ -f "$pkg/$f" ] || continue
    fill "$pkg/$f" >"$stage/DEBIAN/$f"
    case $f in conffiles) chmod 0644 "$stage/DEBIAN/$f" ;; *) chmod 0755 "$stage/DEBIAN/$f" ;; esac
  done
}

docs() {
  local stage=$1 name=$2
  install -d -m 0755 "$stage/usr/share/doc/$name"
  printf 'Gemini (%s)\nLicense: %s\n' "$name" "$3" >"$stage/usr/share/doc/$name/copyright"
}

build_agent() {
  VERSION=$(version agent)
  "$PACKAGING/images/build.sh" agent
  local stage=$VAR/work/deb-agent bundle=$VAR/work/deb-agent-bundle
  rm -rf "$stage" "$bundle"
  umoci unpack --image "$VAR/oci/gemini-agent:$VERSION" "$bundle" >/dev/null
  install -d -m 0755 "$stage/opt" "$stage/usr/bin" "$stage/lib/systemd/system" "$stage/etc/gemini"
  cp -a "$bundle/rootfs/opt/gemini-agent" "$stage/opt/gemini-agent"
  rm -rf "$bundle"
  ln -s /opt/gemini-agent/bin/gemini-agent "$stage/usr/bin/gemini-agent"
  install -m 0644 "$PACKAGING/systemd/gemini-agent.service" "$stage/lib/systemd/system/"
  install -m 0600 "$PACKAGING/etc/agent.toml" "$stage/etc/gemini/agent.toml"
  docs "$stage" gemini-agent Apache-2.0
  control "$stage" "$DEB/gemini-agent"
  dpkg-deb --root-owner-group -Zxz --build "$stage" "$OUT/gemini-agent_${VERSION}_amd64.deb" >&2
  rm -rf "$stage"
}

build_dkms() {
  local conf=$ROOT/fusion-kmod/dkms.conf
  DKMS_NAME=$(sed -n 's/^PACKAGE_NAME="\(.*\)"/\1/p' "$conf")
  VERSION=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$conf")
  [ -n "$DKMS_NAME" ] && [ -n "$VERSION" ] || die "$conf names no PACKAGE_NAME and PACKAGE_VERSION"
  local stage=$VAR/work/deb-dkms src
  rm -rf "$stage"
  src=$stage/usr/src/$DKMS_NAME-$VERSION
  install -d -m 0755 "$src" "$stage/usr/lib/modules-load.d"
  # the module's sources only: not build products (*.mod.c among them) nor helper scripts
  (cd "$ROOT/fusion-kmod" && for f in Kbuild Makefile dkms.conf *.c *.h; do
    case $f in *.mod.c) continue ;; esac
    install -m 0644 "$f" "$src/$f"
  done)
  install -m 0644 "$DEB/gemini-fusion-dkms/modules-load.conf" "$stage/usr/lib/modules-load.d/gemini-fusion.conf"
  docs "$stage" gemini-fusion-dkms GPL-2.0
  control "$stage" "$DEB/gemini-fusion-dkms"
  dpkg-deb --root-owner-group -Zxz --build "$stage" "$OUT/gemini-fusion-dkms_${VERSION}_all.deb" >&2
  rm -rf "$stage"
}

[ $# -gt 0 ] || set -- agent dkms
for what in "$@"; do
  case $what in
    agent) build_agent ;;
    dkms) build_dkms ;;
    *) die "usage: packaging/debian/build.sh [agent] [dkms]" ;;
  esac
done
