#!/usr/bin/env bash
# `etcdctl check perf --load=LOAD` against oxcd and etcd 3.5.16 (the
# reference; etcd 3.5.1 and 3.4.23 on request), one after the other on the
# same machine, each a fresh single member on loopback with the same flags,
# the same client (etcdctl 3.5.16) for every server. One table at the end:
# etcdctl's figures (throughput, slowest request, stddev, errors), medians of
# the rounds, with the ratio oxcd/3.5.16 (and oxcd/3.5.1 when 3.5.1 ran), and
# etcdctl's verdict per server.
#
#   bench/check-perf.sh [s|m|l|xl] [--rounds N] [--duration S] [--only oxcd,etcd3516,etcd35,etcd34]
#
#   s|m|l|xl      etcdctl's workload model (default s: 150 puts/s from 50 clients)
#   --rounds N    run everything N times, alternating the server order round
#                 by round; the table shows the medians (default 1)
#   --duration S  end each check after S seconds (default 60, etcdctl's own
#                 length): etcdctl 3.5 takes SIGINT as the end of the check,
#                 cleans up and reports on what it measured (bench/smoke.sh
#                 uses 3); needs an etcdctl 3.5 (3.4's dies of the signal)
#   --only LIST   the servers (comma-separated; default oxcd,etcd3516): oxcd,
#                 etcd3516 (3.5.16), etcd35 (3.5.1), etcd34 (3.4.23)
#
# Environment: OXCD, ETCD3516, ETCD35, ETCD34, ETCDCTL override the binaries
# (ETCDCTL: default etcdctl 3.5.16, next to ETCD3516, installed by
# `REF_ETCD=3.5.16 ../shared/tools/ref-etcd` when missing); PORT (default
# 30379) is the client port, PORT+1 the peer port.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
load=s rounds=1 duration=60 only=oxcd,etcd3516
while [ $# -gt 0 ]; do
  case "$1" in
    s|m|l|xl) load=$1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "check-perf.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "check-perf.sh: --rounds takes a positive number; got $rounds" >&2; exit 2; }
[[ "$duration" =~ ^[1-9][0-9]*$ ]] || { echo "check-perf.sh: --duration takes seconds; got $duration" >&2; exit 2; }
ref_etcd=$root/../shared/tools/ref-etcd
bench_select_servers check-perf.sh oxcd,etcd3516,etcd35,etcd34
bench_server_binaries check-perf.sh
ETCDCTL=${ETCDCTL:-$(dirname "${ETCD3516:-$("$ref_etcd" --bin 3.5.16)}")/etcdctl}
[ -x "$ETCDCTL" ] || { echo "check-perf.sh: no etcdctl at $ETCDCTL (set ETCDCTL)" >&2; exit 1; }
port=${PORT:-30379}
endpoint=127.0.0.1:$port peer=127.0.0.1:$((port + 1))

work=$(mktemp -d /tmp/oxcd-check-perf.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ctl() { ETCDCTL_API=3 "$ETCDCTL" --endpoints "$endpoint" "$@"; }
results=$work/results
: >"$results"
verdicts=$work/verdicts
: >"$verdicts"

# check SERVER: one fresh member, one `check perf`, its figures recorded.
check() {
  local s=$1
  if (: <>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "check-perf.sh: something already listens on $endpoint" >&2; exit 1
  fi
  rm -rf "$work/data"
  "$(server_bin "$s")" --name bench --data-dir "$work/data" \
    --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
    --listen-peer-urls "http://$peer" --initial-advertise-peer-urls "http://$peer" \
    --initial-cluster "bench=http://$peer" >>"$work/$s.log" 2>&1 &
  pid=$!
  wait_healthy "$pid" "$work/$s.log" 60 ctl --dial-timeout 300ms --command-timeout 1s endpoint health ||
    { echo "check-perf.sh: $s did not start" >&2; exit 1; }
  local limit=()
  [ "$duration" -lt 60 ] && limit=(timeout -s INT "$duration")
  # the progress bar writes \r-separated frames; the verdict lines are plain
  "${limit[@]}" env ETCDCTL_API=3 "$ETCDCTL" --endpoints "$endpoint" check perf --load="$load" \
    >"$work/out" 2>&1 || true
  tr '\r' '\n' <"$work/out" | python3 -c '
import re, sys
server, text = sys.argv[1], sys.stdin.read()
def grab(pattern, scale=1.0):
    m = re.search(pattern, text)
    return "%.3f" % (float(m.group(1)) * scale) if m else "n/a"
print(server, "throughput", grab(r"Throughput (?:is|too low:) (\d+) writes/s"))
print(server, "slowest_ms", grab(r"Slowest request took (?:too long: )?([0-9.]+)s", 1000))
print(server, "stddev_ms", grab(r"Stddev (?:is|too high:) ([0-9.]+)s", 1000))
errors = sum(int(n) for n in re.findall(r"FAIL: ERROR\(.*\) -> (\d+)", text))
print(server, "errors", errors if re.search(r"^(PASS|FAIL)$", text, re.M) else "n/a")
' "$s" >>"$results"
  local verdict; verdict=$(tr '\r' '\n' <"$work/out" | grep -oE '^(PASS|FAIL)$' | tail -n 1 || true)
  echo "$s ${verdict:-none}" >>"$verdicts"
  if [ "${verdict:-none}" != PASS ]; then
    echo "  $s: check perf said ${verdict:-nothing}:" >&2
    tr '\r' '\n' <"$work/out" | grep -vE '^ *[0-9]+ / [0-9]+' | tail -n 8 | sed 's/^/    /' >&2
  fi
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}

for ((round = 0; round < rounds; round++)); do
  n=${#servers[@]}
  for ((i = 0; i < n; i++)); do
    s=${servers[$(((i + round) % n))]}
    echo "round $((round + 1))/$rounds: $s ($(server_bin "$s")), check perf --load=$load for ${duration}s" >&2
    check "$s"
  done
done

python3 "$root/bench/table.py" "$results" \
  "throughput|throughput|writes/s" "slowest request|slowest_ms|ms" \
  "stddev|stddev_ms|ms" "errors|errors|"
echo "etcdctl check perf --load=$load, ${duration} s a check, etcdctl $("$ETCDCTL" version | awk '/etcdctl version/ {print $3}');" \
  "its verdict: $(for s in "${servers[@]}"; do
    echo "$s PASS $(grep -c "^$s PASS$" "$verdicts")/$rounds"; done | paste -sd, | sed 's/,/, /g')"
