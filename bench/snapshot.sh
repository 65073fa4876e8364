#!/usr/bin/env bash
# Snapshots in etcd's format, oxcd vs etcd 3.5.16 side by side (issue 19's
# performance figures): a fresh single member loaded with N keys of 256 B,
# then `etcdctl snapshot save` timed (with the server's peak RSS during it,
# sampled from /proc every 50 ms), then the restore of that same file timed
# with each tool's own (`oxctl snapshot restore` / `etcdutl snapshot
# restore`, with its peak RSS from /usr/bin/time). Both snapshot files are
# also checked by `etcdutl snapshot status` (bbolt's consistency check).
# Last, the stopped etcd member's data dir is converted in place by `oxctl
# migrate` (timed, with its peak RSS) and served by oxcd (every key counted).
#
#   bench/snapshot.sh [--keys N] [--rounds R]
#
# Defaults: 1,000,000 keys, 1 round (the servers alternate order per round;
# the table shows medians). Environment: OXCD, OXCTL, OXBENCH, ETCD,
# ETCDCTL, ETCDUTL override the binaries (release builds of ours by default:
# `cargo build --release -p oxcd -p oxctl -p bench`); PORT (default 28579) is
# the client port, PORT+1 the peer port. Loopback only.
set -euo pipefail

cd "$(dirname "$0")/.."
. bench/lib.sh
keys=1000000
rounds=1
while [ $# -gt 0 ]; do
  case $1 in
    --keys) keys=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "snapshot.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
OXCD=${OXCD:-target/release/oxcd}
OXCTL=${OXCTL:-target/release/oxctl}
OXBENCH=${OXBENCH:-target/release/oxbench}
ETCD=${ETCD:-/opt/etcd-3.5.16/etcd}
ETCDCTL=${ETCDCTL:-/opt/etcd-3.5.16/etcdctl}
ETCDUTL=${ETCDUTL:-/opt/etcd-3.5.16/etcdutl}
for bin in "$OXCD" "$OXCTL" "$OXBENCH" "$ETCD" "$ETCDCTL" "$ETCDUTL"; do
  [ -x "$bin" ] || { echo "snapshot.sh: $bin is missing" >&2; exit 1; }
done

work=$(mktemp -d /tmp/oxsnapshot.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
port=${PORT:-28579}
now() { echo "$EPOCHREALTIME"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# start_member BIN LOG: a one-member server on $work/data, its pid in $pid
start_member() {
  "$1" --name bench --data-dir "$work/data" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((port + 1))" >"$2" 2>&1 &
  pid=$!
}

results=$work/results
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  order="oxcd etcd"
  [ $((r % 2)) = 0 ] && order="etcd oxcd"
  for server in $order; do
    bin=$OXCD
    [ "$server" = etcd ] && bin=$ETCD
    rm -rf "$work/data" "$work/restored" "$work/snap.db"
    start_member "$bin" "$work/$server.log"
    wait_healthy "$pid" "$work/$server.log" 60 "$OXBENCH" --endpoints "127.0.0.1:$port" health --timeout 1s ||
      { echo "snapshot.sh: $server did not start" >&2; exit 1; }
    "$OXBENCH" --endpoints "127.0.0.1:$port" --clients 100 --conns 10 put --key-size 8 \
      --val-size 256 --total "$keys" --sequential-keys --key-space-size "$keys" >/dev/null
    before=$(rss_kb "$pid")
    peak=$before
    t0=$(now)
    "$ETCDCTL" --endpoints "127.0.0.1:$port" --command-timeout 600s snapshot save "$work/snap.db" \
      >"$work/save.out" 2>&1 &
    saver=$!
    while kill -0 "$saver" 2>/dev/null; do
      cur=$(rss_kb "$pid")
      [ "$cur" -gt "$peak" ] && peak=$cur
      sleep 0.05
    done
    wait "$saver" || { echo "snapshot.sh: $server: snapshot save failed:"; cat "$work/save.out"; exit 1; } >&2
    t1=$(now)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    status=$("$ETCDUTL" snapshot status "$work/snap.db" -w json)
    size=$(stat -c %s "$work/snap.db")
    # the restore, with the snapshot's own tool
    if [ "$server" = oxcd ]; then
      restore=("$OXCTL" snapshot restore "$work/snap.db" --data-dir "$work/restored")
    else
      restore=("$ETCDUTL" snapshot restore "$work/snap.db" --data-dir "$work/restored")
    fi
    t2=$(now)
    /usr/bin/time -f "%M" -o "$work/time.out" "${restore[@]}" >/dev/null 2>"$work/restore.err" \
      || { echo "snapshot.sh: $server: restore failed:"; cat "$work/restore.err"; exit 1; } >&2
    t3=$(now)
    restore_rss=$(tail -n 1 "$work/time.out")
    if [ "$server" = etcd ]; then
      # the stopped etcd member converted in place, then served by oxcd
      t4=$(now)
      /usr/bin/time -f "%M" -o "$work/time.out" "$OXCTL" migrate --data-dir "$work/data" \
        >"$work/migrate.out" 2>"$work/migrate.err" \
        || { echo "snapshot.sh: migrate failed:"; cat "$work/migrate.err"; exit 1; } >&2
      t5=$(now)
      migrate_rss=$(tail -n 1 "$work/time.out")
      start_member "$OXCD" "$work/migrated.log"
      wait_healthy "$pid" "$work/migrated.log" 120 "$OXBENCH" --endpoints "127.0.0.1:$port" health --timeout 1s ||
        { echo "snapshot.sh: oxcd did not start on the migrated data dir" >&2; exit 1; }
      t6=$(now)
      served=$("$ETCDCTL" --endpoints "127.0.0.1:$port" get "" --from-key --count-only -w fields \
        | awk '/"Count"/ {print $3}')
      kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""
      [ "$served" = "$keys" ] || { echo "snapshot.sh: the migrated member serves $served keys, not $keys" >&2; exit 1; }
      echo "etcd migrate_s $(secs "$t4" "$t5")" >>"$results"
      echo "etcd migrate_rss_mb $((migrate_rss / 1024))" >>"$results"
      echo "etcd migrated_start_s $(secs "$t5" "$t6")" >>"$results"
      echo "round $r: oxctl migrate of the stopped etcd member: $(secs "$t4" "$t5") s (peak $((migrate_rss / 1024)) MB), oxcd serving its $served keys $(secs "$t5" "$t6") s later" >&2
    fi
    echo "$server save_s $(secs "$t0" "$t1")" >>"$results"
    echo "$server save_rss_delta_mb $(((peak - before) / 1024))" >>"$results"
    echo "$server save_rss_peak_mb $((peak / 1024))" >>"$results"
    echo "$server snapshot_mb $(awk -v b="$size" 'BEGIN {printf "%.2f", b / 1e6}')" >>"$results"
    echo "$server restore_s $(secs "$t2" "$t3")" >>"$results"
    echo "$server restore_rss_mb $((restore_rss / 1024))" >>"$results"
    echo "round $r: $server: save $(secs "$t0" "$t1") s (server RSS $((before / 1024)) -> peak $((peak / 1024)) MB), $((size / 1000000)) MB, restore $(secs "$t2" "$t3") s (peak $((restore_rss / 1024)) MB); etcdutl status $status" >&2
  done
done

python3 - "$results" "$keys" <<'EOF'
import statistics, sys
values = {}
for line in open(sys.argv[1]):
    server, metric, value = line.split()
    values.setdefault((metric, server), []).append(float(value))
med = lambda m, s: statistics.median(values[(m, s)]) if (m, s) in values else None
rows = [
    ("snapshot save (etcdctl), s", "save_s"),
    ("server RSS peak during it, MB", "save_rss_peak_mb"),
    ("server RSS growth during it, MB", "save_rss_delta_mb"),
    ("snapshot file, MB", "snapshot_mb"),
    ("restore with its own tool, s", "restore_s"),
    ("restore peak RSS, MB", "restore_rss_mb"),
]
print(f"{int(sys.argv[2]):,} keys x 256 B; medians")
print(f"{'':36} {'oxcd':>8} {'etcd 3.5.16':>12} {'oxcd/etcd':>10}")
for title, metric in rows:
    o, e = med(metric, "oxcd"), med(metric, "etcd")
    ratio = f"{o / e:.2f}x" if o is not None and e else "-"
    fmt = lambda v: "-" if v is None else f"{v:,.2f}"
    print(f"{title:36} {fmt(o):>8} {fmt(e):>12} {ratio:>10}")
if med("migrate_s", "etcd") is not None:
    print(f"oxctl migrate of the stopped etcd member: {med('migrate_s', 'etcd'):.2f} s, "
          f"peak RSS {med('migrate_rss_mb', 'etcd'):.0f} MB; oxcd ready on it "
          f"{med('migrated_start_s', 'etcd'):.2f} s later")
EOF
