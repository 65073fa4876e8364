#!/usr/bin/env bash
# How long requests wait during a defrag, oxcd vs etcd 3.5.16 (the reference;
# etcd 3.5.1 and 3.4.23 on request): write --keys keys of --val-size bytes
# twice (the first copies become garbage), compact, then run a steady put
# load and a steady range load (oxbench, --rate each, --seconds long) with
# `etcdctl defrag` a quarter of the way into them; the table shows the
# database size before and after, the defrag's duration and the loads'
# slowest and p99 latencies, medians of the rounds, with the ratio
# oxcd/3.5.16 (and oxcd/3.5.1 when 3.5.1 ran). etcd blocks reads and writes
# for the whole defrag; oxcd defers only its backend commits.
#
#   bench/defrag-latency.sh [--keys N] [--val-size B] [--rate R] [--seconds S]
#                           [--rounds N] [--only oxcd,etcd3516,etcd35,etcd34]
#
#   defaults: 200,000 keys of 1,024 B, 500 requests/s of each load, 12 s;
#   one round (rounds alternate the server order); --only oxcd,etcd3516
#
# Environment: OXCD, OXBENCH, ETCD3516, ETCD35, ETCD34, ETCDCTL override the
# binaries (ETCDCTL: default etcdctl 3.5.16, next to ETCD3516, installed by
# `REF_ETCD=3.5.16 ../shared/tools/ref-etcd` when missing); PORT (default
# 23790) is the client port, PORT+1 the peer port.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
keys=200000 val_size=1024 rate=500 seconds=12 rounds=1 only=oxcd,etcd3516
while [ $# -gt 0 ]; do
  case "$1" in
    --keys) keys=$2; shift 2 ;;
    --val-size) val_size=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "defrag-latency.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
bench_positive defrag-latency.sh keys val_size rate seconds rounds
ref_etcd=$root/../shared/tools/ref-etcd
oxbench=${OXBENCH:-$root/target/release/oxbench}
bench_build_oxbench "$oxbench"
bench_select_servers defrag-latency.sh oxcd,etcd3516,etcd35,etcd34
bench_server_binaries defrag-latency.sh
ETCDCTL=${ETCDCTL:-$(dirname "${ETCD3516:-$("$ref_etcd" --bin 3.5.16)}")/etcdctl}
[ -x "$ETCDCTL" ] || { echo "defrag-latency.sh: no etcdctl at $ETCDCTL (set ETCDCTL)" >&2; exit 1; }
port=${PORT:-23790}
endpoint=127.0.0.1:$port peer=127.0.0.1:$((port + 1))
work=$(mktemp -d /tmp/oxdefrag.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ctl() { ETCDCTL_API=3 "$ETCDCTL" --endpoints "$endpoint" --command-timeout 300s "$@"; }
status_field() {  # status_field revision|dbSize
  ctl endpoint status -w json | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]["Status"]
print(s["header"]["revision"] if sys.argv[1] == "revision" else s[sys.argv[1]])' "$1"
}
results=$work/results
: >"$results"

# measure SERVER: a fresh member, the garbage, the defrag under load.
measure() {
  local s=$1
  if "$oxbench" --endpoints "$endpoint" --dial-timeout 200ms health --timeout 300ms >/dev/null 2>&1; then
    echo "defrag-latency.sh: something already answers on $endpoint" >&2; exit 1
  fi
  rm -rf "$work/data"
  "$(server_bin "$s")" --name bench --data-dir "$work/data" \
    --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
    --listen-peer-urls "http://$peer" --initial-advertise-peer-urls "http://$peer" \
    --initial-cluster "bench=http://$peer" --quota-backend-bytes 8000000000 >>"$work/$s.log" 2>&1 &
  pid=$!
  wait_healthy "$pid" "$work/$s.log" 60 "$oxbench" --endpoints "$endpoint" health --timeout 1s ||
    { echo "defrag-latency.sh: $s did not start" >&2; exit 1; }
  for _ in 1 2; do
    "$oxbench" --endpoints "$endpoint" --clients 100 --conns 10 --json put --total "$keys" \
      --key-size 16 --val-size "$val_size" --key-space-size "$keys" --sequential-keys >/dev/null
  done
  ctl compact "$(status_field revision)" --physical >/dev/null
  local size; size=$(status_field dbSize)
  # Steady load around the defrag, the defrag a quarter of the way in.
  "$oxbench" --endpoints "$endpoint" --clients 8 --json put --rate "$rate" --total $((rate * seconds)) \
    --key-size 16 --val-size 256 --key-space-size 10000 >"$work/put.json" 2>>"$work/oxbench.err" &
  local putpid=$!
  "$oxbench" --endpoints "$endpoint" --clients 8 --json range zzz --rate "$rate" --total $((rate * seconds)) \
    >"$work/get.json" 2>>"$work/oxbench.err" &
  local getpid=$!
  sleep "$(awk -v s="$seconds" 'BEGIN {print s / 4}')"
  local start; start=$EPOCHREALTIME
  ctl defrag >/dev/null
  local took; took=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')
  wait "$putpid" "$getpid" || echo "  $s: a load failed (see $work/oxbench.err)" >&2
  local after; after=$(status_field dbSize)
  python3 - "$s" "$size" "$after" "$took" "$work/put.json" "$work/get.json" >>"$results" <<'PY'
import json, sys
name, size, after, took, put, get = sys.argv[1:7]
print(name, "db_mb", "%.1f" % (int(size) / 1e6))
print(name, "after_mb", "%.1f" % (int(after) / 1e6))
print(name, "defrag_s", took)
for load, path in (("put", put), ("get", get)):
    try:
        r = json.loads(open(path).read().strip().splitlines()[-1])
        ok = r["requests"] > 0 and not r["errors"]
    except (OSError, ValueError, IndexError, KeyError):
        ok = False
    if not ok:
        print(f"  {name}: the {load} load failed or had errors", file=sys.stderr)
    print(name, load + "_p99_ms", "%.2f" % (r["p99"] * 1000) if ok else "n/a")
    print(name, load + "_max_ms", "%.2f" % (r["slowest"] * 1000) if ok else "n/a")
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
  "db size before the defrag|db_mb|MB" "db size after|after_mb|MB" "defrag (etcdctl defrag)|defrag_s|s" \
  "put p99 around the defrag|put_p99_ms|ms" "put slowest|put_max_ms|ms" \
  "range p99 around the defrag|get_p99_ms|ms" "range slowest|get_max_ms|ms"
echo "$keys keys of $val_size B written twice, compacted; loads of $rate req/s each (8 clients), ${seconds} s, the defrag $(awk -v s="$seconds" 'BEGIN {print s / 4}') s in"
