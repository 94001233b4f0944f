#!/usr/bin/env bash
# slurm/local/stop.sh -- stop the one-node cluster started by slurm/local/start.sh.
#
# Cancels the cluster's jobs, waits for their steps to end, then stops slurmd,
# slurmctld and munged by the pids in their pid files (never by name: other SLURM or
# munge daemons on the machine are left alone). Idempotent: nothing running, nothing done.
# The state directory is kept for post-mortems; LOCAL_SLURM_PURGE=1 removes it.
#
# Knobs (environment):
#   LOCAL_SLURM_DIR    same directory as given to start.sh  (default ${TMPDIR:-/tmp}/cascade-slurm)
#   LOCAL_SLURM_PURGE  1: delete the state directory after stopping  (default 0)
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export SLURM_CONF=$DIR/slurm.conf

# stop NAME...: SIGTERM each running daemon, wait up to 20 s for all, then SIGKILL
stop() {
  local d p left=() pids=()
  for d in "$@"; do
    if running "$d"; then
      p=$(cat "$DIR/run/$d.pid"); say "stopping $d (pid $p)"; pids+=("$p")
      kill -TERM "$p" 2>/dev/null || true
    fi
    rm -f "$DIR/run/$d.pid"
  done
  ((${#pids[@]})) || return 0
  for _ in $(seq 200); do
    left=()
    for p in "${pids[@]}"; do alive "$p" && left+=("$p"); done
    ((${#left[@]})) || return 0
    sleep 0.1
  done
  for p in "${left[@]}"; do say "pid $p ignored SIGTERM: SIGKILL"; kill -KILL "$p" 2>/dev/null || true; done
}

# 1. jobs first: slurmstepd processes outlive slurmd and would keep ranks running
if running slurmctld; then
  mapfile -t jobs < <(squeue -h -o %i 2>/dev/null || true)
  if ((${#jobs[@]})); then
    say "cancelling jobs ${jobs[*]}"
    scancel "${jobs[@]}" 2>/dev/null || true
    for _ in $(seq 100); do [[ -z $(squeue -h -o %i 2>/dev/null || true) ]] && break; sleep 0.2; done
  fi
fi
# every live slurmstepd owns a unix socket NODE_JOB.STEP in the spool directory
steps() { find "$DIR/spool" -type s 2>/dev/null || true; }
for _ in $(seq 100); do [[ -z $(steps) ]] && break; sleep 0.2; done
[[ -z $(steps) ]] || say "warning: steps still running: $(steps | xargs -r -n1 basename | tr '\n' ' ')"

# 2. daemons: slurm before munged, which they need to shut down cleanly
stop slurmd slurmctld
stop munged
# start.sh put munged's socket where slurm.conf says (a directory of its own in /run)
sock=$(sed -n 's/^AuthInfo=socket=//p' "$SLURM_CONF" 2>/dev/null || true)
if [[ $sock == /run/cascade-munge-*/socket ]]; then rm -rf -- "$(dirname "$sock")"; fi
if [[ ${LOCAL_SLURM_PURGE:-0} == 1 ]]; then rm -rf "${DIR:?}"; fi
say "stopped"
