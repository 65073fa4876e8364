#!/usr/bin/env bash
# A large database, oxcd vs etcd 3.5.16 (issue 22, item 4): per server a fresh
# single member (etcd's default --snapshot-count, the quota raised above the
# target), then, in this order:
#   1) load: K = SIZE / (2 x VAL) keys of VAL-byte values (16-byte sequential
#      keys), written once, then all K overwritten (oxbench put, 100 clients
#      over 10 connections, two passes), so that half the revisions are
#      superseded: the load's time and puts/s, the database size (`etcdctl
#      endpoint status` dbSize), the data dir's size (du: database + WAL +
#      snapshots) and the member's VmRSS;
#   2) restart: SIGTERM (its time to exit), start again, the time until
#      healthy (Status has a leader and a linearizable read succeeds:
#      `oxbench health`) and VmRSS then;
#   3) compaction: `etcdctl compaction --physical` at the load's last
#      revision, which drops the K superseded revisions (compacting at the
#      midpoint revision would drop none: each key's newest revision at or
#      below it is kept), under a steady put load and a steady range load
#      (oxbench, --rate each, 8 clients, as one-second runs back to back from
#      0.5 s before it until it returns): its duration, the database size and
#      size in use after it, each load's slowest request and its worst
#      one-second p99;
#   4) defrag: `etcdctl defrag` under the same loads: its duration, the
#      database size after it, the loads' slowest and worst p99;
#   5) snapshot save: `etcdctl snapshot save`, its time, the file's size (the
#      file is removed at once) and the CPU seconds of the member and of
#      etcdctl; then the same stream read by `oxbench snapshot`, which only
#      counts the bytes: its time and the member's CPU seconds (the member's
#      side of a save, without etcdctl's decode, write and fsync);
#   6) a new member catching up (skipped by --no-catch-up): `member add
#      --learner`, the learner started with a fresh data dir and
#      --initial-cluster-state existing, timed until its revision equals the
#      member's and its raft applied index has reached it (as
#      bench/membership.sh's learner scenario); its VmRSS then.
# Plus the peak disk use of it all (the file system's free space, read every
# second, at its lowest, against its start: whatever else writes to it counts
# too). Each server's data dirs are removed before the next one starts. The
# table shows medians of the rounds (rounds alternate the server order) and
# the ratio oxcd/3.5.16 when etcd 3.5.16 ran. VmRSS in MB, sizes in MB
# (10^6 B), times in s, latencies in ms.
#
#   bench/large-db.sh [--size S] [--val-size B] [--rate R] [--rounds N]
#                     [--only oxcd,etcd3516] [--no-catch-up] [--timeout SECS]
#                     [--quota BYTES] [--disk-factor F]
#
#   --size S         the load's bytes of values, K/M/G = KiB/MiB/GiB (default
#                    8G); half of them superseded
#   --val-size B     value size (default 8192: before oxcd stored long
#                    records in page-sized parts, redb gave each such value
#                    16 KiB, a database 2.1x the values)
#   --rate R         requests/s of each steady load (default 200; 100 at
#                    least: a run's p99 needs 100 requests, etcd's percentile
#                    walk gives 0 below that)
#   --rounds N       rounds (default 1)
#   --only LIST      oxcd, etcd3516, etcd35, etcd34 (default oxcd,etcd3516;
#                    oxcd alone: no ratio column)
#   --no-catch-up    skip step 6 (the disk holds one copy less)
#   --timeout SECS   deadline of any one step: a load pass, the restart, an
#                    etcdctl call, the catch-up (default 3600)
#   --quota BYTES    --quota-backend-bytes of every member (default SIZE x 3;
#                    above 8 GiB both etcd 3.5.16 and oxcd warn and keep it)
#   --disk-factor F  refuse to start unless the work dir's file system has F x
#                    SIZE free (default 5; 2 with --no-catch-up); while it
#                    runs, a member is killed when less than 2 GiB is left
#
#   8 GiB side by side:   bench/large-db.sh --size 8G
#   32 GiB, oxcd alone:   bench/large-db.sh --size 32G --val-size 8000 --only oxcd --no-catch-up
#                         (8,192 B values would make a database of ~72 GB)
#
# Environment: OXCD, OXBENCH, ETCD3516, ETCD35, ETCD34, ETCDCTL override the
# binaries (ETCDCTL: default etcdctl 3.5.16, next to ETCD3516, the client for
# every server); PORT (default 24379) is the member's client port, PORT+1 its
# peer port, PORT+2 and PORT+3 the new member's; TMPDIR (default /tmp) holds
# the work dir. Exits 1 when a step fails (its figures show n/a).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
size_arg=8G val_size=8192 rate=200 rounds=1 only=oxcd,etcd3516 catch_up=1 timeout=3600
quota="" disk_factor=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size_arg=$2; shift 2 ;;
    --val-size) val_size=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --no-catch-up) catch_up=0; shift ;;
    --timeout) timeout=$2; shift 2 ;;
    --quota) quota=$2; shift 2 ;;
    --disk-factor) disk_factor=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "large-db.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
bench_positive large-db.sh val_size rate rounds timeout
bench_size large-db.sh "$size_arg"
keys=$((size / (2 * val_size)))
[ "$rate" -ge 100 ] || { echo "large-db.sh: --rate takes 100 at least (a one-second run's p99 needs 100 requests); got $rate" >&2; exit 2; }
[ "$keys" -ge 100 ] || { echo "large-db.sh: --size $size_arg holds only $keys keys of $val_size B (100 at least)" >&2; exit 2; }
if [ -z "$quota" ]; then
  quota=$((size * 3))
fi
[[ "$quota" =~ ^-?[0-9]+$ ]] || { echo "large-db.sh: --quota takes bytes; got $quota" >&2; exit 2; }
[ -n "$disk_factor" ] || { [ $catch_up = 1 ] && disk_factor=5 || disk_factor=2; }
[[ "$disk_factor" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "large-db.sh: --disk-factor takes a number; got $disk_factor" >&2; exit 2; }
ref_etcd=$root/../shared/tools/ref-etcd
oxbench=${OXBENCH:-$root/target/release/oxbench}
bench_build_oxbench "$oxbench"
bench_select_servers large-db.sh oxcd,etcd3516,etcd35,etcd34
bench_server_binaries large-db.sh
ETCDCTL=${ETCDCTL:-$(dirname "${ETCD3516:-$("$ref_etcd" --bin 3.5.16)}")/etcdctl}
[ -x "$ETCDCTL" ] || { echo "large-db.sh: no etcdctl at $ETCDCTL (set ETCDCTL)" >&2; exit 1; }
port=${PORT:-24379}
tmp=${TMPDIR:-/tmp}

# The disk: the database, its WAL, the defrag's copy, the snapshot file and
# the new member's copy share it (with whoever else uses it).
need_kb=$(awk -v s="$size" -v f="$disk_factor" 'BEGIN {printf "%.0f", s * f / 1024}')
if [ "$(free_kb "$tmp")" -lt "$need_kb" ]; then
  echo "large-db.sh: $tmp has $(awk -v k="$(free_kb "$tmp")" 'BEGIN {printf "%.1f", k / 1048576}') GiB free;" \
    "a --size $size_arg run needs ${disk_factor}x its size, $(awk -v k="$need_kb" 'BEGIN {printf "%.1f", k / 1048576}') GiB" \
    "(--no-catch-up needs less; --disk-factor F to override; TMPDIR to move the work dir)" >&2
  exit 1
fi
floor_kb=$((2 * 1024 * 1024))

work=$(mktemp -d "$tmp/oxlargedb.XXXXXX")
results=$work/results
: >"$results"
pids=()          # member I's process: 0 the member, 1 the new one
load_pids=()     # the steady loads' loops
watchdog=""
failures=0
stop_members() {  # kill -9: each member is thrown away after its server's run
  kill_members
  : >"$work/member.pids"
}
cleanup() {  # the members first: a load's run waiting on one then fails at once
  touch "$work/stop"
  stop_members
  local p
  for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -z "$watchdog" ] || { kill "$watchdog" 2>/dev/null || true; wait "$watchdog" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The watchdog, every second: the least free space seen goes to
# $work/min-free (KiB; measure() resets it), and a member is killed (the run
# fails) when the disk runs low.
: >"$work/member.pids"
# Written by rename: a reader never meets the file empty (it took a
# truncated file for 0 KiB free, a peak of the whole disk).
set_min_free() { echo "$1" >"$work/min-free.$BASHPID" && mv -f "$work/min-free.$BASHPID" "$work/min-free"; }
set_min_free "$(free_kb "$work")"
(
  while sleep 1; do
    free=$(free_kb "$work")
    [[ "$free" =~ ^[0-9]+$ ]] || continue
    [ "$free" -ge "$(cat "$work/min-free" 2>/dev/null || echo 0)" ] || set_min_free "$free"
    if [ "$free" -lt "$floor_kb" ]; then
      echo "large-db.sh: less than 2 GiB left on $work's file system: killing the members" >&2
      touch "$work/disk-full"
      # shellcheck disable=SC2046 # one pid a word
      kill -KILL $(cat "$work/member.pids") 2>/dev/null || true
    fi
  done
) &
watchdog=$!

ctl() {  # ctl ENDPOINTS ARGS...
  local eps=$1; shift
  ETCDCTL_API=3 "$ETCDCTL" --endpoints "$eps" --dial-timeout 2s --command-timeout "${timeout}s" "$@"
}
status_field() {  # status_field revision|dbSize|dbSizeInUse: the member's
  ctl "$(client_ep 0)" endpoint status -w json | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]["Status"]
print(s["header"]["revision"] if sys.argv[1] == "revision" else s.get(sys.argv[1], 0))' "$1"
}
mb() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1e6}'; }

# fail SERVER MESSAGE: loudly, with the tail of the server's logs.
fail() {
  local s=$1; shift
  echo "large-db.sh: $s: FAILED: $*" >&2
  [ ! -e "$work/disk-full" ] || echo "large-db.sh: (the disk ran low: the watchdog killed the members)" >&2
  local log
  for log in "$work"/*.log; do
    [ -e "$log" ] || continue
    echo "---- last lines of $log" >&2
    tail -n 20 "$log" >&2
  done
  failures=$((failures + 1))
}

# start_member KIND I STATE INITIAL_CLUSTER: member I (m0 the first, m1 the
# new one), data $work/data-mI, log $work/KIND-mI.log; the same flags for all.
start_member() {
  local kind=$1 i=$2 state=$3 initial=$4 ep
  ep=$(client_ep "$i")
  if listening $((port + 2 * i)) || listening $((port + 2 * i + 1)); then
    echo "large-db.sh: something already listens on 127.0.0.1:$((port + 2 * i)) or :$((port + 2 * i + 1)) (PORT=... to move)" >&2
    exit 1
  fi
  "$(server_bin "$kind")" --name "m$i" --data-dir "$work/data-m$i" \
    --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
    --listen-peer-urls "$(peer_url "$i")" --initial-advertise-peer-urls "$(peer_url "$i")" \
    --initial-cluster "$initial" --initial-cluster-state "$state" \
    --quota-backend-bytes "$quota" >>"$work/$kind-m$i.log" 2>&1 &
  pids[i]=$!
  echo "${pids[@]}" >"$work/member.pids"
}
healthy() {  # healthy KIND I: waits until member I is healthy
  wait_healthy "${pids[$2]}" "$work/$1-m$2.log" "$timeout" "$oxbench" --endpoints "$(client_ep "$2")" health --timeout 1s
}

# put_pass KIND PASS: the K keys once, 100 clients; records the pass's seconds.
put_pass() {
  local kind=$1 pass=$2 out=$work/load-$2.json
  if ! timeout "$timeout" "$oxbench" --endpoints "$(client_ep 0)" --clients 100 --conns 10 --json put \
      --key-size 16 --val-size "$val_size" --total "$keys" --sequential-keys --key-space-size "$keys" \
      >"$out" 2>>"$work/oxbench.err"; then
    fail "$kind" "load pass $pass: oxbench failed ($(tail -n 1 "$work/oxbench.err"))"
    return 1
  fi
  local errs
  errs=$(python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(r["errors"], r.get("error_distribution", [])[:2])' "$out")
  if [ "${errs%% *}" != 0 ]; then
    fail "$kind" "load pass $pass: failed puts: $errs"
    return 1
  fi
}

# Steady loads around an operation: one-second oxbench runs (--rate, 8
# clients) back to back until $work/stop exists, each run's summary a line of
# $work/NAME.jsonl (a failed run: {"failed": true}).
steady() {
  local name=$1; shift
  : >"$work/$name.jsonl"
  while [ ! -e "$work/stop" ]; do
    "$oxbench" --endpoints "$(client_ep 0)" --clients 8 --json "$@" --rate "$rate" --total "$rate" \
      >>"$work/$name.jsonl" 2>>"$work/oxbench.err" || { echo '{"failed": true}' >>"$work/$name.jsonl"; sleep 0.2; }
  done
}
loads_start() {
  rm -f "$work/stop"
  steady put put --key-size 24 --val-size 256 --key-space-size 10000 &
  load_pids=($!)
  steady get range zzz &
  load_pids+=($!)
  sleep 0.5
}
# loads_stop KIND OP: ends the loads, records OP.put_p99_ms, OP.put_max_ms,
# OP.get_p99_ms, OP.get_max_ms (the worst one-second p99, the slowest request).
loads_stop() {
  local kind=$1 op=$2 p
  touch "$work/stop"
  for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  load_pids=()
  python3 - "$kind" "$op" "$work/put.jsonl" "$work/get.jsonl" >>"$results" <<'PY' || failures=$((failures + 1))
import json, sys
kind, op, put, get = sys.argv[1:5]
bad = False
for load, path in (("put", put), ("get", get)):
    runs = [json.loads(l) for l in open(path) if l.strip()]
    ok = bool(runs) and all(not r.get("failed") and r["requests"] > 0 and not r["errors"] for r in runs)
    if not ok:
        bad = True
        print(f"large-db.sh: {kind}: the {load} load around the {op} failed or had errors: {runs[-1:]}", file=sys.stderr)
    print(kind, f"{op}.{load}_p99_ms", "%.2f" % (max(r["p99"] for r in runs) * 1000) if ok else "n/a")
    print(kind, f"{op}.{load}_max_ms", "%.2f" % (max(r["slowest"] for r in runs) * 1000) if ok else "n/a")
sys.exit(1 if bad else 0)
PY
}

# status_pair: "m0_rev m0_applied m1_rev m1_applied" from one `endpoint
# status` of both members; '-' for one that did not answer.
status_pair() {
  local out
  out=$(ETCDCTL_API=3 "$ETCDCTL" --endpoints "$(client_ep 0),$(client_ep 1)" --dial-timeout 2s \
    --command-timeout 3s endpoint status -w json 2>/dev/null) || true
  status_fields "$out" "$(client_ep 0)" "$(client_ep 1)"
}
wait_caught_up() {  # wait_caught_up KIND: the new member's revision and applied index reach m0's
  local kind=$1 deadline last="" rev0 app0 rev1 app1
  deadline=$(($(date +%s) + timeout))
  while :; do
    if ! kill -0 "${pids[1]}" 2>/dev/null; then
      fail "$kind" "the new member exited before catching up (last status: ${last:-none})"; return 1
    fi
    read -r rev0 app0 rev1 app1 <<<"$(status_pair)"
    last="member rev $rev0 applied $app0; new member rev $rev1 applied $app1"
    if [ "$rev0" != - ] && [ "$rev1" = "$rev0" ] && [ "$app1" -ge "$app0" ]; then return 0; fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      fail "$kind" "the new member did not catch up within ${timeout}s: $last"; return 1
    fi
    sleep 0.1
  done
}

# measure SERVER: the six steps on a fresh member; a failed step ends the run
# of this server (the figures it did not reach are n/a).
measure() {
  local s=$1 t0 t1 out
  rm -rf "$work"/data-*
  disk_free0=$(free_kb "$work")
  set_min_free "$disk_free0"
  start_member "$s" 0 new "m0=$(peer_url 0)"
  healthy "$s" 0 || { fail "$s" "the member did not come up"; return 1; }

  echo "  $(date +%T.%3N) $s: load, $keys keys of $val_size B, twice" >&2
  t0=$(now)
  put_pass "$s" 1 || return 1
  put_pass "$s" 2 || return 1
  t1=$(now)
  record "$s" load_s "$(secs "$t0" "$t1")"
  record "$s" load_rps "$(awk -v n=$((2 * keys)) -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", n / (b - a)}')"
  local last_rev; last_rev=$(status_field revision)
  record "$s" db_mb "$(mb "$(status_field dbSize)")"
  record "$s" du_mb "$(du -sk "$work/data-m0" | awk '{printf "%.1f", $1 * 1024 / 1e6}')"
  record "$s" rss_load_mb "$(rss_mb "${pids[0]}")"

  echo "  $(date +%T.%3N) $s: restart" >&2
  t0=$(now)
  kill -TERM "${pids[0]}"
  local deadline=$(($(date +%s) + timeout))
  while kill -0 "${pids[0]}" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.02; done
  t1=$(now)
  if kill -0 "${pids[0]}" 2>/dev/null; then
    stop_members; fail "$s" "still running ${timeout}s after SIGTERM"; return 1
  fi
  wait "${pids[0]}" 2>/dev/null || true
  record "$s" stop_s "$(secs "$t0" "$t1")"
  t0=$(now)
  start_member "$s" 0 new "m0=$(peer_url 0)"
  healthy "$s" 0 || { fail "$s" "not healthy after the restart"; return 1; }
  t1=$(now)
  record "$s" restart_s "$(secs "$t0" "$t1")"
  record "$s" rss_restart_mb "$(rss_mb "${pids[0]}")"

  echo "  $(date +%T.%3N) $s: compaction at revision $last_rev" >&2
  loads_start
  t0=$(now)
  if ! out=$(ctl "$(client_ep 0)" compaction --physical "$last_rev" 2>&1); then
    loads_stop "$s" compact; fail "$s" "compaction: $out"; return 1
  fi
  t1=$(now)
  loads_stop "$s" compact
  record "$s" compact_s "$(secs "$t0" "$t1")"
  record "$s" compact_db_mb "$(mb "$(status_field dbSize)")"
  record "$s" in_use_mb "$(mb "$(status_field dbSizeInUse)")"

  echo "  $(date +%T.%3N) $s: defrag" >&2
  loads_start
  t0=$(now)
  if ! out=$(ctl "$(client_ep 0)" defrag 2>&1); then
    loads_stop "$s" defrag; fail "$s" "defrag: $out"; return 1
  fi
  t1=$(now)
  loads_stop "$s" defrag
  record "$s" defrag_s "$(secs "$t0" "$t1")"
  record "$s" defrag_db_mb "$(mb "$(status_field dbSize)")"

  echo "  $(date +%T.%3N) $s: snapshot save" >&2
  local c0 c1
  c0=$(cpu_s "${pids[0]}")
  t0=$(now)
  if ! out=$(/usr/bin/time -f "ctl-cpu %U %S" -o "$work/ctl-time" env ETCDCTL_API=3 "$ETCDCTL" \
      --endpoints "$(client_ep 0)" --dial-timeout 2s --command-timeout "${timeout}s" snapshot save "$work/snap.db" 2>&1); then
    rm -f "$work/snap.db" "$work/snap.db.part"; fail "$s" "snapshot save: $out"; return 1
  fi
  t1=$(now)
  c1=$(cpu_s "${pids[0]}")
  record "$s" snapshot_s "$(secs "$t0" "$t1")"
  record "$s" snapshot_mb "$(mb "$(stat -c %s "$work/snap.db")")"
  record "$s" snapshot_cpu_s "$(secs "$c0" "$c1")"
  record "$s" snapshot_ctl_cpu_s "$(awk '$1 == "ctl-cpu" {printf "%.2f", $2 + $3}' "$work/ctl-time")"
  rm -f "$work/snap.db"

  echo "  $(date +%T.%3N) $s: snapshot stream to a reader that discards it" >&2
  c0=$(cpu_s "${pids[0]}")
  t0=$(now)
  if ! out=$(timeout "$timeout" "$oxbench" --endpoints "$(client_ep 0)" snapshot 2>&1); then
    fail "$s" "oxbench snapshot: $out"; return 1
  fi
  t1=$(now)
  c1=$(cpu_s "${pids[0]}")
  record "$s" stream_s "$(secs "$t0" "$t1")"
  record "$s" stream_cpu_s "$(secs "$c0" "$c1")"

  [ $catch_up = 1 ] || return 0
  echo "  $(date +%T.%3N) $s: a new member catching up" >&2
  if ! out=$(ctl "$(client_ep 0)" member add m1 --learner --peer-urls="$(peer_url 1)" 2>&1); then
    fail "$s" "member add --learner: $out"; return 1
  fi
  t0=$(now)
  start_member "$s" 1 existing "m0=$(peer_url 0),m1=$(peer_url 1)"
  wait_caught_up "$s" || return 1
  t1=$(now)
  record "$s" catchup_s "$(secs "$t0" "$t1")"
  record "$s" rss_catchup_mb "$(rss_mb "${pids[1]}")"
}

echo "large-db.sh: $keys keys of $val_size B written twice ($size_arg of values), --quota-backend-bytes $quota; work dir $work" >&2
for ((round = 0; round < rounds; round++)); do
  n=${#servers[@]}
  for ((i = 0; i < n; i++)); do
    s=${servers[$(((i + round) % n))]}
    echo "round $((round + 1))/$rounds: $s ($(server_bin "$s"))" >&2
    measure "$s" || true
    record "$s" disk_peak_mb "$(awk -v a="$disk_free0" -v b="$(cat "$work/min-free")" 'BEGIN {printf "%.1f", (a - b) * 1024 / 1e6}')"
    echo "  $(date +%T.%3N) $s: done" >&2
    stop_members
    rm -rf "$work"/data-* "$work/snap.db"
  done
done

python3 "$root/bench/table.py" "$results" \
  "load (two passes, 100 clients)|load_s|s" "load, puts/s|load_rps|req/s" \
  "db size after the load|db_mb|MB" "data dir after the load (du)|du_mb|MB" \
  "VmRSS after the load|rss_load_mb|MB" "stop (SIGTERM -> exit)|stop_s|s" \
  "restart to healthy|restart_s|s" "VmRSS after the restart|rss_restart_mb|MB" \
  "compaction of half the revisions|compact_s|s" "db size after it|compact_db_mb|MB" \
  "db size in use after it|in_use_mb|MB" \
  "put p99 during the compaction|compact.put_p99_ms|ms" "put slowest during the compaction|compact.put_max_ms|ms" \
  "range p99 during the compaction|compact.get_p99_ms|ms" "range slowest during the compaction|compact.get_max_ms|ms" \
  "defrag|defrag_s|s" "db size after the defrag|defrag_db_mb|MB" \
  "put p99 during the defrag|defrag.put_p99_ms|ms" "put slowest during the defrag|defrag.put_max_ms|ms" \
  "range p99 during the defrag|defrag.get_p99_ms|ms" "range slowest during the defrag|defrag.get_max_ms|ms" \
  "snapshot save|snapshot_s|s" "snapshot file|snapshot_mb|MB" \
  "member CPU during the save|snapshot_cpu_s|s" "etcdctl CPU during the save|snapshot_ctl_cpu_s|s" \
  "snapshot stream, read and discarded|stream_s|s" "member CPU during the stream|stream_cpu_s|s" \
  "new member: start -> caught up|catchup_s|s" "new member VmRSS, caught up|rss_catchup_mb|MB" \
  "peak disk use (df, every second)|disk_peak_mb|MB"
echo "$keys keys of $val_size B (16-byte keys) written twice; steady loads of $rate req/s each (8 clients: puts of 256 B on 10,000 other keys, linearizable ranges of one key), p99 = the worst one-second run's; --quota-backend-bytes $quota; etcd's default --snapshot-count on both"
if [ "$failures" -gt 0 ]; then
  echo "large-db.sh: $failures failure(s), see above" >&2
  exit 1
fi
