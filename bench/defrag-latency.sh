#!/usr/bin/env bash
# How long requests wait during a defrag, oxcd vs etcd 3.5.1 (vs 3.4.23):
# write --keys keys of --val-size bytes twice (the first copies become
# garbage), compact, then run a steady put load and a steady range load
# (oxbench, --rate each, about 12 s) with `etcdctl defrag` 3 s into them; print the defrag's duration and the loads'
# slowest and p99 latencies (etcd blocks reads and writes for the whole
# defrag; oxcd defers only its backend commits).
#
#   bench/defrag-latency.sh [--keys N] [--val-size B] [--rate R] [--only oxcd,etcd35,etcd34]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keys=200000 val_size=1024 rate=500 only=oxcd,etcd35
while [ $# -gt 0 ]; do
  case "$1" in
    --keys) keys=$2; shift 2 ;;
    --val-size) val_size=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: $0 [--keys N] [--val-size B] [--rate R] [--only LIST]" >&2; exit 2 ;;
  esac
done
oxbench=${OXBENCH:-$root/target/release/oxbench}
OXCD=${OXCD:-$root/target/release/oxcd}
[ -x "$oxbench" ] && [ -x "$OXCD" ] || (cd "$root" && cargo build --release -p bench -p oxcd >&2)
etcdctl=$(dirname "$("$root/../shared/tools/ref-etcd" --bin 3.5)")/etcdctl
[ -x "$etcdctl" ] || etcdctl=etcdctl
endpoint=127.0.0.1:23790 peer=127.0.0.1:23800
work=$(mktemp -d /tmp/oxdefrag.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ctl() { ETCDCTL_API=3 "$etcdctl" --endpoints "$endpoint" --command-timeout 300s "$@"; }

printf '%-8s %9s %9s %10s %11s %11s %11s %11s\n' server "db MB" "after MB" "defrag s" "put p99 ms" "put max ms" "get p99 ms" "get max ms"
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
    --initial-cluster "bench=http://$peer" --quota-backend-bytes 8000000000 >"$work/$s.log" 2>&1 &
  pid=$!
  "$oxbench" --endpoints "$endpoint" health --timeout 60s >/dev/null
  for _ in 1 2; do
    "$oxbench" --endpoints "$endpoint" --clients 100 --conns 10 --json put --total "$keys" \
      --key-size 16 --val-size "$val_size" --key-space-size "$keys" --sequential-keys >/dev/null
  done
  rev=$(ctl endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])')
  ctl compact "$rev" --physical >/dev/null
  size=$(ctl endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["dbSize"])')
  # Steady load around the defrag: about 12 s, the defrag from 3 s in.
  "$oxbench" --endpoints "$endpoint" --clients 8 --json put --rate "$rate" --total $((rate * 12)) \
    --key-size 16 --val-size 256 --key-space-size 10000 >"$work/put.json" &
  putpid=$!
  "$oxbench" --endpoints "$endpoint" --clients 8 --json range zzz --rate "$rate" --total $((rate * 12)) \
    >"$work/get.json" &
  getpid=$!
  sleep 3
  start=$(date +%s.%N)
  ctl defrag >/dev/null
  took=$(echo "$(date +%s.%N) - $start" | bc)
  wait "$putpid" "$getpid"
  after=$(ctl endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["dbSize"])')
  python3 - "$s" "$size" "$after" "$took" "$work/put.json" "$work/get.json" <<'PY'
import json, sys
name, size, after, took, put, get = sys.argv[1:7]
def load(path):
    try:
        return json.loads(open(path).read().strip().splitlines()[-1])
    except Exception:
        return {"p99": float("nan"), "slowest": float("nan")}
p, g = load(put), load(get)
print(f'{name:<8} {int(size)/1e6:>9.1f} {int(after)/1e6:>9.1f} {float(took):>10.2f} '
      f'{p["p99"]*1000:>11.2f} {p["slowest"]*1000:>11.2f} {g["p99"]*1000:>11.2f} {g["slowest"]*1000:>11.2f}')
PY
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  rm -rf "$work/data"
done
