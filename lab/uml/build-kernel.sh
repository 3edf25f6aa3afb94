#!/usr/bin/env bash
# Build the lab's User-Mode Linux kernel from Debian's linux-source-6.1, once per set of inputs.
#
#   lab/uml/build-kernel.sh            build if needed; print the kernel tree's path
#
# The tree lands in var/uml/linux-<key>/, where <key> hashes what decides the result: the
# source package's version, config.fragment, the patches beside this script (*.patch, applied
# in name order) and this script. A tree whose inputs have not
# changed is reused as is (the `linux` binary at its top, Module.symvers from `make modules`
# for building tcp_fusion.ko against it); a changed input builds a new tree beside it and the
# old ones are removed. Debian's own user-mode-linux package has neither time travel nor a
# build tree, hence this build (about 8 minutes on 2 cores).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${GEMINI_LAB_UML_CACHE:-$REPO/var/uml}"
TARBALL=/usr/src/linux-source-6.1.tar.xz
FRAGMENT="$HERE/config.fragment"

die() { echo "build-kernel.sh: $*" >&2; exit 1; }
[ -f "$TARBALL" ] || die "$TARBALL is missing: install Debian's linux-source-6.1 (lab/install-deps.sh does)"
for tool in gcc make flex bison bc xz; do
  command -v "$tool" >/dev/null || die "$tool is missing (lab/install-deps.sh installs it)"
done
VERSION="$(dpkg-query -W -f='${Version}' linux-source-6.1 2>/dev/null || stat -c %Y "$TARBALL")"
PATCHES=("$HERE"/*.patch)
KEY="$( { echo "$VERSION"; cat "$FRAGMENT" "${PATCHES[@]}" "$HERE/build-kernel.sh"; } | sha256sum | cut -c1-16)"
TREE="$CACHE/linux-$KEY"

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9  # one build at a time; a second caller waits and then finds the tree built
if [ -f "$TREE/.lab-built" ]; then
  echo "$TREE"
  exit 0
fi

start=$(date +%s)
rm -rf "$TREE" "$TREE.partial"
mkdir -p "$TREE.partial"
echo "build-kernel.sh: extracting $TARBALL ($VERSION)" >&2
tar -xJf "$TARBALL" -C "$TREE.partial" --strip-components=1
cd "$TREE.partial"
for p in "${PATCHES[@]}"; do
  patch -p1 --quiet --forward <"$p" >&2 || die "$p does not apply to linux-source-6.1 $VERSION"
done
make -s ARCH=um defconfig >&2
scripts/kconfig/merge_config.sh -m -O . .config "$FRAGMENT" >&2
make -s ARCH=um olddefconfig >&2
# a fragment line the kernel refused (a dependency missing) is a build error, not a surprise
missing=0
while IFS= read -r line; do
  case "$line" in CONFIG_*=y) grep -qx "$line" .config || { echo "not set: $line" >&2; missing=1; } ;; esac
done <"$FRAGMENT"
[ "$missing" = 0 ] || die "config.fragment asks for options the kernel did not take (above)"
echo "build-kernel.sh: building linux and modules with $(nproc) jobs" >&2
make -s ARCH=um -j"$(nproc)" linux modules >&2
cd "$CACHE"
mv "$TREE.partial" "$TREE"
touch "$TREE/.lab-built"
for old in "$CACHE"/linux-*; do
  [ "$old" = "$TREE" ] || rm -rf "$old"
done
echo "build-kernel.sh: built in $(($(date +%s) - start)) s" >&2
echo "$TREE"
