#!/usr/bin/env bash
# Many leases expiring at once under a steady writer, oxcd vs etcd 3.5.16
# (the reference; etcd 3.5.1 and 3.4.23 on request), each a single member
# with a fresh data dir and the same flags: how long the mass expiry takes
# and the writer's latency during it (oxbench lease-expire). The table shows
# medians of the rounds with the ratio oxcd/3.5.16 (and oxcd/3.5.1 when 3.5.1
# ran).
#
#   bench/lease-expiry.sh [--leases N] [--ttl S] [--put-rate R] [--rounds N]
#                         [--only oxcd,etcd3516,etcd35,etcd34]
#
#   defaults: 10,000 leases of 5 s, a writer at 200 puts/s; one round (rounds
#   alternate the server order); --only oxcd,etcd3516
#
# Environment: OXCD, OXBENCH, ETCD3516, ETCD35, ETCD34 override the binaries
# (ETCD3516: default /opt/etcd-3.5.16/etcd, installed by
# `REF_ETCD=3.5.16 ../shared/tools/ref-etcd` when missing); PORT (default
# 23790) is the client port, PORT+1 the peer port.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
leases=10000 ttl=5 put_rate=200 rounds=1 only=oxcd,etcd3516
while [ $# -gt 0 ]; do
  case "$1" in
    --leases) leases=$2; shift 2 ;;
    --ttl) ttl=$2; shift 2 ;;
    --put-rate) put_rate=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "lease-expiry.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
bench_positive lease-expiry.sh leases ttl put_rate rounds
ref_etcd=$root/../shared/tools/ref-etcd
oxbench=${OXBENCH:-$root/target/release/oxbench}
bench_build_oxbench "$oxbench"
bench_select_servers lease-expiry.sh oxcd,etcd3516,etcd35,etcd34
bench_server_binaries lease-expiry.sh
port=${PORT:-23790}
endpoint=127.0.0.1:$port peer=127.0.0.1:$((port + 1))
work=$(mktemp -d /tmp/oxlease.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
results=$work/results
: >"$results"

# measure SERVER: a fresh member, one lease-expire run.
measure() {
  local s=$1
  if "$oxbench" --endpoints "$endpoint" --dial-timeout 200ms health --timeout 300ms >/dev/null 2>&1; then
    echo "lease-expiry.sh: something already answers on $endpoint" >&2; exit 1
  fi
  rm -rf "$work/data"
  "$(server_bin "$s")" --name bench --data-dir "$work/data" \
    --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
    --listen-peer-urls "http://$peer" --initial-advertise-peer-urls "http://$peer" \
    --initial-cluster "bench=http://$peer" >>"$work/$s.log" 2>&1 &
  pid=$!
  wait_healthy "$pid" "$work/$s.log" 60 "$oxbench" --endpoints "$endpoint" health --timeout 1s ||
    { echo "lease-expiry.sh: $s did not start" >&2; exit 1; }
  if ! "$oxbench" --endpoints "$endpoint" --clients 50 --conns 5 --json lease-expire \
      --leases "$leases" --ttl "$ttl" --put-rate "$put_rate" >"$work/out.json" 2>>"$work/oxbench.err"; then
    echo "  $s: oxbench lease-expire failed: $(tail -n 1 "$work/oxbench.err")" >&2
    : >"$work/out.json"
  fi
  python3 - "$s" "$work/out.json" >>"$results" <<'PY'
import json, sys
name, path = sys.argv[1:]
try:
    r = json.loads(open(path).read().strip().splitlines()[-1])
except (ValueError, IndexError):
    r = None
figures = [("grant_rps", lambda r: "%.0f" % r["grant"]["rps"]),
           ("first_expiry_s", lambda r: "%.2f" % r["first_expiry_secs"]),
           ("all_expired_s", lambda r: "%.2f" % r["all_expired_secs"]),
           ("put_p50_ms", lambda r: "%.2f" % (r["p50"] * 1000)),
           ("put_p99_ms", lambda r: "%.2f" % (r["p99"] * 1000)),
           ("put_max_ms", lambda r: "%.2f" % (r["slowest"] * 1000))]
for metric, get in figures:
    try:
        print(name, metric, get(r))
    except (TypeError, KeyError):
        print(name, metric, "n/a")
PY
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  rm -rf "$work/data"
}

for ((round = 0; round < rounds; round++)); do
  n=${#servers[@]}
  for ((i = 0; i < n; i++)); do
    s=${servers[$(((i + round) % n))]}
    echo "round $((round + 1))/$rounds: $s ($(server_bin "$s"))" >&2
    measure "$s"
  done
done

python3 "$root/bench/table.py" "$results" \
  "lease grants|grant_rps|req/s" "first lease expired after|first_expiry_s|s" \
  "every lease expired after|all_expired_s|s" "put p50 during the expiry|put_p50_ms|ms" \
  "put p99 during the expiry|put_p99_ms|ms" "put slowest|put_max_ms|ms"
echo "$leases leases of ${ttl} s (one key each) granted by 50 clients over 5 connections; a writer at $put_rate puts/s; expiry times from the last grant"
