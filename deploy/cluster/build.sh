#!/usr/bin/env bash
# Builds a Kubernetes control plane for the chart's cluster tests (tests/test_cluster.py) from
# the Go module proxy alone, no binary downloads:
#   kube-apiserver, kube-controller-manager and kube-scheduler from
#   k8s.io/kubernetes@$KUBERNETES_VERSION, etcd from go.etcd.io/etcd/server/v3@$ETCD_VERSION, and
#   kwok (sigs.k8s.io/kwok@$KWOK_VERSION: fake kubelets that take pods through their life cycle
#   on Node objects) with its "fast" node and pod stages.
#
#   deploy/cluster/build.sh        # prints the bin directory; builds only what is missing
#
# The binaries are cached by version outside the clone, in
# ${GEMINI_CACHE:-/var/cache/gemini}/cluster-$KUBERNETES_VERSION-etcd-$ETCD_VERSION/bin, so a
# machine pays for them once (about 20 min of CPU; measured here at nice 19 on two busy cores:
# kube-apiserver and kube-controller-manager 31 min wall, etcd 6, kwok 9, kube-scheduler 1).
# deploy/cluster/start.sh starts them.
#
# The k8s.io/kubernetes module zip carries neither its nested staging/ modules nor vendor/;
# its go.mod replaces every k8s.io/* staging module with ./staging/src/k8s.io/<name>, so
# those directories are filled from the published modules of the same release (v0.x.y for
# v1.x.y). etcd's server module has replace directives of its own, which `go install
# …@version` refuses, so it is built from a tiny wrapper module that requires it.
set -euo pipefail

KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.34.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
CACHE=${GEMINI_CACHE:-/var/cache/gemini}
DIR=$CACHE/cluster-$KUBERNETES_VERSION-etcd-$ETCD_VERSION
BIN=$DIR/bin
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOWORK=off
mkdir -p "$BIN"

have() { [ -x "$BIN/$1" ] && [ -f "$BIN/.$1.complete" ]; }

moddir() { # module@version -> its directory in the module cache
	GOFLAGS=-mod=mod "$GO" mod download -json "$1" |
		python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error", "no Dir")))'
}

if ! have kube-apiserver || ! have kube-controller-manager || ! have kube-scheduler; then
	src=$DIR/src/kubernetes
	if [ ! -f "$src/.complete" ]; then
		echo "fetching k8s.io/kubernetes@$KUBERNETES_VERSION" >&2
		rm -rf "$src"
		mkdir -p "$(dirname "$src")"
		cp -r "$(moddir "k8s.io/kubernetes@$KUBERNETES_VERSION")" "$src"
		chmod -R u+w "$src"
		staging_version=v0.${KUBERNETES_VERSION#v1.}
		# Every `k8s.io/<name> => ./staging/src/k8s.io/<name>` replace in go.mod.
		for name in $(sed -n 's#^[[:space:]]*k8s.io/\([a-z0-9-]*\) => ./staging/src/k8s.io/.*#\1#p' "$src/go.mod"); do
			echo "  staging k8s.io/$name@$staging_version" >&2
			rm -rf "$src/staging/src/k8s.io/$name"
			mkdir -p "$src/staging/src/k8s.io"
			cp -r "$(moddir "k8s.io/$name@$staging_version")" "$src/staging/src/k8s.io/$name"
			chmod -R u+w "$src/staging/src/k8s.io/$name"
		done
		touch "$src/.complete"
	fi
	major=${KUBERNETES_VERSION#v}
	major=${major%%.*}
	minor=${KUBERNETES_VERSION#v*.}
	minor=${minor%%.*}
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
		have "$cmd" && continue
		echo "building $cmd $KUBERNETES_VERSION" >&2
		(cd "$src" && GOFLAGS="-mod=mod -buildvcs=false" "$GO" build -trimpath -ldflags "$ldflags" \
			-o "$BIN/$cmd" "./cmd/$cmd")
		touch "$BIN/.$cmd.complete"
	done
fi

if ! have etcd; then
	echo "building etcd $ETCD_VERSION" >&2
	w=$DIR/src/etcd
	rm -rf "$w"
	mkdir -p "$w"
	cat >"$w/main.go" <<'GO'
// Command etcd is etcd's own main, built from a module that requires go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
	printf 'module gemini.local/etcd\n\ngo 1.24\n' >"$w/go.mod"
	(cd "$w" && GOFLAGS=-mod=mod "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" &&
		GOFLAGS=-mod=mod "$GO" mod tidy &&
		GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .)
	touch "$BIN/.etcd.complete"
fi
if ! have kwok || [ "$(cat "$BIN/.kwok.complete")" != "$KWOK_VERSION" ]; then
	echo "building kwok $KWOK_VERSION" >&2
	GOBIN=$BIN GOFLAGS=-buildvcs=false "$GO" install -ldflags "-s -w" \
		"sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
	# kwok does nothing without stages: node-initialize and heartbeat (nodes Ready), pod-ready,
	# pod-complete (pods of Jobs succeed) and pod-delete, from its own kustomize/stage.
	stages=$(moddir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/stage
	python3 - "$BIN/kwok-stages.yaml" "$stages"/node/fast/node-initialize.yaml \
		"$stages"/node/heartbeat/node-heartbeat.yaml "$stages"/pod/fast/pod-ready.yaml \
		"$stages"/pod/fast/pod-complete.yaml "$stages"/pod/fast/pod-delete.yaml <<'PY'
import sys
docs = [open(f).read().strip().lstrip("-").strip() for f in sys.argv[2:]]
open(sys.argv[1], "w").write("\n---\n".join(docs) + "\n")
PY
	echo "$KWOK_VERSION" >"$BIN/.kwok.complete"
fi
echo "$BIN"
