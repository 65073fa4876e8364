#!/usr/bin/env bash
# Watch at scale (issue 22, item 6): oxcd vs etcd 3.5.16 (the reference; etcd
# 3.5.1 on request), one member each on loopback, same flags, same tool
# (oxbench), fresh data dirs; one table at the end with the ratio oxcd/3.5.16
# (and oxcd/3.5.1 when 3.5.1 ran).
#
#   bench/watch-scale.sh [--rounds N] [--quick] [--only oxcd,etcd3516,etcd35] [--keep-logs]
#                        [--streams S] [--watchers-per-stream W] [--puts P] [--put-rate R]
#
#   --rounds N   run everything N times, alternating the server order round by
#                round; the table shows the median of the rounds (default 1)
#   --quick      10,000 watchers (100 streams x 100) instead of 100,000
#                (1,000 x 100), 10 puts/s instead of 1
#   --only LIST  the servers (comma-separated; default oxcd,etcd3516): oxcd,
#                etcd3516 (3.5.16), etcd35 (3.5.1)
#   --keep-logs  keep the server logs and raw results (their path is printed)
#   --streams S, --watchers-per-stream W, --puts P, --put-rate R: override the
#                workload (S streams x W watchers; P puts at R puts/s)
#
# Environment: OXCD, OXBENCH (default target/release/{oxcd,oxbench}, built if
# missing), ETCD3516 (default /opt/etcd-3.5.16/etcd), ETCD35 (default
# /opt/etcd-3.5.1/etcd) override the binaries; PORT (default 31379) is the
# client port, PORT+1 the peer port.
#
# Each round, each server runs as a fresh single member:
#   1) its VmRSS once healthy (idle);
#   2) `oxbench watch-latency`: S x W watchers on one key (all watchers of a
#      stream created one after the other, as clientv3 does; the streams
#      concurrently, over S/10 connections, S client handles), timed from the
#      first create to the last; with every watcher open and before the first
#      put (oxbench's --pause-file), the server's VmRSS and its CPU seconds so
#      far; then one client puts P values of 32 B to the key at R puts/s
#      (evenly spaced: --put-burst 1, not etcd's burst of R), so
#      the server sends P x S x W events; each event's latency runs from the
#      sending of its put to its arrival (matched by revision; a server may
#      answer the put behind its deliveries, so etcd's measure, from the put's
#      answer, is shown too but is 0 for events that beat the answer); events/s
#      delivered = events received / (first put -> last event);
#   3) the server's CPU seconds over the puts and deliveries, and its peak
#      RSS (VmHWM).
# Offered load: R x S x W events/s (default 100,000/s): raise --put-rate to
# find where a server stops keeping up (events/s below the offered rate,
# latency growing with the run). A server that does not come up or an
# oxbench run that fails is reported and the script exits 1 at the end.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/lib.sh"
rounds=1
quick=0
only="oxcd,etcd3516"
keep_logs=0
streams="" watchers_per_stream="" puts="" put_rate=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --rounds=*) rounds=${1#*=}; shift ;;
    --quick) quick=1; shift ;;
    --only) only=$2; shift 2 ;;
    --only=*) only=${1#*=}; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    --streams) streams=$2; shift 2 ;;
    --streams=*) streams=${1#*=}; shift ;;
    --watchers-per-stream) watchers_per_stream=$2; shift 2 ;;
    --watchers-per-stream=*) watchers_per_stream=${1#*=}; shift ;;
    --puts) puts=$2; shift 2 ;;
    --puts=*) puts=${1#*=}; shift ;;
    --put-rate) put_rate=$2; shift 2 ;;
    --put-rate=*) put_rate=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "watch-scale.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bench_select_servers watch-scale.sh oxcd,etcd3516,etcd35
if [ $quick = 1 ]; then
  streams=${streams:-100} puts=${puts:-20} put_rate=${put_rate:-10}
else
  streams=${streams:-1000} puts=${puts:-20} put_rate=${put_rate:-1}
fi
watchers_per_stream=${watchers_per_stream:-100}
for v in "$streams" "$watchers_per_stream" "$puts" "$put_rate" "$rounds"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "watch-scale.sh: counts and rates are positive integers; got $v" >&2; exit 2; }
done
conns=$(((streams + 9) / 10))
port=${PORT:-31379}
peer_port=$((port + 1))
endpoint="127.0.0.1:$port"
bench_timeout=1800   # seconds; bounds one oxbench run so a hung server cannot hang the script

# --- binaries -----------------------------------------------------------------
OXBENCH=${OXBENCH:-$root/target/release/oxbench}
bench_build_oxbench "$OXBENCH"
bench_server_binaries watch-scale.sh
clk_tck=$(getconf CLK_TCK)

# --- bookkeeping ----------------------------------------------------------------
work=$(mktemp -d /tmp/oxwatchscale.XXXXXX)
results=$work/results
: >"$results"
server_pid=""
bench_pid=""
failures=0
cleanup() {
  [ -z "$bench_pid" ] || kill -TERM "$bench_pid" 2>/dev/null || true
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"/*/data
  if [ $keep_logs = 1 ]; then echo "logs and raw results kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_server() {  # NAME DATA_DIR LOG: same flags for every server
  if "$OXBENCH" --endpoints "$endpoint" --dial-timeout 200ms health --timeout 300ms >/dev/null 2>&1; then
    echo "watch-scale.sh: something already answers on $endpoint (PORT=... to move)" >&2; exit 1
  fi
  "$(server_bin "$1")" --name bench --data-dir "$2" \
    --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "bench=http://127.0.0.1:$peer_port" >>"$3" 2>&1 &
  server_pid=$!
}

stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$server_pid/stat" 2>/dev/null || echo 0; }
status_mb() { awk -v f="$1:" '$1 == f {printf "%.1f", $2 / 1024}' "/proc/$server_pid/status" 2>/dev/null || echo n/a; }
ticks_s() { awk -v a="$1" -v b="$2" -v t="$clk_tck" 'BEGIN {printf "%.2f", (b - a) / t}'; }

run_server() {
  local s=$1 dir=$work/$1-r$2
  mkdir -p "$dir"
  start_server "$s" "$dir/data" "$dir/server.log"
  if ! wait_healthy "$server_pid" "$dir/server.log" 120 "$OXBENCH" --endpoints "$endpoint" health --timeout 1s; then
    echo "  $s: did not come up" >&2
    failures=$((failures + 1))
    stop_server
    return 0
  fi
  local rss_idle; rss_idle=$(status_mb VmRSS)
  record "$s" rss_idle_mb "$rss_idle"
  local pause=$dir/pause out=$dir/watch.json
  rm -f "$pause"
  echo "  $s: creating $((streams * watchers_per_stream)) watchers ($streams streams over $conns connections)" >&2
  local cpu0 cpu1 cpu2
  cpu0=$(cpu_ticks)
  timeout "$bench_timeout" "$OXBENCH" --endpoints "$endpoint" --clients "$streams" --conns "$conns" --json \
    watch-latency --streams "$streams" --watchers-per-stream "$watchers_per_stream" \
    --put-total "$puts" --put-rate "$put_rate" --put-burst 1 --pause-file "$pause" >"$out" 2>>"$dir/oxbench.err" &
  bench_pid=$!
  while [ ! -e "$pause" ] && kill -0 "$bench_pid" 2>/dev/null; do sleep 0.05; done
  if [ -e "$pause" ]; then
    cpu1=$(cpu_ticks)
    local rss_open; rss_open=$(status_mb VmRSS)
    record "$s" rss_open_mb "$rss_open"
    record "$s" cpu_create_s "$(ticks_s "$cpu0" "$cpu1")"
    echo "  $s: every watcher open: VmRSS $rss_open MB; $puts puts at $put_rate/s" >&2
    rm -f "$pause"
  else
    cpu1=$cpu0
  fi
  local ok=1
  wait "$bench_pid" || ok=0
  bench_pid=""
  cpu2=$(cpu_ticks)
  record "$s" cpu_events_s "$(ticks_s "$cpu1" "$cpu2")"
  record "$s" hwm_mb "$(status_mb VmHWM)"
  if [ $ok = 0 ] || [ ! -s "$out" ]; then
    echo "  $s: oxbench failed: $(tail -n 3 "$dir/oxbench.err")" >&2
    failures=$((failures + 1))
    stop_server
    return 0
  fi
  python3 - "$out" "$s" "$rss_idle" >>"$results" <<'EOF'
import json, sys
path, server, rss_idle = sys.argv[1:]
r = json.loads(open(path).read().strip().splitlines()[-1])
flag = "!" if r["errors"] else ""
c = r["create"]
watchers = int(r["watchers"])
print(server, "watchers", watchers)
print(server, "create_s", "%.3f" % c["total_secs"] + ("!" if c["errors"] else ""))
print(server, "create_p99", "%.2f" % (c["p99"] * 1000))
print(server, "events_per_sec", ("%.0f" % r["events_per_sec"]) + flag)
sent = r["since_put_sent"]
print(server, "p50", ("%.2f" % (sent["p50"] * 1000)) + flag if sent["requests"] else "n/a")
print(server, "p99", ("%.2f" % (sent["p99"] * 1000)) + flag if sent["requests"] else "n/a")
print(server, "answer_p99", ("%.2f" % (r["p99"] * 1000)) + flag if r["requests"] else "n/a")
print(server, "put_slowest", "%.2f" % (r["put"]["slowest"] * 1000) if r["put"]["requests"] else "n/a")
print(server, "errors", r["errors"])
EOF
  local errors; errors=$(awk -v s="$s" '$1 == s && $2 == "errors" {v = $3} END {print v + 0}' "$results")
  if [ "$errors" != 0 ]; then
    echo "  $s: $errors errors: $(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("; ".join("[%d] %s" % (e["count"], e["error"]) for e in r["error_distribution"][:3]))' "$out")" >&2
  fi
  local rss_open; rss_open=$(awk -v s="$s" '$1 == s && $2 == "rss_open_mb" {v = $3} END {print v}' "$results")
  local watchers; watchers=$(awk -v s="$s" '$1 == s && $2 == "watchers" {v = $3} END {print v + 0}' "$results")
  if [ -n "$rss_open" ] && [ "$watchers" -gt 0 ]; then
    record "$s" bytes_per_watcher "$(awk -v a="$rss_idle" -v b="$rss_open" -v n="$watchers" 'BEGIN {printf "%.0f", (b - a) * 1048576 / n}')"
  fi
  stop_server
  rm -rf "$dir/data"
}

for ((round = 0; round < rounds; round++)); do
  n=${#servers[@]}
  for ((i = 0; i < n; i++)); do
    s=${servers[$(((i + round) % n))]}
    echo "round $((round + 1))/$rounds: $s ($(server_bin "$s"))" >&2
    run_server "$s" "$((round + 1))"
  done
done

# --- the table ------------------------------------------------------------------
python3 - "$results" "$quick" "$streams" "$watchers_per_stream" "$puts" "$put_rate" "$conns" <<'EOF'
import statistics, sys
path, quick = sys.argv[1], sys.argv[2] == "1"
streams, per_stream, puts, rate, conns = map(int, sys.argv[3:])
values = {}
for line in open(path):
    server, metric, value = line.split()
    values.setdefault((server, metric), []).append(value)

def figure(server, metric):
    vals = values.get((server, metric))
    if not vals:
        return None, ""
    nums = [float(v.rstrip("!")) for v in vals if v != "n/a"]
    if not nums:
        return None, "n/a"
    flag = "!" if any(v.endswith("!") for v in vals) else ""
    return statistics.median(nums), flag

watchers = streams * per_stream
rows = [
    (f"watchers created (of {watchers:,})", "watchers", ""),
    ("creating every watcher", "create_s", "s"),
    ("watch create, p99 (each after the last on its stream)", "create_p99", "ms"),
    ("events delivered per second", "events_per_sec", "events/s"),
    ("event latency from the put's sending, p50", "p50", "ms"),
    ("event latency from the put's sending, p99", "p99", "ms"),
    ("event latency from the put's answer, p99 (etcd's)", "answer_p99", "ms"),
    ("slowest put (the writer)", "put_slowest", "ms"),
    ("VmRSS, idle", "rss_idle_mb", "MB"),
    ("VmRSS, every watcher open", "rss_open_mb", "MB"),
    ("memory per watcher (open - idle)", "bytes_per_watcher", "B"),
    ("peak RSS (VmHWM) after the deliveries", "hwm_mb", "MB"),
    ("server CPU, creating the watchers", "cpu_create_s", "s"),
    ("server CPU, puts and deliveries", "cpu_events_s", "s"),
]
servers = [("oxcd", "oxcd"), ("etcd3516", "etcd 3.5.16"), ("etcd35", "etcd 3.5.1")]
present = [(k, label) for k, label in servers if any(s == k for s, _ in values)]

def fmt(v, flag):
    if v is None:
        return flag or "-"
    text = f"{v:,.0f}" if v >= 1000 else (f"{v:.1f}" if v >= 100 else (f"{v:.2f}" if v >= 1 else f"{v:.3f}"))
    return text + flag

references = [(k, label.split()[-1]) for k, label in present if k in ("etcd3516", "etcd35")]
header = (["", "unit"] + [label for _, label in present]
          + [f"oxcd/{version}" for _, version in references])
table = [header]
for title, metric, unit in rows:
    if not any((key, metric) in values for key, _ in present):
        continue
    cells = [title, unit]
    for key, _ in present:
        cells.append(fmt(*figure(key, metric)))
    ox, _ = figure("oxcd", metric)
    for key, _ in references:
        ref, _ = figure(key, metric)
        cells.append(f"{ox / ref:.2f}x" if ox is not None and ref not in (None, 0) else "-")
    table.append(cells)
widths = [max(len(r[i]) for r in table) for i in range(len(header))]
def line(r):
    return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
print(line(table[0]))
print("  ".join("-" * w for w in widths))
for r in table[1:]:
    print(line(r))
rounds = max((len(v) for v in values.values()), default=0)
print(f"\nsingle member; {watchers:,} watchers on one key ({streams:,} streams x {per_stream} over "
      f"{conns} connections); {puts} puts of 32 B at {rate}/s: {puts * watchers:,} events, "
      f"{rate * watchers:,} events/s offered; median of {rounds} round(s){' (--quick)' if quick else ''}; "
      "'!' = some watchers, events or puts failed (see stderr); latency from the put's answer = "
      "etcd's watch-latency (0 when the event came before the answer)")
EOF
if [ "$failures" -gt 0 ]; then
  echo "watch-scale.sh: $failures failure(s), see above" >&2
  exit 1
fi
