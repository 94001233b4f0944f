# shellcheck shell=bash
# slurm/local/common.sh -- shared by start.sh and stop.sh (sourced, not run).

DIR=${LOCAL_SLURM_DIR:-${TMPDIR:-/tmp}/cascade-slurm}

say() { echo "[cascade-slurm] $*" >&2; }

# alive PID: the process exists and is not a zombie (a daemon's exit is seen at once even
# where pid 1 is slow to reap, as in some containers and VMs)
alive() { local st; st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) && [[ $st != Z ]]; }

# running NAME: the pid in run/NAME.pid is alive and is NAME (a stale pid file may name a
# recycled pid that now belongs to something else)
running() {
  local f=$DIR/run/$1.pid pid
  [[ -s $f ]] || return 1
  pid=$(cat "$f")
  alive "$pid" && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]]
}
