#!/usr/bin/env bash
# Side-by-side benchmark: oxcd vs etcd 3.5.16 (the reference; etcd 3.5.1 and
# 3.4.23 on request), same machine, same tool (oxbench), same settings, fresh
# data dirs; one table at the end, with the ratio oxcd/3.5.16 (and oxcd/3.5.1
# when 3.5.1 ran).
#
#   bench/compare.sh [--rounds N] [--quick] [--only oxcd,etcd3516,etcd35,etcd34] [--cluster N] [--keep-logs]
#
#   --rounds N   run everything N times, alternating the server order round by
#                round; the table shows the median of the rounds (default 1)
#   --quick      small totals (10k keys instead of 1M, ...) for a smoke run
#   --only LIST  the servers (comma-separated; default oxcd,etcd3516): oxcd,
#                etcd3516 (3.5.16), etcd35 (3.5.1), etcd34 (3.4.23)
#   --cluster N  run each server as an N-member cluster (default 1: a single
#                member, phases A and B below; N > 1: phase C below)
#   --keep-logs  keep the server logs and raw results (their path is printed)
#   --keys N     phase B's key count (default 1,000,000; --quick 10,000)
#   --quota B    --quota-backend-bytes of every server (default: the
#                servers' own, 2 GiB; 10,000,000 keys of 256 B, 2.56 GB of
#                values, need more)
#
# Environment: OXCD, OXBENCH, ETCD3516, ETCD35, ETCD34, ETCDCTL override the binaries;
# PHASES (default "ab") picks the single-member phases to run, e.g. PHASES=b
# for the memory/disk/restart phase alone (the table then has only its rows);
# PORT (default 27379) is the client port, PORT+1 the peer port; member i of a
# cluster (0-based) listens on 127.0.0.1 at PORT+2i (client) and PORT+2i+1 (peer).
#
# Each server runs alone, as a single member on loopback, twice per round:
#   A) a fresh member: put 1 client; put 100 clients x 10 conns (with server
#      CPU seconds per 10k puts from /proc/<pid>/stat); txn-put 100 clients;
#      range linearizable and serializable, 100 clients; watch-latency with
#      1,000 watchers (10 streams x 100) on one key.
#   B) a fresh member: load N keys of 256 B (1,000,000; --quick: 10,000), then
#      VmRSS, data dir size (du), SIGTERM, restart, and the time until healthy
#      (Status has a leader and a linearizable read succeeds: `oxbench health`).
#
# With --cluster N (issue 4's benchmark), each server runs as an N-member
# cluster on loopback, same flags for every kind, once per round:
#   C) a fresh cluster (every member healthy, leader found with `etcdctl
#      endpoint status`): put 1 client, put 100 clients x 10 conns (with the CPU
#      seconds of all members per 10k puts), range linearizable 100 clients x 10
#      conns, each against all members (--endpoints in the order follower(s)
#      first, leader last: oxbench spreads conns round-robin, so the 1-client put
#      goes through a follower on every server kind) and then against the leader
#      only; watch-latency with 1,000 watchers (10 streams x 100, as in A) on
#      one follower, the writer through it too. A leader change during the run
#      is reported on stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/lib.sh"
rounds=1
quick=0
only="oxcd,etcd3516"
keep_logs=0
cluster=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --rounds=*) rounds=${1#*=}; shift ;;
    --quick) quick=1; shift ;;
    --only) only=$2; shift 2 ;;
    --only=*) only=${1#*=}; shift ;;
    --cluster) cluster=$2; shift 2 ;;
    --cluster=*) cluster=${1#*=}; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    --keys) keys_override=$2; shift 2 ;;
    --keys=*) keys_override=${1#*=}; shift ;;
    --quota) quota=$2; shift 2 ;;
    --quota=*) quota=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bench_select_servers compare.sh oxcd,etcd3516,etcd35,etcd34
[[ "$cluster" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --cluster takes a member count (1, 3, ...); got $cluster" >&2; exit 2; }

if [ $quick = 1 ]; then
  # the 1-client put runs ~2 s: 1,000 puts (0.4 s) swung by 20% from run to run
  n_put1=5000 n_put100=10000 n_txn=5000 n_range=10000 n_watch_puts=200 n_keys=10000
else
  n_put1=10000 n_put100=100000 n_txn=50000 n_range=100000 n_watch_puts=1000 n_keys=1000000
fi
quota_flags=()
if [ -n "${quota:-}" ]; then
  [[ "$quota" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --quota takes bytes; got $quota" >&2; exit 2; }
  quota_flags=(--quota-backend-bytes "$quota")
fi
if [ -n "${keys_override:-}" ]; then
  [[ "$keys_override" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --keys takes a key count; got $keys_override" >&2; exit 2; }
  n_keys=$keys_override
fi
port=${PORT:-27379}
peer_port=$((port + 1))
endpoint="127.0.0.1:$port"
member_endpoints=()   # client endpoint of each member
for ((m = 0; m < cluster; m++)); do member_endpoints+=("127.0.0.1:$((port + 2 * m))"); done
all_endpoints=$(IFS=,; echo "${member_endpoints[*]}")
phases=${PHASES:-ab}
[[ "$phases" =~ ^[ab]+$ ]] || { echo "compare.sh: PHASES takes a, b or ab; got $phases" >&2; exit 2; }
bench_timeout=1800   # seconds; bounds any one oxbench run so a hung server cannot hang the script

# --- binaries -----------------------------------------------------------------
oxbench=${OXBENCH:-$root/target/release/oxbench}
bench_build_oxbench "$oxbench"
bench_server_binaries compare.sh
etcdctl=""
if [ "$cluster" -gt 1 ]; then   # only to find the leader (Maintenance.Status)
  etcdctl=${ETCDCTL:-$(dirname "$("$root/../shared/tools/ref-etcd" --bin 3.5.16 2>/dev/null || echo /nonexistent/x)")/etcdctl}
  [ -x "$etcdctl" ] || etcdctl=$(command -v etcdctl || true)
  [ -n "$etcdctl" ] || echo "compare.sh: no etcdctl found (ETCDCTL=...): leader-only rows skipped" >&2
fi
clk_tck=$(getconf CLK_TCK)

# --- bookkeeping ----------------------------------------------------------------
work=$(mktemp -d /tmp/oxcompare.XXXXXX)
results=$work/results
: >"$results"
server_pid=""      # the (first) member: RSS in phase B
server_pids=()     # every member started and not yet stopped
any_alive() {
  local p
  for p in "${server_pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}
cleanup() {
  if [ ${#server_pids[@]} -gt 0 ]; then
    kill -TERM "${server_pids[@]}" 2>/dev/null || true
    for _ in $(seq 50); do any_alive || break; sleep 0.1; done
    kill -KILL "${server_pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$work"/*/data "$work"/*/data-*
  if [ $keep_logs = 1 ]; then echo "logs and raw results kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server NAME DATA_DIR LOG: same flags for every server.
start_server() {
  local bin; bin=$(server_bin "$1")
  if "$oxbench" --endpoints "$endpoint" --dial-timeout 200ms health --timeout 300ms >/dev/null 2>&1; then
    echo "compare.sh: something already answers on $endpoint" >&2; exit 1
  fi
  "$bin" --name bench --data-dir "$2" \
    --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "bench=http://127.0.0.1:$peer_port" "${quota_flags[@]}" >>"$3" 2>&1 &
  server_pid=$!
  server_pids=("$server_pid")
}

# start_cluster NAME DIR: members m1..mN, data DIR/data-mI, log DIR/mI.log;
# same flags for every server kind.
start_cluster() {
  local bin; bin=$(server_bin "$1")
  local m ep initial=""
  for ((m = 0; m < cluster; m++)); do
    ep=${member_endpoints[$m]}
    if "$oxbench" --endpoints "$ep" --dial-timeout 200ms health --timeout 300ms >/dev/null 2>&1; then
      echo "compare.sh: something already answers on $ep" >&2; exit 1
    fi
    initial+="${initial:+,}m$((m + 1))=http://127.0.0.1:$((port + 2 * m + 1))"
  done
  server_pids=()
  for ((m = 0; m < cluster; m++)); do
    ep=${member_endpoints[$m]}
    local peer="127.0.0.1:$((port + 2 * m + 1))"
    "$bin" --name "m$((m + 1))" --data-dir "$2/data-m$((m + 1))" \
      --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
      --listen-peer-urls "http://$peer" --initial-advertise-peer-urls "http://$peer" \
      --initial-cluster "$initial" --initial-cluster-state new "${quota_flags[@]}" >>"$2/m$((m + 1)).log" 2>&1 &
    server_pids+=($!)
  done
  server_pid=${server_pids[0]}
}

# wait_cluster_healthy DIR: every member of start_cluster's: Status has a
# leader and a linearizable read succeeds.
wait_cluster_healthy() {
  local m
  for ((m = 0; m < cluster; m++)); do
    wait_healthy "${server_pids[$m]}" "$1/m$((m + 1)).log" 120 \
      "$oxbench" --endpoints "${member_endpoints[$m]}" health --timeout 1s
  done
}

# leader_endpoint: the client endpoint of the member that is leader (empty if
# unknown: no etcdctl, members disagree, no leader).
leader_endpoint() {
  [ -n "$etcdctl" ] || return 0
  "$etcdctl" --endpoints "$all_endpoints" --dial-timeout 2s --command-timeout 5s endpoint status -w json 2>/dev/null |
    python3 -c '
import json, sys
try:
    st = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
leaders = {s["Status"]["leader"] for s in st}
if len(leaders) != 1:
    sys.exit(0)
(leader,) = leaders
for s in st:
    if s["Status"]["header"]["member_id"] == leader:
        print(s["Endpoint"])
' || true
}

server_healthy() {  # LOG [SECS]: start_server's member is healthy
  wait_healthy "$server_pid" "$1" "${2:-120}" "$oxbench" --endpoints "$endpoint" health --timeout 1s
}

stop_server() {  # every member
  [ ${#server_pids[@]} -gt 0 ] || return 0
  kill -TERM "${server_pids[@]}" 2>/dev/null || true
  for _ in $(seq 300); do any_alive || break; sleep 0.1; done
  kill -KILL "${server_pids[@]}" 2>/dev/null || true
  wait "${server_pids[@]}" 2>/dev/null || true
  server_pid=""
  server_pids=()
}

cpu_ticks() {  # user + system ticks, summed over every member
  local p t=0
  for p in "${server_pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
  echo "$t"
}
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status"; }

json_field() {  # json_field KEY < one JSON object
  python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"
}


# bench SERVER NAME OXBENCH-ARGS...: run one workload, record req/s and p99 (ms).
# Against $bench_endpoints (a comma-separated list; default the single member).
bench_endpoints=""
bench() {
  local server=$1 name=$2; shift 2
  local out; out=$work/$server-$name.json
  if ! timeout $bench_timeout "$oxbench" --endpoints "${bench_endpoints:-$endpoint}" --json "$@" >"$out" 2>>"$work/$server-oxbench.err"; then
    echo "  $name: oxbench failed (see $work/$server-oxbench.err)" >&2
    record "$server" "$name.rps" n/a; record "$server" "$name.p99" n/a
    return 0
  fi
  python3 - "$out" "$server" "$name" >>"$results" <<'EOF'
import json, sys
path, server, name = sys.argv[1:]
r = json.loads(open(path).read().strip().splitlines()[-1])
ok = r["requests"] > 0
flag = "!" if r["errors"] else ""
print(server, name + ".rps", (("%.0f" % r["rps"]) + flag) if ok else "n/a")
print(server, name + ".p99", (("%.2f" % (r["p99"] * 1000)) + flag) if ok else "n/a")
print(server, name + ".requests", r["requests"])
print(server, name + ".errors", r["errors"])
EOF
  local errors; errors=$(json_field errors <"$out")
  if [ "$errors" != 0 ]; then
    echo "  $name: $errors errors: $(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print("; ".join("[%d] %s" % (e["count"], e["error"]) for e in r["error_distribution"][:3]))' "$out")" >&2
  fi
}

# Phase A: throughput and latency workloads on a fresh member.
phase_a() {
  local s=$1 dir=$work/$1-a
  mkdir -p "$dir"
  start_server "$s" "$dir/data" "$dir/server.log"
  server_healthy "$dir/server.log"
  local kv=(--key-size 8 --val-size 256)
  echo "  put, 1 client" >&2
  bench "$s" put1 --clients 1 --conns 1 put "${kv[@]}" --total $n_put1 --sequential-keys --key-space-size 100000
  echo "  put, 100 clients x 10 conns" >&2
  local cpu0; cpu0=$(cpu_ticks)
  bench "$s" put100 --clients 100 --conns 10 put "${kv[@]}" --total $n_put100 --sequential-keys --key-space-size 100000
  local cpu1; cpu1=$(cpu_ticks)
  local done_puts; done_puts=$(awk -v s="$s" '$1 == s && $2 == "put100.requests" {v = $3} END {print v + 0}' "$results")
  if [ "$done_puts" -gt 0 ]; then
    record "$s" cpu_per_10k "$(awk -v a="$cpu0" -v b="$cpu1" -v t="$clk_tck" -v n="$done_puts" 'BEGIN {printf "%.3f", (b - a) / t / n * 10000}')"
  else
    record "$s" cpu_per_10k n/a
  fi
  echo "  txn-put, 100 clients" >&2
  bench "$s" txn100 --clients 100 --conns 10 txn-put "${kv[@]}" --total $n_txn --key-space-size 100000
  # The range key: put's key index 1 is the 8-byte key 0x02 0x00..., the only
  # key in [0x02, 0x03) (NUL bytes cannot go through argv); one 256 B value.
  echo "  range, linearizable, 100 clients" >&2
  bench "$s" range_l --clients 100 --conns 10 range $'\x02' $'\x03' --consistency l --total $n_range
  echo "  range, serializable, 100 clients" >&2
  bench "$s" range_s --clients 100 --conns 10 range $'\x02' $'\x03' --consistency s --total $n_range
  echo "  watch-latency, 1,000 watchers" >&2
  bench "$s" watchlat --clients 10 --conns 10 watch-latency --streams 10 --watchers-per-stream 100 \
    --put-total $n_watch_puts --put-rate 100
  stop_server
  rm -rf "$dir/data"
}

# Phase C (--cluster N): issue 4's workloads on a fresh N-member cluster,
# against all members and against the leader only.
phase_c() {
  local s=$1 dir=$work/$1-c
  mkdir -p "$dir"
  start_cluster "$s" "$dir"
  wait_cluster_healthy "$dir"
  local leader; leader=$(leader_endpoint)
  local ordered=$all_endpoints
  if [ -n "$leader" ]; then   # followers first, leader last
    ordered=$(for ep in "${member_endpoints[@]}"; do [ "$ep" = "$leader" ] || echo "$ep"; done; echo "$leader")
    ordered=$(echo "$ordered" | paste -sd,)
    echo "  leader: $leader; --endpoints $ordered" >&2
  else
    echo "  leader unknown: leader-only workloads skipped" >&2
  fi
  local kv=(--key-size 8 --val-size 256)
  echo "  put, 1 client, all members" >&2
  bench_endpoints=$ordered
  bench "$s" put1 --clients 1 --conns 1 put "${kv[@]}" --total $n_put1 --sequential-keys --key-space-size 100000
  if [ -n "$leader" ]; then
    echo "  put, 1 client, leader" >&2
    bench_endpoints=$leader
    bench "$s" put1_leader --clients 1 --conns 1 put "${kv[@]}" --total $n_put1 --sequential-keys --key-space-size 100000
  fi
  echo "  put, 100 clients x 10 conns, all members" >&2
  bench_endpoints=$ordered
  local cpu0; cpu0=$(cpu_ticks)
  bench "$s" put100 --clients 100 --conns 10 put "${kv[@]}" --total $n_put100 --sequential-keys --key-space-size 100000
  local cpu1; cpu1=$(cpu_ticks)
  local done_puts; done_puts=$(awk -v s="$s" '$1 == s && $2 == "put100.requests" {v = $3} END {print v + 0}' "$results")
  if [ "$done_puts" -gt 0 ]; then
    record "$s" cpu_per_10k "$(awk -v a="$cpu0" -v b="$cpu1" -v t="$clk_tck" -v n="$done_puts" 'BEGIN {printf "%.3f", (b - a) / t / n * 10000}')"
  else
    record "$s" cpu_per_10k n/a
  fi
  if [ -n "$leader" ]; then
    echo "  put, 100 clients x 10 conns, leader" >&2
    bench_endpoints=$leader
    bench "$s" put100_leader --clients 100 --conns 10 put "${kv[@]}" --total $n_put100 --sequential-keys --key-space-size 100000
  fi
  # The range key: as in phase A, the only key in [0x02, 0x03).
  echo "  range, linearizable, 100 clients, all members" >&2
  bench_endpoints=$ordered
  bench "$s" range_l --clients 100 --conns 10 range $'\x02' $'\x03' --consistency l --total $n_range
  if [ -n "$leader" ]; then
    echo "  range, linearizable, 100 clients, leader" >&2
    bench_endpoints=$leader
    bench "$s" range_l_leader --clients 100 --conns 10 range $'\x02' $'\x03' --consistency l --total $n_range
    # The watchers and the writer on one follower (a put through a follower is
    # answered once that follower applied it): its apply-to-event path.
    local follower=${ordered%%,*}
    echo "  watch-latency, 1,000 watchers, follower $follower" >&2
    bench_endpoints=$follower
    bench "$s" watchlat_follower --clients 10 --conns 10 watch-latency --streams 10 --watchers-per-stream 100 \
      --put-total $n_watch_puts --put-rate 100
  fi
  bench_endpoints=""
  local leader_after; leader_after=$(leader_endpoint)
  if [ "$leader_after" != "$leader" ]; then
    echo "  WARNING: the leader changed during the run (${leader:-?} -> ${leader_after:-?}): see $dir/m*.log" >&2
  fi
  stop_server
  rm -rf "$dir"/data-*
}

# Phase B: N keys of 256 B, memory, disk, restart.
phase_b() {
  local s=$1 dir=$work/$1-b
  mkdir -p "$dir"
  start_server "$s" "$dir/data" "$dir/server.log"
  server_healthy "$dir/server.log"
  echo "  loading $n_keys keys of 256 B" >&2
  bench "$s" load --clients 100 --conns 10 put --key-size 8 --val-size 256 --total $n_keys \
    --sequential-keys --key-space-size $n_keys
  record "$s" rss_mb "$(awk -v k="$(rss_kb)" 'BEGIN {printf "%.1f", k / 1024}')"
  record "$s" disk_mb "$(du -sk "$dir/data" | awk '{printf "%.1f", $1 / 1024}')"
  echo "  restart" >&2
  stop_server
  local t0 t1
  t0=$(date +%s.%N)
  start_server "$s" "$dir/data" "$dir/server.log"
  if server_healthy "$dir/server.log" 600; then
    t1=$(date +%s.%N)
    record "$s" restart_s "$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')"
    record "$s" rss_restart_mb "$(awk -v k="$(rss_kb)" 'BEGIN {printf "%.1f", k / 1024}')"
  else
    record "$s" restart_s n/a
  fi
  stop_server
  rm -rf "$dir/data"
}

for ((round = 0; round < rounds; round++)); do
  n=${#servers[@]}
  for ((i = 0; i < n; i++)); do
    s=${servers[$(((i + round) % n))]}
    echo "round $((round + 1))/$rounds: $s ($(server_bin "$s"))" >&2
    if [ "$cluster" -gt 1 ]; then
      phase_c "$s"
    else
      [[ $phases != *a* ]] || phase_a "$s"
      [[ $phases != *b* ]] || phase_b "$s"
    fi
  done
done

# --- the table ------------------------------------------------------------------
python3 - "$results" "$quick" "$n_keys" "$cluster" <<'EOF'
import statistics, sys
path, quick, n_keys, cluster = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
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

keys = f"{n_keys:,}"
rows = [
    ("put, 1 client", "put1.rps", "req/s", ">=1.5"),
    ("put, 1 client, p99", "put1.p99", "ms", "<=1"),
    ("put, 100 clients x 10 conns", "put100.rps", "req/s", ">=1.5"),
    ("put, 100 clients x 10 conns, p99", "put100.p99", "ms", "<=1"),
    ("txn-put, 100 clients", "txn100.rps", "req/s", ">=1.5"),
    ("txn-put, 100 clients, p99", "txn100.p99", "ms", "<=1"),
    ("range linearizable, 100 clients", "range_l.rps", "req/s", ">=1.5"),
    ("range linearizable, p99", "range_l.p99", "ms", "<=1"),
    ("range serializable, 100 clients", "range_s.rps", "req/s", ">=1.5"),
    ("range serializable, p99", "range_s.p99", "ms", "<=1"),
    ("watch-latency, 1,000 watchers, p99", "watchlat.p99", "ms", "<=1"),
    ("server CPU per 10k puts (100 clients)", "cpu_per_10k", "s", "<=0.6"),
    (f"put, loading {keys} keys", "load.rps", "req/s", ""),
    (f"RSS after {keys} keys of 256 B", "rss_mb", "MB", "<=0.5"),
    (f"data dir size, {keys} keys", "disk_mb", "MB", ""),
    (f"restart to healthy, {keys} keys", "restart_s", "s", "<=0.5"),
    (f"RSS after restart, {keys} keys", "rss_restart_mb", "MB", ""),
]
if cluster > 1:
    rows = [
        ("put, 1 client, all members", "put1.rps", "req/s", ">=1.5"),
        ("put, 1 client, all members, p99", "put1.p99", "ms", "<=1"),
        ("put, 1 client, leader", "put1_leader.rps", "req/s", ">=1.5"),
        ("put, 1 client, leader, p99", "put1_leader.p99", "ms", "<=1"),
        ("put, 100 clients x 10 conns, all members", "put100.rps", "req/s", ">=1.5"),
        ("put, 100 clients x 10 conns, all members, p99", "put100.p99", "ms", "<=1"),
        ("put, 100 clients x 10 conns, leader", "put100_leader.rps", "req/s", ">=1.5"),
        ("put, 100 clients x 10 conns, leader, p99", "put100_leader.p99", "ms", "<=1"),
        ("range linearizable, 100 clients, all members", "range_l.rps", "req/s", ">=1.5"),
        ("range linearizable, all members, p99", "range_l.p99", "ms", "<=1"),
        ("range linearizable, 100 clients, leader", "range_l_leader.rps", "req/s", ">=1.5"),
        ("range linearizable, leader, p99", "range_l_leader.p99", "ms", "<=1"),
        ("watch-latency, 1,000 watchers on a follower, p99", "watchlat_follower.p99", "ms", "<=1"),
        (f"CPU per 10k puts, {cluster} members summed (100 clients)", "cpu_per_10k", "s", "<=0.6"),
    ]
servers = [("oxcd", "oxcd"), ("etcd3516", "etcd 3.5.16"), ("etcd35", "etcd 3.5.1"), ("etcd34", "etcd 3.4.23")]
present = [(k, label) for k, label in servers if any(s == k for s, _ in values)]

def fmt(v, flag):
    if v is None:
        return flag or "-"
    text = f"{v:,.0f}" if v >= 1000 else (f"{v:.1f}" if v >= 100 else (f"{v:.2f}" if v >= 1 else f"{v:.3f}"))
    return text + flag

# the ratio to each etcd 3.5 that ran: 3.5.16 (the reference) first
references = [(k, label.split()[-1]) for k, label in present if k in ("etcd3516", "etcd35")]
header = (["workload", "unit"] + [label for _, label in present]
          + [f"oxcd/{version}" for _, version in references] + ["target"])
table = [header]
for title, metric, unit, target in rows:
    if not any((key, metric) in values for key, _ in present):
        continue  # a phase that did not run (PHASES)
    cells = [title, unit]
    for key, _ in present:
        cells.append(fmt(*figure(key, metric)))
    ox, _ = figure("oxcd", metric)
    for key, _ in references:
        ref, _ = figure(key, metric)
        cells.append(f"{ox / ref:.2f}x" if ox is not None and ref not in (None, 0) else "-")
    cells.append(target)
    table.append(cells)
widths = [max(len(r[i]) for r in table) for i in range(len(header))]
def line(r):
    return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
print(line(table[0]))
print("  ".join("-" * w for w in widths))
for r in table[1:]:
    print(line(r))
rounds = max((len(v) for v in values.values()), default=0)
what = f"{cluster}-member clusters on loopback" if cluster > 1 else "single member"
print(f"\n{what}; median of {rounds} round(s){' (--quick)' if quick else ''}; "
      "'!' = some requests failed (see stderr), n/a = none succeeded; "
      "target = the ratio asked of oxcd/etcd-3.5.16")
if cluster > 1:
    print("all members = --endpoints follower(s) first, leader last (conns round-robin, "
          "so the 1-client put goes through a follower); leader = --endpoints leader only")
EOF
