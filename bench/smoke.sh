#!/usr/bin/env bash
# The bench scripts' smoke run (CI, issue 22): every bench/*.sh once at a
# tiny size, one round, against oxcd and etcd 3.5.16, so that none of them
# rots. Its figures mean nothing (debug builds on a shared machine) and are
# not looked at; the run fails when a script
#   - exits non-zero (or runs past $SMOKE_TIMEOUT seconds),
#   - prints no table, or a table without a row listed below for it,
#   - shows, on such a row, n/a, '-' or a figure flagged '!' (failed
#     requests), or fewer than three figures (oxcd, etcd 3.5.16, the ratio).
# A bench/*.sh with no entry below fails the run too: give a new script its
# tiny arguments and the rows it must fill in entry().
#
#   bench/smoke.sh [SCRIPT ...]     (default: every bench/*.sh but this one and lib.sh)
#
# Environment: OXCD, OXBENCH, OXCTL (default target/debug/{oxcd,oxbench,oxctl},
# as `cargo test --workspace` leaves them; oxbench is built with `cargo build
# --locked -p bench --bin oxbench` when missing), ETCD (default
# /opt/etcd-3.5.16/etcd, installed by `REF_ETCD=3.5.16 ../shared/tools/ref-etcd`
# when missing; its etcdctl and etcdutl beside it); PORT, when set, is passed
# to every script (its client port base; default each script's own);
# SMOKE_TIMEOUT (default 300) bounds each script. Each script's output is
# printed only when it fails; its time is printed always.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

export OXCD=${OXCD:-$root/target/debug/oxcd}
export OXBENCH=${OXBENCH:-$root/target/debug/oxbench}
export OXCTL=${OXCTL:-$root/target/debug/oxctl}
[ -x "$OXCD" ] || { echo "smoke.sh: no oxcd at $OXCD (cargo build -p oxcd, or set OXCD)" >&2; exit 1; }
[ -x "$OXCTL" ] || { echo "smoke.sh: no oxctl at $OXCTL (cargo build -p oxctl, or set OXCTL)" >&2; exit 1; }
if [ ! -x "$OXBENCH" ]; then
  echo "smoke.sh: building oxbench..." >&2
  cargo build --locked -p bench --bin oxbench >&2
  OXBENCH=$root/target/debug/oxbench
fi
export ETCD=${ETCD:-/opt/etcd-3.5.16/etcd}
if [ ! -x "$ETCD" ]; then
  echo "smoke.sh: no etcd at $ETCD: installing it (REF_ETCD=3.5.16 ../shared/tools/ref-etcd)..." >&2
  REF_ETCD=3.5.16 "$root/../shared/tools/ref-etcd" --bin 3.5.16 >/dev/null || true
  [ -x "$ETCD" ] || { echo "smoke.sh: still no etcd at $ETCD (set ETCD)" >&2; exit 1; }
fi
# the names the scripts take for the reference etcd and its tools
export ETCD3516=$ETCD
export ETCDCTL=${ETCDCTL:-$(dirname "$ETCD")/etcdctl}
export ETCDUTL=${ETCDUTL:-$(dirname "$ETCD")/etcdutl}
timeout_secs=${SMOKE_TIMEOUT:-300}

# entry SCRIPT: sets args (the tiny run's arguments) and rows (the table rows
# that must carry oxcd's figure, etcd 3.5.16's and their ratio). Keep each
# run to seconds: the whole smoke run has 4 minutes in CI (2 cores, debug
# builds).
entry() {
  args=() rows=()
  case "$1" in
    compare.sh)
      args=(--quick --quota 4294967296)
      rows=("put, 1 client" "put, 1 client, p99" "put, 100 clients x 10 conns"
        "put, 100 clients x 10 conns, p99" "txn-put, 100 clients" "range linearizable, 100 clients"
        "range serializable, 100 clients" "watch-latency, 1,000 watchers, p99"
        "server CPU per 10k puts (100 clients)" "put, loading 10,000 keys"
        "RSS after 10,000 keys of 256 B" "data dir size, 10,000 keys"
        "restart to healthy, 10,000 keys" "RSS after restart, 10,000 keys") ;;
    check-perf.sh)
      args=(s --duration 3)
      rows=("throughput" "slowest request" "stddev") ;;
    defrag-latency.sh)
      args=(--keys 2000 --rate 100 --seconds 4)
      rows=("db size before the defrag" "db size after" "defrag (etcdctl defrag)"
        "put p99 around the defrag" "put slowest" "range p99 around the defrag" "range slowest") ;;
    lease-expiry.sh)
      args=(--leases 200 --ttl 2 --put-rate 50)
      rows=("lease grants" "first lease expired after" "every lease expired after"
        "put p50 during the expiry" "put p99 during the expiry" "put slowest") ;;
    auth.sh)
      args=(--rounds 1 --quick)
      rows=("put, 100 clients" "put, 100 clients (auth)"
        "range serializable, 100 clients" "range serializable, 100 clients (auth)") ;;
    tls.sh)
      args=(--rounds 1 --quick)
      rows=("put, 100 clients" "put, 100 clients (TLS)"
        "range serializable, 100 clients" "range serializable, 100 clients (TLS)") ;;
    snapshot.sh)
      args=(--keys 2000)
      rows=("snapshot save (etcdctl), s" "server RSS peak during it, MB" "snapshot file, MB"
        "restore with its own tool, s" "restore peak RSS, MB") ;;
    membership.sh)
      args=(--keys 2000 --learner-keys 2000 --pause-puts 1000 --timeout 120)
      rows=("  load (100 clients)" "  member remove" "  member add" "  catch-up: start -> caught up"
        "  total: remove + add + start -> healthy" "  new member RSS after catch-up"
        "  member add --learner" "  learner RSS after catch-up"
        "  member remove (through a follower)" "  write pause (slowest put)") ;;
    watch-scale.sh)
      args=(--streams 10 --watchers-per-stream 10 --puts 20 --put-rate 10)
      rows=("creating every watcher" "events delivered per second" "slowest put (the writer)"
        "VmRSS, idle" "VmRSS, every watcher open") ;;
    large-db.sh)
      args=(--size 4M --val-size 4096 --rate 100 --timeout 120)
      rows=("load (two passes, 100 clients)" "load, puts/s" "db size after the load"
        "data dir after the load (du)" "VmRSS after the load" "restart to healthy"
        "stop (SIGTERM -> exit)" "VmRSS after the restart" "compaction of half the revisions"
        "db size after it" "db size in use after it"
        "put p99 during the compaction" "put slowest during the compaction"
        "range p99 during the compaction" "range slowest during the compaction"
        "defrag" "db size after the defrag" "put p99 during the defrag" "put slowest during the defrag"
        "range p99 during the defrag" "range slowest during the defrag"
        "snapshot save" "snapshot file" "snapshot stream, read and discarded"
        "new member: start -> caught up" "new member VmRSS, caught up")
      # The CPU rows (member and etcdctl during the save and the stream) are
      # not required: /proc counts CPU in 10 ms ticks, and a tiny save may
      # take none on either server, leaving the ratio '-' (CI stop 40).
      ;;
    same-state.sh)
      args=(--size 4M --val-size 4096 --rounds 1 --timeout 120)
      # the CPU rows not required, as for large-db.sh
      rows=("defrag" "snapshot save" "snapshot file" "snapshot save again") ;;
    failover.sh)
      args=(--quick --members 3 --timeout 60)
      rows=("3 members: kill -9 leader -> first acknowledged put"
        "3 members: kill -9 leader -> new leader seen") ;;
    *) return 1 ;;
  esac
}

# check_table OUT ROW...: every ROW is in OUT with three figures or more and
# nothing missing; prints what is wrong, returns 1 then.
check_table() {
  python3 - "$@" <<'EOF'
import re, sys
text, rows = open(sys.argv[1]).read().splitlines(), sys.argv[2:]
number = re.compile(r"^-?[0-9][0-9,]*(\.[0-9]+)?x?$")
# what may follow a row's title: figures, units, flags ('-', n/a, 1/1)
cell = re.compile(r"^([0-9,.!/x%<>=-]+|n/a|[a-z]+/s|ms|s|MB|KB|GB|B)$")
bad = []
for row in rows:
    found = []
    for line in text:
        if not line.startswith(row + " "):
            continue
        cells = line[len(row):].split()
        if cells and all(cell.match(c) for c in cells):
            found.append(cells)
    if not found:
        bad.append(f"no row {row.strip()!r}")
    for cells in found:
        missing = [c for c in cells if c in ("-", "n/a") or c.endswith("!")]
        figures = [c for c in cells if number.match(c)]
        if missing or len(figures) < 3:
            bad.append(f"row {row.strip()!r}: {' '.join(cells)}")
for b in bad:
    print("    " + b)
sys.exit(1 if bad else 0)
EOF
}

scripts=("$@")
if [ ${#scripts[@]} -eq 0 ]; then
  for f in bench/*.sh; do
    case "$(basename "$f")" in smoke.sh|lib.sh) ;; *) scripts+=("$(basename "$f")") ;; esac
  done
fi
work=$(mktemp -d /tmp/oxsmoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "smoke.sh: oxcd $OXCD, oxbench $OXBENCH, etcd $ETCD ($("$ETCD" --version | head -n 1))" >&2
summary=() failed=0 t_all=$EPOCHREALTIME
for name in "${scripts[@]}"; do
  name=$(basename "$name")
  if ! entry "$name"; then
    echo "smoke.sh: $name: no tiny run known: add its arguments and rows to entry() in bench/smoke.sh" >&2
    summary+=("$(printf '%-20s %8s  %s' "$name" - "FAILED: no entry")")
    failed=1
    continue
  fi
  echo "smoke.sh: bench/$name ${args[*]}" >&2
  t0=$EPOCHREALTIME status=0
  timeout -k 10 "$timeout_secs" "bench/$name" "${args[@]}" >"$work/$name.out" 2>"$work/$name.err" || status=$?
  took=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
  verdict=ok
  if [ $status != 0 ]; then
    verdict="FAILED: exit $status"
    [ $status != 124 ] || verdict+=" (timed out after ${timeout_secs}s)"
  elif ! check_table "$work/$name.out" "${rows[@]}" >"$work/$name.check"; then
    verdict="FAILED: table"
  fi
  if [ "$verdict" != ok ]; then
    failed=1
    {
      echo "smoke.sh: bench/$name ${args[*]}: $verdict"
      cat "$work/$name.check" 2>/dev/null || true
      echo "  --- its stdout:"; sed 's/^/  /' "$work/$name.out"
      # long enough for a server's log tail (wait_healthy's 40 lines) and
      # the script's own failure lines after it
      echo "  --- its stderr (last 200 lines):"; tail -n 200 "$work/$name.err" | sed 's/^/  /'
    } >&2
  fi
  echo "smoke.sh: bench/$name: $verdict, ${took} s" >&2
  summary+=("$(printf '%-20s %8s  %s' "$name" "$took" "$verdict")")
done
printf '%-20s %8s  %s\n' script seconds result
printf '%s\n' "${summary[@]}"
printf '%-20s %8s\n' total "$(awk -v a="$t_all" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')"
exit $failed
