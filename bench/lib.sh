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

# pid_running PID: the process is there and has not exited (a zombie, exited
# but not reaped yet, has: kill -0 still reaches it).
pid_running() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# wait_healthy PID LOG SECS PROBE...: runs PROBE (one health check that gives
# up within a second or two: `"$OXBENCH" --endpoints EP health --timeout 1s`,
# or etcdctl endpoint health with short timeouts) until it succeeds, and
# returns 0 then. It stops at once when the server PID has exited, or after
# SECS seconds, and returns 1 with the last probe's error and the last 40
# lines of the server's LOG on stderr: the work dir holding the log goes
# when the script exits, and a CI run shows only what reached stderr.
wait_healthy() {
  local pid=$1 log=$2 secs=$3 deadline error="" status why start
  shift 3
  deadline=$((SECONDS + secs))
  while pid_running "$pid"; do
    start=${EPOCHREALTIME//[.,]/}
    if error=$("$@" 2>&1 >/dev/null); then return 0; fi
    [ "$SECONDS" -lt "$deadline" ] || break
    # a probe refused at once (nothing listens yet) is not repeated in a spin
    [ $((${EPOCHREALTIME//[.,]/} - start)) -ge 100000 ] || sleep 0.1
  done
  if pid_running "$pid"; then
    why="not healthy within ${secs} s"
  else
    why="exited"
    # its exit status, known to the shell that started it only (a $(...)
    # subshell's wait gets it wrong)
    if [ "$BASHPID" = "$$" ]; then
      status=0
      wait "$pid" 2>/dev/null || status=$?
      [ "$status" = 127 ] || why+=" with status $status"
    fi
  fi
  echo "wait_healthy: the server (pid $pid, log $log) $why; the last probe: $(tail -n 1 <<<"${error:-none}")" >&2
  echo "---- the last 40 lines of $log:" >&2
  tail -n 40 "$log" >&2 2>/dev/null || true
  echo "----" >&2
  return 1
}

# bench_size SCRIPT ARG: size= the bytes ARG names (N, or N with K, M or G for
# KiB, MiB, GiB); anything else exits 2.
bench_size() {
  [[ "$2" =~ ^([1-9][0-9]*)([kKmMgG]?)$ ]] ||
    { echo "$1: --size takes bytes, or N with K, M or G; got $2" >&2; exit 2; }
  case "${BASH_REMATCH[2]}" in
    k|K) size=$((BASH_REMATCH[1] * 1024)) ;;
    m|M) size=$((BASH_REMATCH[1] * 1024 * 1024)) ;;
    g|G) size=$((BASH_REMATCH[1] * 1024 * 1024 * 1024)) ;;
    *) size=${BASH_REMATCH[1]} ;;
  esac
}

free_kb() { df -Pk "$1" | awk 'NR == 2 {print $4}'; }  # DIR: its file system's free KiB
now() { echo "$EPOCHREALTIME"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; }  # T0 T1: seconds between
cpu_s() {  # cpu_s PID: the process's user + system CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); printf "%.2f", ($12 + $13) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0
}
rss_mb() { awk '/^VmRSS:/ {printf "%.1f", $2 / 1024}' "/proc/$1/status" 2>/dev/null || echo n/a; }
