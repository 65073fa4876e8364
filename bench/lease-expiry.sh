#!/usr/bin/env bash
# Many leases expiring at once under a steady writer, on oxcd, etcd 3.5.1 and
# etcd 3.4.23 (single member each, fresh data dir, same flags): how long the
# mass expiry takes and the writer's latency during it (oxbench lease-expire).
#
#   bench/lease-expiry.sh [--leases N] [--ttl S] [--put-rate R] [--only oxcd,etcd35,etcd34]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
leases=10000 ttl=5 put_rate=200 only=oxcd,etcd35,etcd34
while [ $# -gt 0 ]; do
  case "$1" in
    --leases) leases=$2; shift 2 ;;
    --ttl) ttl=$2; shift 2 ;;
    --put-rate) put_rate=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: $0 [--leases N] [--ttl S] [--put-rate R] [--only LIST]" >&2; exit 2 ;;
  esac
done
oxbench=${OXBENCH:-$root/target/release/oxbench}
OXCD=${OXCD:-$root/target/release/oxcd}
[ -x "$oxbench" ] && [ -x "$OXCD" ] || (cd "$root" && cargo build --release -p bench -p oxcd >&2)
endpoint=127.0.0.1:23790 peer=127.0.0.1:23800
work=$(mktemp -d /tmp/oxlease.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

printf '%-8s %8s %10s %12s %12s %10s %10s %10s\n' server leases "grant/s" "first exp s" "all gone s" "put p50ms" "put p99ms" "put max ms"
IFS=, read -r -a servers <<<"$only"
for s in "${servers[@]}"; do
  case "$s" in
    oxcd) bin=$OXCD ;;
    etcd35) bin=$("$root/../shared/tools/ref-etcd" --bin 3.5) ;;
    etcd34) bin=/usr/bin/etcd ;;
    *) echo "unknown server $s" >&2; exit 2 ;;
  esac
  "$bin" --name bench --data-dir "$work/data" \
    --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
    --listen-peer-urls "http://$peer" --initial-advertise-peer-urls "http://$peer" \
    --initial-cluster "bench=http://$peer" >"$work/$s.log" 2>&1 &
  pid=$!
  "$oxbench" --endpoints "$endpoint" health --timeout 60s >/dev/null
  out=$("$oxbench" --endpoints "$endpoint" --clients 50 --conns 5 --json lease-expire \
        --leases "$leases" --ttl "$ttl" --put-rate "$put_rate")
  python3 - "$s" "$leases" "$out" <<'PY'
import json, sys
name, leases, raw = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
ms = lambda v: v * 1000
print(f'{name:<8} {leases:>8} {raw["grant"]["rps"]:>10.0f} {raw["first_expiry_secs"]:>12.2f} '
      f'{raw["all_expired_secs"]:>12.2f} {ms(raw["p50"]):>10.2f} {ms(raw["p99"]):>10.2f} {ms(raw["slowest"]):>10.2f}')
PY
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  rm -rf "$work/data"
done
