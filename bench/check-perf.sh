#!/usr/bin/env bash
# `etcdctl check perf --load=LOAD` against oxcd, etcd 3.5.1 and etcd 3.4.23,
# one after the other on the same machine, each a fresh single member on
# loopback. Usage: bench/check-perf.sh [s|m|l|xl]   (default s)
set -euo pipefail
cd "$(dirname "$0")/.."
load=${1:-s}
shared=../shared/tools/ref-etcd
etcd35=$($shared --bin 3.5)
etcd34=$($shared --bin 3.4)
[ -x target/release/oxcd ] || cargo build --release -p oxcd >/dev/null
work=$(mktemp -d /tmp/oxcd-check-perf.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

start() { # name bin client peer
  local name=$1 bin=$2 c=$3 p=$4
  "$bin" --name "$name" --data-dir "$work/$name" \
    --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "$name=http://127.0.0.1:$p" >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do
    ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$c" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "$name did not start" >&2; cat "$work/$name.log" >&2; exit 1
}

run() { # label bin port
  local label=$1 bin=$2 c=$3
  start "$label" "$bin" "$c" $((c + 1))
  echo "== $label"
  ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$c" check perf --load="$load" 2>&1 | tr '\r' '\n' | grep -oE '(PASS|FAIL)(: .*)?$' || true
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
}

run oxcd target/release/oxcd 32379
run etcd-3.5.1 "$etcd35" 32479
run etcd-3.4.23 "$etcd34" 32579
