# Helpers shared by up and down. Sourced, not executed.
. "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
LOG_DIR=${TOOLRUN_CLUSTER_LOGS:-/var/log/toolrun-cluster}
PID_DIR=$RUN_DIR/pids

say() { echo "cluster: $*" >&2; }
die() { echo "cluster: ERROR: $*" >&2; exit 1; }

pid_of() { # prints the pid of a running component, fails if it is not running
  local f=$PID_DIR/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(cat "$f")
  [[ -n $pid ]] && alive "$pid" || return 1
  grep -qa -- "$1" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}
running() { pid_of "$1" >/dev/null 2>&1; }

fail_component() { # NAME MESSAGE: name the component, show its log's tail, stop
  echo "cluster: ERROR: component $1 failed: $2" >&2
  if [[ -f $LOG_DIR/$1.log ]]; then
    echo "----- last 40 lines of $LOG_DIR/$1.log -----" >&2
    tail -n 40 "$LOG_DIR/$1.log" >&2
    echo "----- end of $1 log -----" >&2
  fi
  exit 1
}

start_component() { # NAME CMD...: run in the background, own session, log to LOG_DIR/NAME.log
  local name=$1; shift
  mkdir -p "$PID_DIR" "$LOG_DIR"
  echo "=== $(date -u +%FT%TZ) starting: $*" >> "$LOG_DIR/$name.log"
  setsid "$@" >> "$LOG_DIR/$name.log" 2>&1 < /dev/null &
  local pid=$! i
  echo "$pid" > "$PID_DIR/$name.pid"
  # Until the forked shell has exec'd the command, its cmdline is this script's, and pid_of
  # (which checks the cmdline against pid reuse) would call the component gone: on a loaded
  # machine that window lasts long enough for a check to fall into it. Wait for the exec.
  for i in $(seq 100); do
    grep -qa -- "$name" "/proc/$pid/cmdline" 2>/dev/null && return 0
    alive "$pid" || return 0
    sleep 0.1
  done
}

wait_for() { # NAME SECONDS CHECK...: wait until CHECK succeeds, or fail naming NAME
  local name=$1 secs=$2 deadline; shift 2
  deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    running "$name" || fail_component "$name" "process exited"
    (( $(date +%s) < deadline )) || fail_component "$name" "not healthy after ${secs}s (check: $*)"
    sleep 0.5
  done
}

alive() { # PID: running (a zombie waiting for its reaper counts as gone)
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st:0:1} != Z ]]
}

stop_component() { # NAME [SECONDS]: SIGTERM, then SIGKILL after SECONDS (default 15)
  local pid i
  pid=$(pid_of "$1") || { rm -f "$PID_DIR/$1.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 $(( ${2:-15} * 10 ))); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; fi
  rm -f "$PID_DIR/$1.pid"
}

kubectl_admin() { "$BIN_CACHE/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_k8s() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
