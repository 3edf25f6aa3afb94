#!/usr/bin/env bash
# Tools that check the Helm chart and its observability assets, all built from the Go module
# proxy at pinned versions (no binary downloads): helm, kubeconform, promtool, and the
# repository's own manifest checker (deploy/tools/manifestcheck: strict decoding into the
# Kubernetes API types and the Pod Security evaluator), plus the JSON schemas kubeconform
# validates against, generated from Kubernetes' own OpenAPI document.
#
#   deploy/install-tools.sh            # everything into var/tools (idempotent)
#
# Everything lands in var/tools/ (not committed); tests/test_helm.py and
# tests/test_observability.py look there and skip, naming what is missing, without it.
# var/tools is a symlink into $GEMINI_CACHE (/var/cache/gemini where it can be written, else
# ~/.cache/gemini; `off` keeps a plain var/tools), to tools-<hash of this script and
# deploy/tools/>: a machine builds them once for all its clones. A new entry starts from what
# var/tools held, and each tool's version marker decides what is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v3.16.4
KUBECONFORM_VERSION=v0.6.7
# The Kubernetes release whose OpenAPI document the schemas come from (same minor as the
# client-go that deploy/tools/manifestcheck pins).
KUBERNETES_VERSION=v1.31.3

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
ROOT=$PWD
TOOLS=$ROOT/var/tools
if [ "${GEMINI_CACHE:-}" != off ]; then
	cache=${GEMINI_CACHE:-/var/cache/gemini}
	{ mkdir -p "$cache" && [ -w "$cache" ]; } 2>/dev/null || cache=${XDG_CACHE_HOME:-$HOME/.cache}/gemini
	key=$(find deploy/install-tools.sh deploy/tools -type f ! -path '*/__pycache__/*' -print0 |
		sort -z | xargs -0 cat | sha256sum | cut -c1-16)
	entry=$cache/tools-$key
	if [ ! -d "$entry" ]; then
		mkdir -p "$cache"
		rm -rf "$entry.tmp"
		if [ -L "$TOOLS" ] && [ -d "$TOOLS" ]; then cp -a "$TOOLS/." "$entry.tmp"; # older inputs
		elif [ -d "$TOOLS" ]; then mv "$TOOLS" "$entry.tmp"; # tools built before the cache
		else mkdir "$entry.tmp"; fi
		mv "$entry.tmp" "$entry"
	fi
	if [ -d "$TOOLS" ] && [ ! -L "$TOOLS" ]; then rm -rf "$TOOLS"; fi
	mkdir -p "$ROOT/var"
	ln -sfn "$entry" "$TOOLS"
	touch "$entry" # in use: entries no clone has used for 30 days go
	find "$cache" -maxdepth 1 -name 'tools-*' ! -name "tools-$key" -mtime +30 -exec rm -rf {} +
fi
export GOBIN=$TOOLS/bin GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
mkdir -p "$GOBIN"


installed() { # name version-marker
	[ -x "$GOBIN/$1" ] && [ "$(cat "$GOBIN/.$1.version" 2>/dev/null)" = "$2" ]
}

build() { # name package@version [go install flags…]
	local name=$1 pkg=$2 version=${2##*@}
	shift 2
	if [ $# -gt 0 ]; then version+=" $*"; fi
	if installed "$name" "$version"; then
		return
	fi
	echo "building $name $version" >&2
	"$GO" install "$@" "$pkg"
	echo "$version" >"$GOBIN/.$name.version"
}

# helm's offline default Kubernetes version (for `helm template` and `helm lint` without a
# cluster) is v1.20.0 unless stamped at build time, as helm's own Makefile does from its
# client-go (v0.31 for helm v3.16): without it `helm template` fails the chart's kubeVersion.
HELM_K8S_MINOR=31
helm_ldflags=""
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
	helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$HELM_K8S_MINOR"
done
build helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" -ldflags="${helm_ldflags# }"
build kubeconform "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"

# Built in modules of their own whose go.mod/go.sum in the repository pin every dependency:
# our checker, and promtool (Prometheus' go.mod has replace directives, which `go install
# …@version` refuses; deploy/tools/promtool carries them). Prometheus' Go module numbers its
# releases v0.<major*100+minor>.<patch>: v0.305.1 is Prometheus 3.5.1, a long-term release.
build_in_module() { # name module-dir package
	local name=$1 dir=$2 pkg=$3 sum
	sum=$(find "$dir" -maxdepth 1 -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) \
		-print0 | sort -z | xargs -0 cat | sha256sum | cut -d' ' -f1)
	if installed "$name" "$sum"; then
		return
	fi
	echo "building $name" >&2
	(cd "$dir" && "$GO" build -mod=readonly -o "$GOBIN/$name" "$pkg")
	echo "$sum" >"$GOBIN/.$name.version"
}
build_in_module manifestcheck deploy/tools/manifestcheck .
build_in_module promtool deploy/tools/promtool github.com/prometheus/prometheus/cmd/promtool

# Schemas for kubeconform from the OpenAPI (v2) document that ships in the k8s.io/kubernetes
# module at api/openapi-spec/swagger.json: one strict, self-contained schema per kind.
schemas=$TOOLS/schemas/$KUBERNETES_VERSION
if [ ! -f "$schemas/.complete" ]; then
	echo "generating schemas for Kubernetes $KUBERNETES_VERSION" >&2
	dir=$(GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
	rm -rf "$schemas"
	python3 deploy/tools/openapi_schemas.py "$dir/api/openapi-spec/swagger.json" "$schemas"
	touch "$schemas/.complete"
fi
echo "tools in $GOBIN, schemas in $schemas" >&2
