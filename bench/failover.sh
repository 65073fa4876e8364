#!/usr/bin/env bash
# Leader failover (issue 22, item 3): oxcd vs etcd 3.5.16 (the reference;
# etcd 3.5.1 on request), 3- and 5-member clusters on loopback, same flags for
# every server (etcd's defaults, given explicitly: --heartbeat-interval 100
# --election-timeout 1000), fresh data dirs; rounds alternate the server
# order; the table shows medians and the ratio oxcd/3.5.16 (and oxcd/3.5.1
# when 3.5.1 ran).
#
#   bench/failover.sh [--rounds N] [--quick] [--members 3|5|3,5] [--kills K]
#                     [--only oxcd,etcd3516,etcd35] [--request-timeout D]
#                     [--via follower|any] [--timeout SECS] [--keep-logs]
#
#   --rounds N           rounds (default 1); the table shows the medians over
#                        every kill of every round
#   --quick              one kill, 3 members
#   --members LIST       cluster sizes (default 3,5)
#   --kills K            leader kills per cluster (default 3)
#   --only LIST          oxcd, etcd3516 (3.5.16), etcd35 (3.5.1); default oxcd,etcd3516
#   --request-timeout D  the writer's deadline per put (default 100ms)
#   --via follower|any   follower (default): the writer puts through a member
#                        that is not the leader, so each kill is seen from the
#                        same side; any: it keeps an endpoint until a put fails
#   --timeout SECS       deadline of any one wait (default 120)
#   --keep-logs          keep the server logs and timelines (their path is printed)
#
# Environment: OXCD, OXBENCH (default target/release/{oxcd,oxbench}, built if
# missing), ETCD3516 (default /opt/etcd-3.5.16/etcd), ETCD35 (default
# /opt/etcd-3.5.1/etcd), ETCDCTL (default the etcdctl next to ETCD3516; it
# finds the leader for every server); PORT (default 25379): member i (0-based)
# listens on 127.0.0.1 at PORT+2i (client) and PORT+2i+1 (peer).
#
# For each cluster size and server, every round: a fresh cluster, every
# member healthy; `oxbench failover` runs through it all along: one client
# putting 64 B values continuously, each put with a deadline and retried on
# another endpoint on failure, every endpoint's Status polled each 10 ms,
# every acknowledged put and leader change written to a timeline. After 2 s,
# K times: find the leader (etcdctl endpoint status), kill -9 it, and from the
# timeline take
#   gap          kill -> the acknowledgement of the first put sent after it
#   new leader   kill -> the first Status, from any member, naming a leader
#                other than the killed one
# then restart the killed member (same flags, its data dir), wait until it is
# healthy (oxbench health: a linearizable read through it) and 2 s more.
# A kill whose gap or leader is not seen within --timeout counts as a
# failure: the logs' tails are printed and the script exits 1 at the end.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/lib.sh"
rounds=1
quick=0
members_list="3,5"
kills=3
only="oxcd,etcd3516"
request_timeout=100ms
via=follower
timeout=120
keep_logs=0
members_given=0 kills_given=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --rounds=*) rounds=${1#*=}; shift ;;
    --quick) quick=1; shift ;;
    --members) members_list=$2; members_given=1; shift 2 ;;
    --members=*) members_list=${1#*=}; members_given=1; shift ;;
    --kills) kills=$2; kills_given=1; shift 2 ;;
    --kills=*) kills=${1#*=}; kills_given=1; shift ;;
    --only) only=$2; shift 2 ;;
    --only=*) only=${1#*=}; shift ;;
    --request-timeout) request_timeout=$2; shift 2 ;;
    --request-timeout=*) request_timeout=${1#*=}; shift ;;
    --via) via=$2; shift 2 ;;
    --via=*) via=${1#*=}; shift ;;
    --timeout) timeout=$2; shift 2 ;;
    --timeout=*) timeout=${1#*=}; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "failover.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ $quick = 1 ]; then
  [ $members_given = 1 ] || members_list=3
  [ $kills_given = 1 ] || kills=1
fi
bench_select_servers failover.sh oxcd,etcd3516,etcd35
sizes=()
for m in ${members_list//,/ }; do
  [[ "$m" =~ ^[1-9][0-9]*$ ]] && [ "$m" -ge 3 ] || { echo "failover.sh: --members takes sizes of 3 or more; got $m" >&2; exit 2; }
  sizes+=("$m")
done
for v in "$rounds" "$kills" "$timeout"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "failover.sh: --rounds, --kills and --timeout take positive integers; got $v" >&2; exit 2; }
done
case "$via" in follower|any) ;; *) echo "failover.sh: --via takes follower or any; got $via" >&2; exit 2 ;; esac
port=${PORT:-25379}
settle=2   # seconds of steady writes before each kill

# --- binaries -----------------------------------------------------------------
OXBENCH=${OXBENCH:-$root/target/release/oxbench}
bench_build_oxbench "$OXBENCH"
ETCD3516=${ETCD3516:-$("$root/../shared/tools/ref-etcd" --bin 3.5.16)}   # its etcdctl too
bench_server_binaries failover.sh
ETCDCTL=${ETCDCTL:-$(dirname "$ETCD3516")/etcdctl}
[ -x "$ETCDCTL" ] || { echo "failover.sh: no etcdctl at $ETCDCTL (set ETCDCTL)" >&2; exit 1; }

# --- bookkeeping ----------------------------------------------------------------
work=$(mktemp -d /tmp/oxfailover.XXXXXX)
results=$work/results
: >"$results"
failures=0
pids=()          # per member index of the current cluster: its process (empty once stopped)
writer_pid=""
stop_writer() {
  [ -n "$writer_pid" ] || return 0
  kill -TERM "$writer_pid" 2>/dev/null || true
  wait "$writer_pid" 2>/dev/null || true
  writer_pid=""
}
stop_all() {  # every member started and not yet stopped: TERM, then KILL after 30 s
  stop_writer
  local live
  live=$(alive_pids)
  if [ -n "$live" ]; then
    # shellcheck disable=SC2086 # one pid a word
    kill -TERM $live 2>/dev/null || true
    for _ in $(seq 300); do [ -n "$(alive_pids)" ] || break; sleep 0.1; done
    live=$(alive_pids)
    # shellcheck disable=SC2086
    [ -z "$live" ] || kill -KILL $live 2>/dev/null || true
  fi
  local p
  for p in "${pids[@]}"; do [ -z "$p" ] || wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() {
  stop_all
  rm -rf "$work"/*/data-*
  if [ $keep_logs = 1 ]; then echo "logs and timelines kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# fail DIR MESSAGE: loudly, with the tail of every member's log in DIR.
fail() {
  local dir=$1; shift
  echo "failover.sh: FAILED: $*" >&2
  local log
  for log in "$dir"/*.log "$dir"/oxbench.err; do
    [ -s "$log" ] || continue
    echo "---- last lines of $log" >&2
    tail -n 20 "$log" >&2
  done
  echo "----" >&2
  failures=$((failures + 1))
}

# start_member KIND DIR I INITIAL_CLUSTER: member m<I+1>, data DIR/data-m<I+1>,
# log DIR/m<I+1>.log; the same flags for every kind, at the first start and
# at a restart (its data dir then holds the cluster).
start_member() {
  local kind=$1 dir=$2 i=$3 initial=$4
  local ep; ep=$(client_ep "$i")
  "$(server_bin "$kind")" --name "m$((i + 1))" --data-dir "$dir/data-m$((i + 1))" \
    --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
    --listen-peer-urls "$(peer_url "$i")" --initial-advertise-peer-urls "$(peer_url "$i")" \
    --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token bench-failover \
    --heartbeat-interval 100 --election-timeout 1000 >>"$dir/m$((i + 1)).log" 2>&1 &
  pids[i]=$!
}

healthy() {  # DIR I: member I answers a linearizable read within --timeout
  wait_healthy "${pids[$2]}" "$1/m$(($2 + 1)).log" "$timeout" "$OXBENCH" --endpoints "$(client_ep "$2")" health --timeout 1s
}

# leader_of N: "index member_id" of the leader among the live members 0..N-1
# (empty if they do not agree on one).
leader_of() {
  local n=$1 i eps=""
  for ((i = 0; i < n; i++)); do [ -z "${pids[i]:-}" ] || eps+="${eps:+,}$(client_ep "$i")"; done
  ETCDCTL_API=3 "$ETCDCTL" --endpoints "$eps" --dial-timeout 2s --command-timeout 5s endpoint status -w json 2>/dev/null |
    python3 -c '
import json, sys
try:
    st = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
leaders = {s["Status"]["leader"] for s in st}
if len(leaders) != 1 or 0 in leaders:
    sys.exit(0)
(leader,) = leaders
for s in st:
    if s["Status"]["header"]["member_id"] == leader:
        print((int(s["Endpoint"].rsplit(":", 1)[1]) - int(sys.argv[1])) // 2, leader)
' "$port" || true
}

# The timeline's reader (see crates/bench/src/workloads/failover.rs for its lines).
cat >"$work/timeline.py" <<'EOF'
import sys

def first_after(path, kill_ns, old_leader, killed):
    """(ns at which the first put sent after the kill was acknowledged, ns of
    the first Status naming another leader after it, the endpoint of the last
    put acknowledged before the kill), None where not seen yet."""
    ack = leader = before = None
    for line in open(path):
        f = line.split()
        if len(f) < 5:
            continue  # a line being written
        if f[0] == "ack" and int(f[2]) <= kill_ns:
            before = f[3]
        # sent after the kill: a put the old leader committed just before
        # it may still be answered just after
        if f[0] == "ack" and ack is None and int(f[1]) > kill_ns:
            ack = int(f[2])
        elif (f[0] == "leader" and leader is None and f[3] not in ("-", "0", old_leader)
              and int(f[1]) > kill_ns and f[2] != killed):
            leader = int(f[1])
        if ack is not None and leader is not None:
            break
    return ack, leader, before

if sys.argv[1] == "seen":  # seen TIMELINE KILL_NS OLD_LEADER KILLED: exit 0 once both are seen
    ack, leader, _ = first_after(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    sys.exit(0 if ack is not None and leader is not None else 1)
if sys.argv[1] == "figures":  # figures TIMELINE KILL_NS OLD_LEADER KILLED: "gap_s leader_s writer_member"
    kill_ns = int(sys.argv[3])
    ack, leader, before = first_after(sys.argv[2], kill_ns, sys.argv[4], sys.argv[5])
    print("%.3f" % ((ack - kill_ns) / 1e9) if ack else "n/a",
          "%.3f" % ((leader - kill_ns) / 1e9) if leader else "n/a",
          "m%d" % (int(before) + 1) if before is not None else "?")
EOF

# run_cluster KIND DIR N: a fresh N-member cluster, the writer, $kills kills.
run_cluster() {
  local kind=$1 dir=$2 n=$3
  mkdir -p "$dir"
  local i initial=""
  for ((i = 0; i < n; i++)); do
    if listening "$((port + 2 * i))" || listening "$((port + 2 * i + 1))"; then
      fail "$dir" "something already listens on 127.0.0.1:$((port + 2 * i)) or :$((port + 2 * i + 1)) (PORT=... to move)"
      return 1
    fi
    initial+="${initial:+,}m$((i + 1))=$(peer_url "$i")"
  done
  for ((i = 0; i < n; i++)); do start_member "$kind" "$dir" "$i" "$initial"; done
  for ((i = 0; i < n; i++)); do
    healthy "$dir" "$i" || { fail "$dir" "$kind: member m$((i + 1)) did not come up"; return 1; }
  done
  local eps=""
  for ((i = 0; i < n; i++)); do eps+="${eps:+,}$(client_ep "$i")"; done
  local timeline=$dir/timeline
  "$OXBENCH" --endpoints "$eps" --dial-timeout 2s --json failover --timeline "$timeline" \
    --request-timeout "$request_timeout" --via "$via" --duration "$((timeout * (kills + 1) * 4))s" \
    >"$dir/failover.json" 2>>"$dir/oxbench.err" &
  writer_pid=$!
  local waited=0
  until grep -q '^ack ' "$timeline" 2>/dev/null; do
    kill -0 "$writer_pid" 2>/dev/null && [ $waited -lt $((timeout * 10)) ] ||
      { fail "$dir" "$kind: the writer acknowledged no put"; return 1; }
    sleep 0.1; waited=$((waited + 1))
  done
  sleep "$settle"
  local k
  for ((k = 1; k <= kills; k++)); do
    local leader="" tries=0
    while [ -z "$leader" ]; do
      leader=$(leader_of "$n")
      [ -n "$leader" ] && break
      tries=$((tries + 1))
      [ $tries -lt 50 ] || { fail "$dir" "$kind: no leader agreed on by the members"; return 1; }
      sleep 0.2
    done
    local victim old_id
    read -r victim old_id <<<"$leader"
    local t_kill=$EPOCHREALTIME
    kill -KILL "${pids[victim]}"
    wait "${pids[victim]}" 2>/dev/null || true
    pids[victim]=""
    local kill_ns=${t_kill//[.,]/}000   # $EPOCHREALTIME: seconds and microseconds
    local deadline=$((SECONDS + timeout))
    until python3 "$work/timeline.py" seen "$timeline" "$kill_ns" "$old_id" "$victim"; do
      if [ $SECONDS -ge $deadline ] || ! kill -0 "$writer_pid" 2>/dev/null; then
        fail "$dir" "$kind: kill $k of the leader m$((victim + 1)): no acknowledged put or no new leader within ${timeout}s"
        return 1
      fi
      sleep 0.1
    done
    local gap new_leader through
    read -r gap new_leader through <<<"$(python3 "$work/timeline.py" figures "$timeline" "$kill_ns" "$old_id" "$victim")"
    record "$kind" "gap.$n" "$gap"
    record "$kind" "leader.$n" "$new_leader"
    echo "  $kind, $n members, kill $k/$kills of the leader m$((victim + 1)) (the writer through $through): first ack after $gap s, new leader seen after $new_leader s" >&2
    start_member "$kind" "$dir" "$victim" "$initial"
    healthy "$dir" "$victim" || { fail "$dir" "$kind: m$((victim + 1)) did not come up after its restart"; return 1; }
    sleep "$settle"
  done
  stop_writer
  local summary
  summary=$(python3 -c 'import json, sys; r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(r["acks"], r["errors"])' "$dir/failover.json" 2>/dev/null) || summary="? ?"
  echo "  $kind, $n members: writer: $summary (acknowledged, failed puts)" >&2
}

echo "work dir $work" >&2
for n in "${sizes[@]}"; do
  for ((round = 0; round < rounds; round++)); do
    count=${#servers[@]}
    for ((i = 0; i < count; i++)); do
      s=${servers[$(((i + round) % count))]}
      echo "round $((round + 1))/$rounds: $n members, $s ($(server_bin "$s"))" >&2
      dir=$work/$s-$n-r$((round + 1))
      run_cluster "$s" "$dir" "$n" || true
      stop_all
      rm -rf "$dir"/data-*
    done
  done
done

# --- the table ------------------------------------------------------------------
python3 - "$results" "$quick" "$request_timeout" "$via" "${sizes[@]}" <<'EOF'
import statistics, sys
path, quick, request_timeout, via = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
sizes = [int(n) for n in sys.argv[5:]]
values = {}
for line in open(path):
    server, metric, value = line.split()
    values.setdefault((server, metric), []).append(value)

def nums(server, metric):
    return [float(v) for v in values.get((server, metric), []) if v != "n/a"]

def median(server, metric):
    v = nums(server, metric)
    return statistics.median(v) if v else None

def slowest(server, metric):
    v = nums(server, metric)
    return max(v) if v else None

rows = []
for n in sizes:
    rows += [
        (f"{n} members: kill -9 leader -> first acknowledged put", f"gap.{n}", median),
        (f"{n} members: the same, slowest kill", f"gap.{n}", slowest),
        (f"{n} members: kill -9 leader -> new leader seen", f"leader.{n}", median),
    ]
servers = [("oxcd", "oxcd"), ("etcd3516", "etcd 3.5.16"), ("etcd35", "etcd 3.5.1")]
present = [(k, label) for k, label in servers if any(s == k for s, _ in values)]

def fmt(v):
    return "-" if v is None else f"{v:.3f}"

references = [(k, label.split()[-1]) for k, label in present if k in ("etcd3516", "etcd35")]
header = (["", "unit"] + [label for _, label in present]
          + [f"oxcd/{version}" for _, version in references] + ["kills"])
table = [header]
for title, metric, how in rows:
    if not any((key, metric) in values for key, _ in present):
        continue
    cells = [title, "s"] + [fmt(how(key, metric)) for key, _ in present]
    ox = how("oxcd", metric)
    for key, _ in references:
        ref = how(key, metric)
        cells.append(f"{ox / ref:.2f}x" if ox is not None and ref else "-")
    cells.append("/".join(str(len(nums(key, metric))) for key, _ in present))
    table.append(cells)
widths = [max(len(r[i]) for r in table) for i in range(len(header))]
def line(r):
    return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
print(line(table[0]))
print("  ".join("-" * w for w in widths))
for r in table[1:]:
    print(line(r))
print(f"\nclusters on loopback, --heartbeat-interval 100 --election-timeout 1000 on every server; "
      f"medians over every kill of every round{' (--quick)' if quick else ''} (kills = measured per server); "
      f"one writer, 64 B puts, deadline {request_timeout} per put, through {'a follower' if via == 'follower' else 'any member'}; "
      "new leader seen = a Status (polled each 10 ms on every member) naming another leader")
EOF
if [ "$failures" -gt 0 ]; then
  echo "failover.sh: $failures failure(s), see above" >&2
  exit 1
fi
