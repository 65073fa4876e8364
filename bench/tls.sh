#!/usr/bin/env bash
# TLS on the client port, oxcd against etcd 3.5.16, side by side on this
# machine: each server runs once over plaintext and once over TLS (server
# certificate, client certificates required, as kubeadm runs etcd), and
# oxbench measures put and range (serializable) with 100 clients on each.
# Rounds alternate the servers; medians are printed with the oxcd/etcd
# ratios for plaintext and TLS, so the two ratios can be compared.
#
#   bench/tls.sh [--rounds N] [--quick]
#
# Environment: OXCD, OXBENCH, ETCD (default /opt/etcd-3.5.16/etcd, installed
# by `REF_ETCD=3.5.16 ../shared/tools/ref-etcd`); PORT (default 28379) is the
# client port, PORT+1 the peer port.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
rounds=3 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "tls.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
n_put=50000 n_range=100000
[ $quick = 1 ] && n_put=5000 n_range=10000
OXCD=${OXCD:-$root/target/release/oxcd}
OXBENCH=${OXBENCH:-$root/target/release/oxbench}
ETCD=${ETCD:-/opt/etcd-3.5.16/etcd}
[ -x "$ETCD" ] || { echo "tls.sh: no etcd at $ETCD (REF_ETCD=3.5.16 ../shared/tools/ref-etcd)" >&2; exit 1; }
for b in "$OXCD" "$OXBENCH"; do
  [ -x "$b" ] || (cd "$root" && cargo build --release --bin oxcd --bin oxbench >&2)
done

work=$(mktemp -d /tmp/oxtls.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# --- a CA, a server certificate for 127.0.0.1, a client certificate ----------
pki=$work/pki
mkdir -p "$pki"
(
  cd "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca.key -subj /CN=bench-ca -days 2 -out ca.crt 2>/dev/null
  for who in server client; do
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout $who.key -subj /CN=$who -out $who.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >$who.ext
    openssl x509 -req -in $who.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile $who.ext -out $who.crt 2>/dev/null
  done
)

port=${PORT:-28379}
# start NAME SCHEME: one member of NAME (oxcd|etcd) on $port
start() {
  local bin=$OXCD tls_flags=()
  [ "$1" = etcd ] && bin=$ETCD
  if [ "$2" = https ]; then
    tls_flags=(--cert-file "$pki/server.crt" --key-file "$pki/server.key"
      --trusted-ca-file "$pki/ca.crt" --client-cert-auth)
  fi
  rm -rf "$work/data"
  "$bin" --name bench --data-dir "$work/data" \
    --listen-client-urls "$2://127.0.0.1:$port" --advertise-client-urls "$2://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((port + 1))" \
    "${tls_flags[@]}" >"$work/$1-$2.log" 2>&1 &
  pid=$!
  wait_healthy "$pid" "$work/$1-$2.log" 60 bench health --timeout 1s ||
    { echo "tls.sh: $1 ($2) did not start" >&2; exit 1; }
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }
tls_args=()
bench() { "$OXBENCH" --endpoints "127.0.0.1:$port" "${tls_args[@]}" "$@"; }
rps() { python3 -c 'import json,sys; print("%.0f" % json.loads(sys.stdin.read().splitlines()[-1])["rps"])'; }

results=$work/results
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  order="oxcd etcd"
  [ $((r % 2)) = 0 ] && order="etcd oxcd"
  for server in $order; do
    for scheme in http https; do
      tls_args=()
      [ $scheme = https ] && tls_args=(--cacert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key")
      start $server $scheme
      p=$(bench --json --conns 100 --clients 100 put --key-size 8 --val-size 256 \
        --total $n_put --sequential-keys --key-space-size 100000 | rps)
      g=$(bench --json --conns 100 --clients 100 range k --consistency s --total $n_range | rps)
      stop
      echo "$server $scheme put $p" >>"$results"
      echo "$server $scheme range $g" >>"$results"
      echo "round $r: $server $scheme put $p req/s, range $g req/s" >&2
    done
  done
done

python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    server, scheme, what, value = line.split()
    rows.setdefault((what, scheme, server), []).append(float(value))
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"{'workload':34} {'oxcd':>9} {'etcd':>9} {'ratio':>6}")
for what, label in [("put", "put, 100 clients"), ("range", "range serializable, 100 clients")]:
    for scheme in ("http", "https"):
        o, e = med[(what, scheme, "oxcd")], med[(what, scheme, "etcd")]
        print(f"{label + (' (TLS)' if scheme == 'https' else ''):34} {o:9,.0f} {e:9,.0f} {o / e:5.2f}x")
print(f"medians of {len(rows[('put', 'http', 'oxcd')])} round(s), req/s; etcd = etcd 3.5.16; TLS: "
      "server certificate, client certificates required (--client-cert-auth)")
EOF
