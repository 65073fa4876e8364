#!/usr/bin/env bash
# Membership changes, oxcd against etcd 3.5.16, side by side on this machine,
# same flags for both servers (etcd's defaults, --snapshot-count 100000
# included), everything on 127.0.0.1. Two scenarios, each on a fresh cluster
# with fresh data dirs, every round; rounds alternate the server order; the
# table shows the medians and the ratio oxcd/etcd.
#
#   bench/membership.sh [--rounds N] [--quick] [--keys N] [--learner-keys M]
#                       [--learner-members 1|3] [--only oxcd,etcd]
#                       [--snapshot-count C] [--timeout SECS] [--pause-puts P]
#                       [--keep-logs]
#
#   1) replace a dead member: a 3-member cluster, N keys of 256 B loaded
#      (--keys, default 100,000), kill -9 one follower, then time
#      `etcdctl member remove` + `member add` + starting the new member with a
#      fresh data dir and --initial-cluster-state existing, until it is caught
#      up (its `endpoint status` revision equals the leader's and its raft
#      applied index has reached the leader's) and healthy (`oxbench health`:
#      Status has a leader and a linearizable read through it succeeds).
#      Reported: that total, and the catch-up alone (start of the new
#      member -> caught up), the remove and add calls, the new member's VmRSS.
#   2) a learner catching up: a cluster of --learner-members (default 1)
#      loaded with M keys of 256 B (--learner-keys, default 1,000,000; --quick
#      20,000), `member add --learner`, the learner started (existing), time
#      until its revision / applied index equal the leader's; then
#      `member promote`, retried while the leader says the learner is not in
#      sync, timed from the first attempt to success. Plus the learner's VmRSS.
#   3) the leader removed under a 1-client writer through the two followers
#      (3,000 puts): the slowest put is the write pause. oxcd hands
#      leadership over before the leader goes; etcd 3.5 does not (its removed
#      leader stops and the others elect one after an election timeout).
#   SCENARIOS="remove_leader" (say) runs a subset, in the order given.
#   After each catch-up (untimed) a serializable `get "" --prefix
#   --count-only` on the new member must count the keys loaded.
#
#   --rounds N          rounds (default 1); the table shows medians
#   --quick             smoke run: M = 20,000 (N stays 100,000 unless --keys)
#   --only LIST         oxcd, etcd or both (default both)
#   --snapshot-count C  pass --snapshot-count C to every member of both
#                       servers (default: not passed, i.e. 100,000 on both)
#   --timeout SECS      deadline of any one wait (default 600; 1800 for M >= 500k)
#   --pause-puts P      puts of scenario 3's writer (default 3,000: a few
#                       seconds; the leader is removed 1 s into them)
#   --keep-logs         keep the server logs (their directory is printed)
#
# Environment: OXCD, OXBENCH (default target/release/{oxcd,oxbench}, built if
# missing), ETCD (default /opt/etcd-3.5.16/etcd, installed by
# `REF_ETCD=3.5.16 ../shared/tools/ref-etcd` if missing), ETCDCTL (default the
# etcdctl next to ETCD; it is the client for both servers), PORT (default
# 29379): member i (0-based) listens on 127.0.0.1 at PORT+2i (client) and
# PORT+2i+1 (peer). A failure (a member not coming up, not catching up in
# time, a refused member change) prints the tails of the members' logs,
# leaves that figure out, and the script exits 1 at the end.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/lib.sh"
rounds=1
quick=0
keys=100000
# puts of the 1-client writer in scenario 3 (a few seconds' worth)
pause_puts=3000
learner_keys=""
learner_members=1
only="oxcd,etcd"
snapshot_count=""
timeout=""
keep_logs=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --rounds=*) rounds=${1#*=}; shift ;;
    --quick) quick=1; shift ;;
    --keys) keys=$2; shift 2 ;;
    --keys=*) keys=${1#*=}; shift ;;
    --learner-keys) learner_keys=$2; shift 2 ;;
    --learner-keys=*) learner_keys=${1#*=}; shift ;;
    --learner-members) learner_members=$2; shift 2 ;;
    --learner-members=*) learner_members=${1#*=}; shift ;;
    --only) only=$2; shift 2 ;;
    --only=*) only=${1#*=}; shift ;;
    --snapshot-count) snapshot_count=$2; shift 2 ;;
    --snapshot-count=*) snapshot_count=${1#*=}; shift ;;
    --timeout) timeout=$2; shift 2 ;;
    --timeout=*) timeout=${1#*=}; shift ;;
    --pause-puts) pause_puts=$2; shift 2 ;;
    --pause-puts=*) pause_puts=${1#*=}; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "membership.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
isnum() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
isnum "$rounds" || { echo "membership.sh: --rounds takes a positive number; got $rounds" >&2; exit 2; }
isnum "$keys" || { echo "membership.sh: --keys takes a positive number; got $keys" >&2; exit 2; }
if [ -z "$learner_keys" ]; then
  if [ $quick = 1 ]; then learner_keys=20000; else learner_keys=1000000; fi
fi
isnum "$learner_keys" || { echo "membership.sh: --learner-keys takes a positive number; got $learner_keys" >&2; exit 2; }
[[ "$learner_members" =~ ^[13]$ ]] || { echo "membership.sh: --learner-members takes 1 or 3; got $learner_members" >&2; exit 2; }
[ -z "$snapshot_count" ] || isnum "$snapshot_count" || { echo "membership.sh: --snapshot-count takes a positive number" >&2; exit 2; }
if [ -z "$timeout" ]; then
  if [ "$learner_keys" -ge 500000 ] || [ "$keys" -ge 500000 ]; then timeout=1800; else timeout=600; fi
fi
isnum "$pause_puts" || { echo "membership.sh: --pause-puts takes a positive number; got $pause_puts" >&2; exit 2; }
isnum "$timeout" || { echo "membership.sh: --timeout takes seconds; got $timeout" >&2; exit 2; }
servers=()
for s in ${only//,/ }; do
  case "$s" in
    oxcd|etcd) servers+=("$s") ;;
    *) echo "membership.sh: --only takes oxcd and/or etcd; got $s" >&2; exit 2 ;;
  esac
done
[ ${#servers[@]} -gt 0 ] || { echo "membership.sh: no server selected" >&2; exit 2; }
port=${PORT:-29379}

# --- binaries -----------------------------------------------------------------
OXCD=${OXCD:-$root/target/release/oxcd}
OXBENCH=${OXBENCH:-$root/target/release/oxbench}
ETCD=${ETCD:-/opt/etcd-3.5.16/etcd}
for b in "$OXCD" "$OXBENCH"; do
  if [ ! -x "$b" ]; then
    echo "building oxcd and oxbench..." >&2
    (cd "$root" && cargo build --release -p oxcd -p bench >&2)
  fi
done
if [ ! -x "$ETCD" ]; then
  echo "no etcd at $ETCD: installing it (REF_ETCD=3.5.16 ../shared/tools/ref-etcd)..." >&2
  (cd "$root" && REF_ETCD=3.5.16 ../shared/tools/ref-etcd >&2) || true
  [ -x "$ETCD" ] || { echo "membership.sh: still no etcd at $ETCD (set ETCD)" >&2; exit 1; }
fi
ETCDCTL=${ETCDCTL:-$(dirname "$ETCD")/etcdctl}
[ -x "$ETCDCTL" ] || { echo "membership.sh: no etcdctl at $ETCDCTL (set ETCDCTL)" >&2; exit 1; }
server_bin() { if [ "$1" = oxcd ]; then echo "$OXCD"; else echo "$ETCD"; fi; }
extra_flags=()
[ -z "$snapshot_count" ] || extra_flags=(--snapshot-count "$snapshot_count")

# --- bookkeeping ----------------------------------------------------------------
work=$(mktemp -d /tmp/oxmembership.XXXXXX)
results=$work/results
: >"$results"
failures=0
# Per member index i of the current cluster: its process (empty once stopped).
pids=()
cleanup() {
  stop_all
  rm -rf "$work"/*/data-*
  if [ $keep_logs = 1 ]; then echo "logs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# stop_all: every member started and not yet stopped, kill -9: each cluster
# is thrown away after its scenario, and with SIGTERM etcd's leader spent ~7 s
# handing leadership to members that were stopping too.
stop_all() { kill_members; }

ctl() {  # ctl ENDPOINTS ARGS...: etcdctl, the client for both servers
  local eps=$1; shift
  ETCDCTL_API=3 "$ETCDCTL" --endpoints "$eps" --dial-timeout 2s --command-timeout 5s "$@"
}

# fail DIR MESSAGE: loudly, with the tail of every member's log in DIR.
fail() {
  local dir=$1; shift
  echo "membership.sh: FAILED: $*" >&2
  local log
  for log in "$dir"/*.log; do
    [ -e "$log" ] || continue
    echo "---- last lines of $log" >&2
    tail -n 30 "$log" >&2
  done
  echo "----" >&2
  failures=$((failures + 1))
}

# start_member KIND DIR I STATE INITIAL_CLUSTER: member m<I+1>, data DIR/data-m<I+1>,
# log DIR/m<I+1>.log; the same flags for both kinds.
start_member() {
  local kind=$1 dir=$2 i=$3 state=$4 initial=$5
  local ep; ep=$(client_ep "$i")
  local cport=$((port + 2 * i)) pport=$((port + 2 * i + 1))
  if listening "$cport" || listening "$pport"; then
    fail "$dir" "something already listens on 127.0.0.1:$cport or :$pport (PORT=... to move)"
    return 1
  fi
  "$(server_bin "$kind")" --name "m$((i + 1))" --data-dir "$dir/data-m$((i + 1))" \
    --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
    --listen-peer-urls "$(peer_url "$i")" --initial-advertise-peer-urls "$(peer_url "$i")" \
    --initial-cluster "$initial" --initial-cluster-state "$state" \
    --initial-cluster-token "bench-membership" "${extra_flags[@]}" >>"$dir/m$((i + 1)).log" 2>&1 &
  pids[i]=$!
}

# healthy DIR I: waits until member I answers a linearizable read.
healthy() {
  wait_healthy "${pids[$2]}" "$1/m$(($2 + 1)).log" "$timeout" "$OXBENCH" --endpoints "$(client_ep "$2")" health --timeout 1s
}

# start_cluster KIND DIR N: members m1..mN, state new; waits until each is healthy.
start_cluster() {
  local kind=$1 dir=$2 n=$3 i initial=""
  for ((i = 0; i < n; i++)); do initial+="${initial:+,}m$((i + 1))=$(peer_url "$i")"; done
  for ((i = 0; i < n; i++)); do start_member "$kind" "$dir" "$i" new "$initial" || return 1; done
  for ((i = 0; i < n; i++)); do
    if ! healthy "$dir" "$i"; then
      fail "$dir" "$kind: member m$((i + 1)) did not come up"
      return 1
    fi
  done
}

# load KIND DIR ENDPOINTS N METRIC: N keys of 256 B (8-byte sequential keys
# 0..N-1, each put once), 100 clients over 10 connections; records req/s.
load() {
  local kind=$1 dir=$2 eps=$3 n=$4 metric=$5
  echo "  $kind: loading $n keys of 256 B" >&2
  local out=$dir/load.json
  if ! timeout "$timeout" "$OXBENCH" --endpoints "$eps" --clients 100 --conns 10 --json put --key-size 8 \
      --val-size 256 --total "$n" --sequential-keys --key-space-size "$n" >"$out" 2>>"$dir/oxbench.err"; then
    fail "$dir" "$kind: loading $n keys failed ($(tail -n 1 "$dir/oxbench.err"))"
    return 1
  fi
  local summary
  summary=$(python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(r["requests"], r["errors"], "%.0f" % r["rps"], r.get("error_distribution", [])[:3])' "$out")
  read -r reqs errs rps _ <<<"$summary"
  if [ "$errs" != 0 ]; then
    fail "$dir" "$kind: $errs of $reqs puts failed while loading: $summary"
    return 1
  fi
  record "$kind" "$metric" "$rps"
}

# leader_index N: the 0-based index of the leader among members 0..N-1 (empty if unknown).
leader_index() {
  local n=$1 i eps=""
  for ((i = 0; i < n; i++)); do [ -z "${pids[i]:-}" ] || eps+="${eps:+,}$(client_ep "$i")"; done
  ctl "$eps" endpoint status -w json 2>/dev/null | python3 -c '
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
        print((int(s["Endpoint"].rsplit(":", 1)[1]) - int(sys.argv[1])) // 2)
' "$port" || true
}

# member_hex_id EP NAME: the hex ID of member NAME, from `member list`.
member_hex_id() {
  ctl "$1" member list -w json 2>/dev/null | python3 -c '
import json, sys
for m in json.load(sys.stdin).get("members", []):
    if m.get("name") == sys.argv[1]:
        print("%x" % m["ID"])
' "$2"
}

# status_pair LEADER_EP NEW_EP: "leader_rev leader_applied new_rev new_applied"
# from one `endpoint status` of both; "-" fields when an endpoint did not answer.
status_pair() {
  local out
  out=$(ctl "$1,$2" --command-timeout 3s endpoint status -w json 2>/dev/null) || true
  status_fields "$out" "$1" "$2"
}

# wait_caught_up DIR LEADER_EP NEW_EP PID: polls until NEW_EP's revision equals
# LEADER_EP's and its applied index has reached the leader's (both read in one
# call); fails if the process exits or the deadline passes.
wait_caught_up() {
  local dir=$1 lep=$2 nep=$3 pid=$4 deadline last=""
  deadline=$(($(date +%s) + timeout))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      fail "$dir" "the new member ($nep, pid $pid) exited before catching up (last status: ${last:-none})"
      return 1
    fi
    local lrev lapp nrev napp
    read -r lrev lapp nrev napp <<<"$(status_pair "$lep" "$nep")"
    last="leader rev $lrev applied $lapp; new rev $nrev applied $napp"
    if [ "$nrev" != - ] && [ "$lrev" != - ] && [ "$nrev" = "$lrev" ] && [ "$napp" -ge "$lapp" ]; then
      return 0
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail "$dir" "the new member ($nep) did not catch up within ${timeout}s: $last"
      return 1
    fi
    sleep 0.1
  done
}

# check_count DIR KIND EP N: untimed; a serializable count of every key on EP.
check_count() {
  local dir=$1 kind=$2 ep=$3 n=$4 count
  count=$(ctl "$ep" --command-timeout 30s get "" --prefix --count-only --consistency=s -w fields 2>>"$dir/etcdctl.err" |
    awk '$1 == "\"Count\"" {print $3}') || count="error"
  [ -n "$count" ] || count="error"
  if [ "$count" != "$n" ]; then
    fail "$dir" "$kind: the new member ($ep) counts $count keys (serializable), $n were loaded ($(tail -n 1 "$dir/etcdctl.err" 2>/dev/null))"
    return 1
  fi
}

# Scenario 1: replace a dead follower of a 3-member cluster holding $keys keys.
replace_dead() {
  local kind=$1 dir=$2
  mkdir -p "$dir"
  start_cluster "$kind" "$dir" 3 || return 1
  local up_since; up_since=$(date +%s)
  local all_eps; all_eps="$(client_ep 0),$(client_ep 1),$(client_ep 2)"
  load "$kind" "$dir" "$all_eps" "$keys" replace.load_rps || return 1
  # both refuse the remove until every link has been up for 5 s
  # (--strict-reconfig-check: "unhealthy cluster"); a small load is quicker
  local wait_s=$((up_since + 6 - $(date +%s)))
  [ "$wait_s" -le 0 ] || sleep "$wait_s"
  local leader; leader=$(leader_index 3)
  [ -n "$leader" ] || { fail "$dir" "$kind: no single leader among the 3 members"; return 1; }
  local victim=$(((leader + 1) % 3)) survivor=$(((leader + 2) % 3))
  local lep; lep=$(client_ep "$leader")
  local victim_id; victim_id=$(member_hex_id "$lep" "m$((victim + 1))")
  [ -n "$victim_id" ] || { fail "$dir" "$kind: no ID for m$((victim + 1)) in member list"; return 1; }
  echo "  $kind: kill -9 follower m$((victim + 1)) ($victim_id); leader m$((leader + 1))" >&2
  kill -KILL "${pids[victim]}"
  wait "${pids[victim]}" 2>/dev/null || true
  pids[victim]=""

  local t0 t1 t2 t3 t4 t5 out
  t0=$(now)
  if ! out=$(ctl "$lep" member remove "$victim_id" 2>&1); then
    fail "$dir" "$kind: member remove $victim_id: $out"; return 1
  fi
  t1=$(now)
  local new=3
  if ! out=$(ctl "$lep" member add "m$((new + 1))" --peer-urls="$(peer_url "$new")" -w json 2>&1); then
    fail "$dir" "$kind: member add: $out"; return 1
  fi
  t2=$(now)
  echo "$out" >"$dir/member-add.json"
  local initial
  initial="m$((leader + 1))=$(peer_url "$leader"),m$((survivor + 1))=$(peer_url "$survivor"),m$((new + 1))=$(peer_url "$new")"
  t3=$(now)
  start_member "$kind" "$dir" "$new" existing "$initial" || return 1
  local nep; nep=$(client_ep "$new")
  wait_caught_up "$dir" "$lep" "$nep" "${pids[new]}" || return 1
  t4=$(now)
  if ! healthy "$dir" "$new"; then
    fail "$dir" "$kind: the new member is caught up but not healthy"
    return 1
  fi
  t5=$(now)
  record "$kind" replace.remove_s "$(secs "$t0" "$t1")"
  record "$kind" replace.add_s "$(secs "$t1" "$t2")"
  record "$kind" replace.catchup_s "$(secs "$t3" "$t4")"
  record "$kind" replace.healthy_after_s "$(secs "$t4" "$t5")"
  record "$kind" replace.total_s "$(secs "$t0" "$t5")"
  record "$kind" replace.rss_mb "$(rss_mb "${pids[new]}")"
  echo "  $kind: remove $(secs "$t0" "$t1") s, add $(secs "$t1" "$t2") s, catch-up $(secs "$t3" "$t4") s, total $(secs "$t0" "$t5") s" >&2
  check_count "$dir" "$kind" "$nep" "$keys" || return 1
}

# Scenario 2: a learner joins a cluster of $learner_members holding $learner_keys keys.
learner() {
  local kind=$1 dir=$2 n=$learner_members
  mkdir -p "$dir"
  start_cluster "$kind" "$dir" "$n" || return 1
  local i all_eps="" initial=""
  for ((i = 0; i < n; i++)); do
    all_eps+="${all_eps:+,}$(client_ep "$i")"
    initial+="${initial:+,}m$((i + 1))=$(peer_url "$i")"
  done
  load "$kind" "$dir" "$all_eps" "$learner_keys" learner.load_rps || return 1
  local leader; leader=$(leader_index "$n")
  [ -n "$leader" ] || { fail "$dir" "$kind: no single leader among the $n member(s)"; return 1; }
  local lep; lep=$(client_ep "$leader")
  local new=$n nep; nep=$(client_ep "$n")
  initial+=",m$((new + 1))=$(peer_url "$new")"

  local t0 t1 t2 t3 t4 out
  t0=$(now)
  if ! out=$(ctl "$lep" member add "m$((new + 1))" --learner --peer-urls="$(peer_url "$new")" -w json 2>&1); then
    fail "$dir" "$kind: member add --learner: $out"; return 1
  fi
  t1=$(now)
  echo "$out" >"$dir/member-add.json"
  local id
  id=$(python3 -c 'import json, sys; print("%x" % json.loads(sys.argv[1])["member"]["ID"])' "$out" 2>/dev/null) ||
    id=$(member_hex_id "$lep" "m$((new + 1))")
  [ -n "$id" ] || { fail "$dir" "$kind: no ID for the learner (member add said: $out)"; return 1; }
  t2=$(now)
  start_member "$kind" "$dir" "$new" existing "$initial" || return 1
  wait_caught_up "$dir" "$lep" "$nep" "${pids[new]}" || return 1
  t3=$(now)
  record "$kind" learner.rss_mb "$(rss_mb "${pids[new]}")"
  local attempts=0 deadline
  deadline=$(($(date +%s) + timeout))
  while :; do
    attempts=$((attempts + 1))
    if out=$(ctl "$lep" member promote "$id" 2>&1); then break; fi
    if [[ "$out" != *"not in sync"* ]]; then
      fail "$dir" "$kind: member promote $id: $out"; return 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail "$dir" "$kind: member promote $id still not in sync after ${timeout}s ($attempts attempts): $out"; return 1
    fi
    sleep 0.1
  done
  t4=$(now)
  record "$kind" learner.add_s "$(secs "$t0" "$t1")"
  record "$kind" learner.catchup_s "$(secs "$t2" "$t3")"
  record "$kind" learner.promote_s "$(secs "$t3" "$t4")"
  record "$kind" learner.promote_attempts "$attempts"
  echo "  $kind: add $(secs "$t0" "$t1") s, catch-up $(secs "$t2" "$t3") s, promote $(secs "$t3" "$t4") s ($attempts attempt(s))" >&2
  check_count "$dir" "$kind" "$nep" "$learner_keys" || return 1
}

# Scenario 3: the leader of a 3-member cluster removed under a 1-client
# writer that goes through the two followers: the slowest put is the write
# pause (oxcd hands leadership over first; etcd 3.5's removed leader stops
# and the others elect one after an election timeout).
remove_leader() {
  local kind=$1 dir=$2
  mkdir -p "$dir"
  start_cluster "$kind" "$dir" 3 || return 1
  local leader; leader=$(leader_index 3)
  [ -n "$leader" ] || { fail "$dir" "$kind: no single leader among the 3 members"; return 1; }
  local a=$(((leader + 1) % 3)) b=$(((leader + 2) % 3))
  local lep; lep=$(client_ep "$leader")
  local followers; followers="$(client_ep "$a"),$(client_ep "$b")"
  local id; id=$(member_hex_id "$lep" "m$((leader + 1))")
  [ -n "$id" ] || { fail "$dir" "$kind: no ID for the leader m$((leader + 1))"; return 1; }
  # both refuse a member change until every link has been up for 5 s
  # (--strict-reconfig-check: "unhealthy cluster")
  sleep 6
  local out=$dir/writer.json
  timeout "$timeout" "$OXBENCH" --endpoints "$followers" --clients 1 --conns 1 --json put --key-size 8 \
    --val-size 256 --total "$pause_puts" --sequential-keys --key-space-size "$pause_puts" >"$out" 2>>"$dir/oxbench.err" &
  local writer=$!
  sleep 1
  local t0 t1 res
  t0=$(now)
  if ! res=$(ctl "$followers" member remove "$id" 2>&1); then
    fail "$dir" "$kind: member remove of the leader $id: $res"; kill "$writer" 2>/dev/null; return 1
  fi
  t1=$(now)
  if ! wait "$writer"; then
    fail "$dir" "$kind: the writer failed ($(tail -n 1 "$dir/oxbench.err"))"; return 1
  fi
  local summary slowest errs
  summary=$(python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%.4f" % r["slowest"], r["errors"])' "$out")
  read -r slowest errs <<<"$summary"
  record "$kind" leader.remove_s "$(secs "$t0" "$t1")"
  record "$kind" leader.pause_s "$slowest"
  record "$kind" leader.errors "$errs"
  echo "  $kind: remove $(secs "$t0" "$t1") s, slowest put $slowest s, $errs failed puts" >&2
}

echo "work dir $work; oxcd $OXCD; etcd $ETCD ($("$ETCD" --version 2>/dev/null | head -n 1))" >&2
for ((round = 0; round < rounds; round++)); do
  n=${#servers[@]}
  for scenario in ${SCENARIOS:-replace_dead learner remove_leader}; do
    for ((i = 0; i < n; i++)); do
      s=${servers[$(((i + round) % n))]}
      echo "round $((round + 1))/$rounds: $scenario, $s" >&2
      dir=$work/$s-$scenario-r$((round + 1))
      "$scenario" "$s" "$dir" || true
      stop_all
      rm -rf "$dir"/data-*
    done
  done
done

# --- the table ------------------------------------------------------------------
python3 - "$results" "$keys" "$learner_keys" "$learner_members" "$quick" "${snapshot_count:-100000 (default)}" <<'EOF'
import statistics, sys
path, keys, lkeys, lmembers, quick, snap = sys.argv[1:]
keys, lkeys = int(keys), int(lkeys)
values = {}
for line in open(path):
    server, metric, value = line.split()
    values.setdefault((server, metric), []).append(value)

def figure(server, metric):
    nums = [float(v) for v in values.get((server, metric), []) if v != "n/a"]
    return (statistics.median(nums), len(nums)) if nums else (None, 0)

rows = [
    (f"replace dead member, {keys:,} keys, 3 members", None, None),
    ("  load (100 clients)", "replace.load_rps", "req/s"),
    ("  member remove", "replace.remove_s", "s"),
    ("  member add", "replace.add_s", "s"),
    ("  catch-up: start -> caught up", "replace.catchup_s", "s"),
    ("  caught up -> healthy", "replace.healthy_after_s", "s"),
    ("  total: remove + add + start -> healthy", "replace.total_s", "s"),
    ("  new member RSS after catch-up", "replace.rss_mb", "MB"),
    (f"learner, {lkeys:,} keys, {lmembers} member(s)", None, None),
    ("  load (100 clients)", "learner.load_rps", "req/s"),
    ("  member add --learner", "learner.add_s", "s"),
    ("  catch-up: start -> caught up", "learner.catchup_s", "s"),
    ("  promote (caught up -> promoted)", "learner.promote_s", "s"),
    ("  promote attempts", "learner.promote_attempts", ""),
    ("  learner RSS after catch-up", "learner.rss_mb", "MB"),
    ("remove the leader under a 1-client writer, 3 members", None, None),
    ("  member remove (through a follower)", "leader.remove_s", "s"),
    ("  write pause (slowest put)", "leader.pause_s", "s"),
    ("  failed puts", "leader.errors", ""),
]

def fmt(v):
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 1000 else (f"{v:.1f}" if v >= 100 else (f"{v:.2f}" if v >= 1 else f"{v:.3f}"))

table = [["", "unit", "oxcd", "etcd 3.5.16", "oxcd/etcd", "rounds"]]
for title, metric, unit in rows:
    if metric is None:
        table.append([title, "", "", "", "", ""])
        continue
    ox, nox = figure("oxcd", metric)
    et, net = figure("etcd", metric)
    ratio = f"{ox / et:.2f}x" if ox is not None and et else "-"
    table.append([title, unit, fmt(ox), fmt(et), ratio, f"{nox}/{net}"])
widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
def line(r):
    return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
print(line(table[0]))
print("  ".join("-" * w for w in widths))
for r in table[1:]:
    print(line(r))
print(f"\nmedians over the rounds that succeeded (rounds = oxcd/etcd); values of 256 B; "
      f"--snapshot-count {snap} on both{' (--quick)' if quick == '1' else ''}; "
      "caught up = the new member's revision equals the leader's and its raft applied index "
      "reached the leader's (etcdctl endpoint status); healthy = oxbench health (linearizable read)")
EOF
if [ "$failures" -gt 0 ]; then
  echo "membership.sh: $failures failure(s), see above" >&2
  exit 1
fi
