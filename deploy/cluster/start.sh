#!/usr/bin/env bash
# Starts a Kubernetes control plane on 127.0.0.1 for the chart's cluster tests: etcd,
# kube-apiserver and kube-controller-manager as built by deploy/cluster/build.sh. No kubelet and
# no scheduler: Node objects are created by hand (the DaemonSet controller places pods by their
# labels), and tests/test_cluster.py plays the kubelet's part for the pods whose end matters
# (binding them and setting their phase through the API). With `kwok` also kube-scheduler and
# kwok, whose fake kubelets take the pods on nodes annotated kwok.x-k8s.io/node=fake through
# their life cycle (Running, Ready; Jobs' pods Succeeded).
#
#   deploy/cluster/start.sh STATE_DIR [BIN_DIR [kwok]]
#
# Writes STATE_DIR/kubeconfig (a static admin token in system:masters, the CA of a certificate
# made with openssl), STATE_DIR/env (KUBECONFIG, the server's URL, token and CA file, the PIDs)
# and the components' logs, and returns once /readyz answers. Stop it with
#   kill $(cat STATE_DIR/pids)
set -euo pipefail

state=${1:?usage: start.sh STATE_DIR [BIN_DIR]}
bin=${2:-$("$(dirname "$0")/build.sh")}
mode=${3:-}
mkdir -p "$state"
state=$(cd "$state" && pwd)
pki=$state/pki
mkdir -p "$pki" "$state/etcd"

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
etcd_port=$(free_port)
peer_port=$(free_port)
api_port=$(free_port)

# A CA, the API server's certificate for loopback and the in-cluster names, and the keys that
# sign and check service-account tokens.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=gemini-test-ca \
	-keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver \
	-keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n' >"$pki/san.ext"
openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
	-CAcreateserial -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
printf '%s,admin,admin,system:masters\n' "$token" >"$pki/tokens.csv"
chmod 600 "$pki"/*.key "$pki/tokens.csv"

server=https://127.0.0.1:$api_port
cat >"$state/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
  - name: test
    cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}
users:
  - name: admin
    user: {token: "$token"}
contexts:
  - name: test
    context: {cluster: test, user: admin}
current-context: test
KUBECONFIG
chmod 600 "$state/kubeconfig"

: >"$state/pids"
"$bin/etcd" --name default --data-dir "$state/etcd" \
	--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
	--listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
	--initial-cluster "default=http://127.0.0.1:$peer_port" \
	--unsafe-no-fsync --quota-backend-bytes 1073741824 >"$state/etcd.log" 2>&1 &
echo $! >>"$state/pids"

"$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
	--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
	--client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
	--service-account-issuer https://kubernetes.default.svc \
	--service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
	--service-cluster-ip-range 10.0.0.0/24 --authorization-mode Node,RBAC --allow-privileged=true \
	--enable-priority-and-fairness=false --profiling=false >"$state/kube-apiserver.log" 2>&1 &
echo $! >>"$state/pids"

"$bin/kube-controller-manager" --kubeconfig "$state/kubeconfig" \
	--authentication-kubeconfig "$state/kubeconfig" --authorization-kubeconfig "$state/kubeconfig" \
	--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
	--service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
	--controllers '*' --node-monitor-grace-period 1h \
	>"$state/kube-controller-manager.log" 2>&1 &
echo $! >>"$state/pids"

if [ "$mode" = kwok ]; then
	"$bin/kube-scheduler" --kubeconfig "$state/kubeconfig" \
		--authentication-kubeconfig "$state/kubeconfig" --authorization-kubeconfig "$state/kubeconfig" \
		--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
		>"$state/kube-scheduler.log" 2>&1 &
	echo $! >>"$state/pids"
	"$bin/kwok" --kubeconfig "$state/kubeconfig" --config "$bin/kwok-stages.yaml" \
		--manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
		--server-address 127.0.0.1:0 >"$state/kwok.log" 2>&1 &
	echo $! >>"$state/pids"
fi

cat >"$state/env" <<ENV
KUBECONFIG=$state/kubeconfig
GEMINI_CLUSTER_SERVER=$server
GEMINI_CLUSTER_TOKEN=$token
GEMINI_CLUSTER_CA=$pki/ca.crt
GEMINI_CLUSTER_PIDS="$(tr "\n" " " <"$state/pids")"
ENV

for _ in $(seq 1 240); do
	if curl -sf --cacert "$pki/ca.crt" -H "Authorization: Bearer $token" "$server/readyz" >/dev/null; then
		echo "$state/env"
		exit 0
	fi
	for pid in $(cat "$state/pids"); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "a control-plane process exited; logs in $state" >&2
			tail -n 20 "$state"/*.log >&2
			exit 1
		fi
	done
	sleep 0.5
done
echo "kube-apiserver not ready in 120 s; logs in $state" >&2
exit 1
