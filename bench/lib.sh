# Shared by the bench scripts: sourced (`. "$root/bench/lib.sh"`, root being
# the workspace), not run; it defines functions only. They use the calling
# script's globals: root, only, servers, port, results.

# bench_select_servers SCRIPT ALLOWED: servers=() from --only's comma-separated
# $only, each one of ALLOWED (comma-separated, e.g. oxcd,etcd3516,etcd35);
# anything else, or nothing, exits 2.
bench_select_servers() {
  local script=$1 allowed=",$2," s
  servers=()
  for s in ${only//,/ }; do
    case "$allowed" in
      *",$s,"*) servers+=("$s") ;;
      *) echo "$script: --only takes ${2//,/, }; got $s" >&2; exit 2 ;;
    esac
  done
  [ ${#servers[@]} -gt 0 ] || { echo "$script: no server selected" >&2; exit 2; }
}

# bench_server_binaries SCRIPT: OXCD, ETCD3516, ETCD35, ETCD34 for the
# servers selected (the environment's first): oxcd's release build (built
# when missing), etcd 3.5.16 and 3.5.1 from ../shared/tools/ref-etcd, etcd
# 3.4.23 at /usr/bin/etcd (exits 1 when it is not there).
bench_server_binaries() {
  local script=$1 s
  for s in "${servers[@]}"; do
    case "$s" in
      oxcd)
        OXCD=${OXCD:-$root/target/release/oxcd}
        if [ ! -x "$OXCD" ]; then
          echo "building oxcd..." >&2
          (cd "$root" && cargo build --release -p oxcd >&2)
        fi ;;
      etcd3516) ETCD3516=${ETCD3516:-$("$root/../shared/tools/ref-etcd" --bin 3.5.16)} ;;
      etcd35) ETCD35=${ETCD35:-$("$root/../shared/tools/ref-etcd" --bin 3.5)} ;;
      etcd34) ETCD34=${ETCD34:-/usr/bin/etcd}
              [ -x "$ETCD34" ] || { echo "$script: no etcd 3.4.23 at $ETCD34 (apt-get install etcd-server)" >&2; exit 1; } ;;
    esac
  done
}

# bench_build_oxbench PATH: builds oxbench's release build when PATH is not there.
bench_build_oxbench() {
  if [ ! -x "$1" ]; then
    echo "building oxbench..." >&2
    (cd "$root" && cargo build --release -p bench >&2)
  fi
}

server_bin() {  # KIND: the binary of that server
  case "$1" in oxcd) echo "$OXCD" ;; etcd3516) echo "$ETCD3516" ;; etcd35) echo "$ETCD35" ;; etcd34) echo "$ETCD34" ;; esac
}

record() { echo "$1 $2 $3" >>"$results"; }  # SERVER METRIC VALUE

# Members of a cluster on loopback: member I (0-based) at PORT+2I (client)
# and PORT+2I+1 (peer); pids[I] its process, empty once stopped.
client_ep() { echo "127.0.0.1:$((port + 2 * $1))"; }
peer_url() { echo "http://127.0.0.1:$((port + 2 * $1 + 1))"; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
alive_pids() {
  local p
  for p in "${pids[@]}"; do
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"
  done
  return 0
}
# kill_members: kill -9 every member still alive, reap them all, forget them.
kill_members() {
  local live p
  live=$(alive_pids)
  # shellcheck disable=SC2086 # one pid a word
  [ -z "$live" ] || kill -KILL $live 2>/dev/null || true
  for p in "${pids[@]}"; do [ -z "$p" ] || wait "$p" 2>/dev/null || true; done
  pids=()
}

# bench_positive SCRIPT VAR...: exits 2 unless each named variable holds a
# positive number (its option is --VAR with _ as -).
bench_positive() {
  local script=$1 v; shift
  for v in "$@"; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "$script: --${v//_/-} takes a positive number; got ${!v}" >&2; exit 2; }
  done
}

# status_fields JSON EP...: "revision applied_index" for each endpoint from
# one `etcdctl endpoint status -w json` output, "- -" for one that did not
# answer.
status_fields() {
  python3 -c '
import json, sys
try:
    st = {s["Endpoint"]: s["Status"] for s in json.loads(sys.argv[1] or "[]")}
except ValueError:
    st = {}
f = []
for ep in sys.argv[2:]:
    s = st.get(ep)
    f += [str(s["header"].get("revision", 0)), str(s.get("raftAppliedIndex", 0))] if s else ["-", "-"]
print(" ".join(f))' "$@"
}
