#!/usr/bin/env bash
# Authentication on the client port, oxcd against etcd 3.5.16, side by side
# on this machine: each server runs once without auth and once with auth
# enabled (user root with the root role; user bench whose role has readwrite
# on the whole keyspace; simple tokens, the default), and oxbench measures
# put and range (serializable) with 100 clients over 10 connections, as user
# bench in the auth case: each connection authenticates once, then every
# request carries its token, so the figures show the per-request token and
# permission check, not bcrypt. Each run starts a fresh member with a fresh
# data dir. Rounds alternate the servers; medians are printed with the
# oxcd/etcd ratios without and with auth.
#
#   bench/auth.sh [--rounds N] [--quick]
#
#   --quick   5,000 puts and 10,000 ranges a run (as bench/tls.sh --quick)
#
# Environment: FULL=1 for the full load (200,000 puts, 500,000 ranges a run;
# default 50,000 and 100,000, as bench/tls.sh: a few minutes in all); OXCD, OXBENCH, ETCD
# (default /opt/etcd-3.5.16/etcd, installed by
# `REF_ETCD=3.5.16 ../shared/tools/ref-etcd`; without it only oxcd runs),
# ETCDCTL (default the etcdctl next to ETCD, else /usr/bin/etcdctl); PORT
# (default 28479) is the client port, PORT+1 the peer port.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/lib.sh"
rounds=3 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "auth.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
n_put=50000 n_range=100000
[ $quick = 1 ] && n_put=5000 n_range=10000
[ "${FULL:-0}" = 1 ] && n_put=200000 n_range=500000
OXCD=${OXCD:-$root/target/release/oxcd}
OXBENCH=${OXBENCH:-$root/target/release/oxbench}
ETCD=${ETCD:-/opt/etcd-3.5.16/etcd}
ETCDCTL=${ETCDCTL:-$(dirname "$ETCD")/etcdctl}
[ -x "$ETCDCTL" ] || ETCDCTL=/usr/bin/etcdctl
[ -x "$ETCDCTL" ] || { echo "auth.sh: no etcdctl (set ETCDCTL)" >&2; exit 1; }
for b in "$OXCD" "$OXBENCH"; do
  [ -x "$b" ] || (cd "$root" && cargo build --release -p bench -p oxcd >&2)
done
servers="oxcd etcd"
if [ ! -x "$ETCD" ]; then
  echo "auth.sh: no etcd at $ETCD (REF_ETCD=3.5.16 ../shared/tools/ref-etcd); measuring oxcd alone" >&2
  servers="oxcd"
fi

work=$(mktemp -d /tmp/oxauth.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port=${PORT:-28479}
user_args=()
bench() { "$OXBENCH" --endpoints "127.0.0.1:$port" "${user_args[@]}" "$@"; }
ctl() { ETCDCTL_API=3 "$ETCDCTL" --endpoints "127.0.0.1:$port" "$@" >/dev/null; }
# start NAME MODE: one fresh member of NAME (oxcd|etcd) on $port; MODE auth
# creates the users and enables auth before anything is measured.
start() {
  local bin=$OXCD
  [ "$1" = etcd ] && bin=$ETCD
  rm -rf "$work/data"
  "$bin" --name bench --data-dir "$work/data" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((port + 1))" >"$work/$1-$2.log" 2>&1 &
  pid=$!
  user_args=()
  wait_healthy "$pid" "$work/$1-$2.log" 60 bench health --timeout 1s ||
    { echo "auth.sh: $1 did not start" >&2; exit 1; }
  if [ "$2" = auth ]; then
    ctl user add root:rootpw
    ctl user grant-role root root
    ctl role add bench
    ctl role grant-permission bench readwrite --from-key ''
    ctl user add bench:benchpw
    ctl user grant-role bench bench
    ctl auth enable
    if ctl get foo 2>/dev/null; then
      echo "auth.sh: $1 serves a read without credentials after auth enable" >&2
      exit 1
    fi
    user_args=(--user bench:benchpw)
    wait_healthy "$pid" "$work/$1-$2.log" 60 bench health --timeout 1s ||
      { echo "auth.sh: $1 does not answer bench's requests after auth enable" >&2; exit 1; }
  fi
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=""; }
# The req/s of one oxbench --json run; its errors, if any, go to stderr and
# to the table's notes, since a run with errors measures something else.
rps() {
  python3 -c '
import json, sys
r = json.loads(sys.stdin.read().splitlines()[-1])
if r["errors"]:
    print("auth.sh: %s: %d errors: %s" % (sys.argv[1], r["errors"], r["error_distribution"]), file=sys.stderr)
print("%.0f %d" % (r["rps"], r["errors"]))' "$1"
}

results=$work/results
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  order=$servers
  [ $((r % 2)) = 0 ] && order=$(echo "$servers" | tr ' ' '\n' | tac | tr '\n' ' ')
  for server in $order; do
    for mode in noauth auth; do
      start "$server" $mode
      p=$(bench --json --clients 100 --conns 10 put --key-size 8 --val-size 256 \
        --total $n_put --sequential-keys --key-space-size 100000 | rps "$server $mode put")
      g=$(bench --json --clients 100 --conns 10 range foo --consistency s --total $n_range \
        | rps "$server $mode range")
      stop
      echo "$server $mode put $p" >>"$results"
      echo "$server $mode range $g" >>"$results"
      echo "round $r: $server $mode put ${p% *} req/s, range ${g% *} req/s" >&2
    done
  done
done

python3 - "$results" "$n_put" "$n_range" <<'EOF'
import statistics, sys
rows, errors = {}, {}
for line in open(sys.argv[1]):
    server, mode, what, value, errs = line.split()
    rows.setdefault((what, mode, server), []).append(float(value))
    errors[(what, mode, server)] = errors.get((what, mode, server), 0) + int(errs)
med = {k: statistics.median(v) for k, v in rows.items()}
cell = lambda k: f"{med[k]:9,.0f}" if k in med else f"{'-':>9}"
print(f"{'workload':38} {'oxcd':>9} {'etcd':>9} {'ratio':>6}")
for what, label in [("put", "put, 100 clients"), ("range", "range serializable, 100 clients")]:
    for mode in ("noauth", "auth"):
        o, e = (what, mode, "oxcd"), (what, mode, "etcd")
        ratio = f"{med[o] / med[e]:5.2f}x" if o in med and e in med else f"{'-':>6}"
        print(f"{label + (' (auth)' if mode == 'auth' else ''):38} {cell(o)} {cell(e)} {ratio}")
for server in ("oxcd", "etcd"):
    for what in ("put", "range"):
        n, a = (what, "noauth", server), (what, "auth", server)
        if n in med and a in med:
            print(f"  {server} {what}: auth costs {100 * (1 - med[a] / med[n]):.0f}% of req/s")
print(f"medians of {len(rows[('put', 'noauth', 'oxcd')])} round(s), req/s, {sys.argv[2]} puts "
      f"and {sys.argv[3]} ranges a run, 10 connections; etcd = etcd 3.5.16; auth: user bench "
      "(readwrite on the whole keyspace), simple token, one Authenticate per connection")
bad = {k: v for k, v in errors.items() if v}
if bad:
    print("errors (figures with errors measure something else): "
          + ", ".join(f"{s} {m} {w}: {n}" for (w, m, s), n in sorted(bad.items())))
EOF
