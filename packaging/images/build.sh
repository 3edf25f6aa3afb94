#!/usr/bin/env bash
# build.sh NAME...: the OCI image of each named component (booster, agent), as an OCI image
# layout under var/packaging/oci/gemini-NAME tagged with the component's version, assembled
# with umoci: no daemon, no registry. Two layers: Debian bookworm minbase with Python (shared,
# rebuilt only when its package list changes), then the component's virtualenv, system user
# and extra packages. An image whose inputs (base, wheels, definition) are unchanged is kept.
#
# Push with skopeo:  skopeo copy oci:var/packaging/oci/gemini-booster:0.1.0 docker://REGISTRY/gemini-booster:0.1.0
source "$(dirname "$0")/../lib.sh"
need umoci
need unshare

build_image() {
  local name=$1 conf=$PACKAGING/images/$1/image.conf
  [ -f "$conf" ] || die "no image definition $conf"
  # shellcheck source=/dev/null
  source "$conf"
  local tag layout k base wh
  tag=$(version "$COMPONENT")
  layout=$VAR/oci/$IMAGE
  base=$(base_rootfs)
  wh=$(wheelhouse)
  # inputs: the base, this definition and script, gemini-api, the component's own wheel and
  # every third-party wheel (the other component's wheel is none of its business)
  k=$(key "$base.key" "$conf" "$0" "$PACKAGING/lib.sh" "$wh"/gemini_api-*.whl \
    "$wh"/gemini_"$COMPONENT"-*.whl $(ls "$wh"/*.whl | grep -v /gemini_))
  if [ -f "$layout/index.json" ] && [ "$(cat "$layout.key" 2>/dev/null)" = "$k" ]; then
    log "$IMAGE:$tag is up to date ($layout)"
    return
  fi
  log "building $IMAGE:$tag"
  local work=$VAR/work/$IMAGE
  rm -rf "$layout" "$layout.key" "$work"
  mkdir -p "$work" "$(dirname "$layout")"
  umoci init --layout "$layout"

  # layer 1: the base root file system
  umoci new --image "$layout:base"
  umoci unpack --image "$layout:base" "$work/base"
  tar -C "$work/base/rootfs" --numeric-owner -xf "$base"
  umoci repack --image "$layout:base" "$work/base"
  rm -rf "$work/base"

  # layer 2: the component
  umoci unpack --image "$layout:base" "$work/app"
  local rootfs=$work/app/rootfs
  if [ ${#APT_PACKAGES[@]} -gt 0 ]; then
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    in_chroot "$rootfs" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "$@" >/dev/null && apt-get clean' sh "${APT_PACKAGES[@]}"
    rm -rf "$rootfs/etc/resolv.conf" "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/apt "$rootfs"/var/log/dpkg.log
  fi
  mkdir -p "$rootfs/tmp/wheelhouse"
  cp "$wh"/*.whl "$rootfs/tmp/wheelhouse/"
  in_chroot "$rootfs" sh -ec '
    python3 -m venv "$1"
    "$1/bin/pip" install --quiet --no-index --find-links /tmp/wheelhouse --no-cache-dir "gemini-$2"
    "$1/bin/pip" uninstall --quiet --yes pip setuptools' sh "$PREFIX" "$COMPONENT"
  rm -rf "$rootfs/tmp/wheelhouse"
  if [ -n "$RUN_USER" ]; then
    # a system account outside the dynamic range, so that it is the same uid on every build
    in_chroot "$rootfs" useradd --system -K SYS_UID_MAX="$RUN_UID" -K SYS_GID_MAX="$RUN_UID" \
      --uid "$RUN_UID" --user-group --home-dir "$HOME_DIR" --no-create-home \
      --shell /usr/sbin/nologin "$RUN_USER"
  fi
  install -d -m 0700 -o "$RUN_UID" -g "$RUN_UID" "$rootfs$HOME_DIR"
  rm -rf "$rootfs"/proc/* "$rootfs"/dev/* "$rootfs"/var/cache/ldconfig/aux-cache
  umoci repack --image "$layout:$tag" "$work/app"
  rm -rf "$work"

  local args=(--image "$layout:$tag" --config.user "$RUN_UID:$RUN_UID" --config.workingdir "$HOME_DIR"
    --clear=config.entrypoint --clear=config.cmd --clear=config.env
    --config.env "PATH=$PREFIX/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    --config.label "org.opencontainers.image.title=$IMAGE"
    --config.label "org.opencontainers.image.version=$tag"
    --config.label "org.opencontainers.image.description=$DESCRIPTION"
    --config.label "org.opencontainers.image.licenses=Apache-2.0"
    --config.label "org.opencontainers.image.revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)")
  local x
  for x in "${ENTRYPOINT[@]}"; do args+=(--config.entrypoint "$x"); done
  for x in "${CMD[@]}"; do args+=(--config.cmd "$x"); done
  for x in "${ENVIRONMENT[@]}"; do args+=(--config.env "$x"); done
  for x in "${PORTS[@]}"; do args+=(--config.exposedports "$x"); done
  for x in "${VOLUMES[@]}"; do args+=(--config.volume "$x"); done
  umoci config "${args[@]}"
  umoci rm --image "$layout:base"
  umoci gc --layout "$layout"
  echo "$k" >"$layout.key"
  log "$IMAGE:$tag built: $layout"
}

[ $# -gt 0 ] || die "usage: packaging/images/build.sh booster|agent..."
for name in "$@"; do build_image "$name"; done
