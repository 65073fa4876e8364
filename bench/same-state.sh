#!/usr/bin/env bash
# A large store's defrag and snapshot save, each server's run starting from
# the same state (issue 22). On this VM memory that stayed free a while goes
# back to the host (virtio-balloon's free page reporting) and costs ~10x at
# its first touch, so in bench/large-db.sh the server that leaves more free
# memory (oxcd's 131 MB resident at 8 GiB against etcd's 12 GB) makes the
# next step that grows the page cache (its defrag's copy, etcdctl's snapshot
# file) meet it. Here each server's store is loaded once (K keys of V B
# written twice, compacted at its last revision) and kept; each run copies
# it afresh, starts one member on the copy, times `etcdctl defrag`, then
# `etcdctl snapshot save` twice (with etcdctl's CPU and the member's; the
# second file's pages take the memory the first one's gave back, the same
# state for both servers), and throws the copy away. The servers alternate
# per round; the table shows medians.
#
#   bench/same-state.sh [--size S] [--val-size B] [--rounds N] [--drop SECS]
#                       [--only oxcd,etcd3516] [--timeout SECS] [--keep DIR]
#
#   --size S       the load's bytes of values, K/M/G = KiB/MiB/GiB (default
#                  8G); half of them superseded, as in large-db.sh
#   --val-size B   value size (default 8192)
#   --rounds N     rounds (default 2)
#   --drop SECS    before the defrag and before the save: sync, drop the
#                  page cache (root: /proc/sys/vm/drop_caches) and wait SECS,
#                  so that both steps meet memory that stayed free (default:
#                  no drop; the copy of the store has just taken memory)
#   --only LIST    oxcd, etcd3516, etcd35, etcd34 (default oxcd,etcd3516)
#   --timeout SECS deadline of any one step (default 3600)
#   --keep DIR     keep each server's loaded store in DIR
#                  (DIR/KIND-KEYS-VALSIZE) and use it when it is there: a
#                  next run of the same size skips the loads
#
# The disk holds every server's kept store, one copy and a snapshot file:
# the script refuses to start without 5x SIZE free (3x when --keep DIR
# holds the stores already). Environment: OXCD,
# OXBENCH, ETCD3516, ETCD35, ETCD34, ETCDCTL as in large-db.sh; PORT (default
# 25379) the member's client port, PORT+1 its peer port; TMPDIR (default
# /tmp) holds the work dir. Loopback only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
size_arg=8G val_size=8192 rounds=2 drop="" only=oxcd,etcd3516 timeout=3600 keep_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size_arg=$2; shift 2 ;;
    --val-size) val_size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --drop) drop=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --keep) keep_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "same-state.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
bench_positive same-state.sh val_size rounds timeout
bench_size same-state.sh "$size_arg"
keys=$((size / (2 * val_size)))
[ "$keys" -ge 100 ] || { echo "same-state.sh: --size $size_arg holds only $keys keys of $val_size B (100 at least)" >&2; exit 2; }
if [ -n "$drop" ]; then
  [[ "$drop" =~ ^[0-9]+$ ]] || { echo "same-state.sh: --drop takes seconds; got $drop" >&2; exit 2; }
  [ -w /proc/sys/vm/drop_caches ] || { echo "same-state.sh: --drop needs to write /proc/sys/vm/drop_caches (root)" >&2; exit 2; }
fi
oxbench=${OXBENCH:-$root/target/release/oxbench}
bench_build_oxbench "$oxbench"
bench_select_servers same-state.sh oxcd,etcd3516,etcd35,etcd34
bench_server_binaries same-state.sh
ETCDCTL=${ETCDCTL:-$(dirname "${ETCD3516:-$("$root/../shared/tools/ref-etcd" --bin 3.5.16)}")/etcdctl}
[ -x "$ETCDCTL" ] || { echo "same-state.sh: no etcdctl at $ETCDCTL (set ETCDCTL)" >&2; exit 1; }
port=${PORT:-25379}
tmp=${TMPDIR:-/tmp}
quota=$((size * 3))

# a kept store (--keep) is on the disk already: a copy, the defrag's and
# the snapshot file to come
factor=5
[ -z "$keep_dir" ] || ! ls -d "$keep_dir"/*-"$keys-$val_size" >/dev/null 2>&1 || factor=3
need_kb=$((size * factor / 1024))
if [ "$(free_kb "$tmp")" -lt "$need_kb" ]; then
  echo "same-state.sh: $tmp has $(($(free_kb "$tmp") / 1048576)) GiB free; a --size $size_arg run needs ${factor}x its size ($((need_kb / 1048576)) GiB; TMPDIR to move the work dir)" >&2
  exit 1
fi

work=$(mktemp -d "$tmp/oxsamestate.XXXXXX")
if [ -n "$keep_dir" ]; then
  mkdir -p "$keep_dir"
  stores=$(cd "$keep_dir" && pwd)
else
  stores=$work
fi
results=$work/results
: >"$results"
pids=()
failures=0
trap 'kill_members; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

ctl() { ETCDCTL_API=3 "$ETCDCTL" --endpoints "$(client_ep 0)" --dial-timeout 2s --command-timeout "${timeout}s" "$@"; }
fail() {  # fail SERVER MESSAGE: loudly, with the tail of the server's log
  echo "same-state.sh: $1: FAILED: $2" >&2
  [ ! -e "$work/$1.log" ] || tail -n 20 "$work/$1.log" >&2
  failures=$((failures + 1))
}
# settle: the state each timed step starts from (--drop: caches dropped, SECS).
settle() {
  [ -n "$drop" ] || return 0
  sync
  echo 3 >/proc/sys/vm/drop_caches
  sleep "$drop"
}

# start KIND DIR: one member on DIR; waits until it is healthy.
start() {
  local kind=$1 dir=$2 ep
  ep=$(client_ep 0)
  if listening "$port" || listening $((port + 1)); then
    echo "same-state.sh: something already listens on 127.0.0.1:$port or :$((port + 1)) (PORT=... to move)" >&2
    exit 1
  fi
  "$(server_bin "$kind")" --name m0 --data-dir "$dir" \
    --listen-client-urls "http://$ep" --advertise-client-urls "http://$ep" \
    --listen-peer-urls "$(peer_url 0)" --initial-advertise-peer-urls "$(peer_url 0)" \
    --initial-cluster "m0=$(peer_url 0)" --quota-backend-bytes "$quota" >>"$work/$kind.log" 2>&1 &
  pids=($!)
  wait_healthy "${pids[0]}" "$work/$kind.log" "$timeout" "$oxbench" --endpoints "$ep" health --timeout 1s
}
# stop: SIGTERM, and the exit waited for (a kept store is closed cleanly).
stop() {
  kill -TERM "${pids[0]}" 2>/dev/null || true
  wait "${pids[0]}" 2>/dev/null || true
  pids=()
}

# keep KIND: the store kept for KIND's runs, $stores/KIND-KEYS-VALSIZE (one
# a --keep DIR holds already is used as it is).
keep() {
  local kind=$1 pass rev
  [ ! -d "$stores/$kind-$keys-$val_size" ] || return 0
  rm -rf "$stores/$kind-$keys-$val_size.part"
  echo "  $(date +%T.%3N) $kind: load, $keys keys of $val_size B, twice, then compaction" >&2
  start "$kind" "$stores/$kind-$keys-$val_size.part" || { fail "$kind" "the member did not come up"; return 1; }
  for pass in 1 2; do
    if ! timeout "$timeout" "$oxbench" --endpoints "$(client_ep 0)" --clients 100 --conns 10 put \
        --key-size 16 --val-size "$val_size" --total "$keys" --sequential-keys --key-space-size "$keys" \
        >/dev/null 2>>"$work/oxbench.err"; then
      fail "$kind" "load pass $pass: $(tail -n 1 "$work/oxbench.err")"; stop; return 1
    fi
  done
  rev=$(ctl endpoint status -w json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])')
  ctl compaction --physical "$rev" >/dev/null || { fail "$kind" "compaction at $rev"; stop; return 1; }
  stop
  mv "$stores/$kind-$keys-$val_size.part" "$stores/$kind-$keys-$val_size"
}

# run KIND: one run on a fresh copy of KIND's kept store.
run() {
  local kind=$1 dir=$work/data t0 t1 c0 c1 out
  rm -rf "$dir"
  cp -a "$stores/$kind-$keys-$val_size" "$dir"
  start "$kind" "$dir" || { fail "$kind" "the member did not come up on the copy"; return 1; }
  settle
  echo "  $(date +%T.%3N) $kind: defrag" >&2
  c0=$(cpu_s "${pids[0]}"); t0=$(now)
  out=$(ctl defrag 2>&1) || { fail "$kind" "defrag: $out"; stop; return 1; }
  t1=$(now); c1=$(cpu_s "${pids[0]}")
  record "$kind" defrag_s "$(secs "$t0" "$t1")"
  record "$kind" defrag_cpu_s "$(secs "$c0" "$c1")"
  echo "    defrag $(secs "$t0" "$t1") s, member CPU $(secs "$c0" "$c1") s" >&2
  settle
  save "$kind" save || { stop; return 1; }
  # again, into the memory the first file's pages just gave back: etcdctl's
  # writes then meet the same state whichever server it saves from
  save "$kind" save2 || { stop; return 1; }
  stop
  rm -rf "$dir"
}

# save KIND NAME: one timed `etcdctl snapshot save`; records NAME_s,
# NAME_cpu_s (the member's), NAME_ctl_cpu_s (etcdctl's), and for the first
# (NAME save) snapshot_mb.
save() {
  local kind=$1 name=$2 t0 t1 c0 c1 out
  echo "  $(date +%T.%3N) $kind: snapshot save ($name)" >&2
  c0=$(cpu_s "${pids[0]}"); t0=$(now)
  if ! out=$(/usr/bin/time -f "ctl-cpu %U %S" -o "$work/ctl-time" env ETCDCTL_API=3 "$ETCDCTL" \
      --endpoints "$(client_ep 0)" --dial-timeout 2s --command-timeout "${timeout}s" snapshot save "$work/snap.db" 2>&1); then
    rm -f "$work/snap.db" "$work/snap.db.part"; fail "$kind" "snapshot save: $out"; return 1
  fi
  t1=$(now); c1=$(cpu_s "${pids[0]}")
  record "$kind" "${name}_s" "$(secs "$t0" "$t1")"
  record "$kind" "${name}_cpu_s" "$(secs "$c0" "$c1")"
  record "$kind" "${name}_ctl_cpu_s" "$(awk '$1 == "ctl-cpu" {printf "%.2f", $2 + $3}' "$work/ctl-time")"
  [ "$name" != save ] || record "$kind" snapshot_mb "$(awk -v b="$(stat -c %s "$work/snap.db")" 'BEGIN {printf "%.1f", b / 1e6}')"
  echo "    $name $(secs "$t0" "$t1") s, member CPU $(secs "$c0" "$c1") s, etcdctl CPU $(awk '$1 == "ctl-cpu" {printf "%.2f", $2 + $3}' "$work/ctl-time") s" >&2
  rm -f "$work/snap.db"
}

echo "same-state.sh: $keys keys of $val_size B written twice ($size_arg of values)${drop:+, caches dropped ${drop} s before each step}; work dir $work" >&2
for s in "${servers[@]}"; do keep "$s" || true; done
for ((round = 0; round < rounds; round++)); do
  n=${#servers[@]}
  for ((i = 0; i < n; i++)); do
    s=${servers[$(((i + round) % n))]}
    [ -d "$stores/$s-$keys-$val_size" ] || continue
    echo "round $((round + 1))/$rounds: $s ($(server_bin "$s"))" >&2
    run "$s" || true
  done
done

python3 "$root/bench/table.py" "$results" \
  "defrag|defrag_s|s" "member CPU during the defrag|defrag_cpu_s|s" \
  "snapshot save|save_s|s" "snapshot file|snapshot_mb|MB" \
  "member CPU during the save|save_cpu_s|s" "etcdctl CPU during the save|save_ctl_cpu_s|s" \
  "snapshot save again|save2_s|s" "member CPU during it|save2_cpu_s|s" \
  "etcdctl CPU during it|save2_ctl_cpu_s|s"
echo "$keys keys of $val_size B (16-byte keys) written twice, compacted at the last revision; each run on a fresh copy of that store${drop:+, the page cache dropped ${drop} s before the defrag and before the save}"
if [ "$failures" -gt 0 ]; then
  echo "same-state.sh: $failures failure(s), see above" >&2
  exit 1
fi
