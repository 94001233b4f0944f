#!/usr/bin/env bash
# slurm/local/start.sh -- bring up a real one-node SLURM cluster on this machine
# (munged + slurmctld + slurmd) for Cascade's tests and for users without a cluster.
#
# Idempotent: installs the Debian packages when missing (needs root), writes the
# config, starts only the daemons that are not already running, and returns once the
# node accepts jobs. Stop it with slurm/local/stop.sh (same environment).
#
# Clients find the cluster through SLURM_CONF; the last line printed on stdout is
#   export SLURM_CONF=...        (also written to $LOCAL_SLURM_DIR/env.sh)
# so `eval "$(slurm/local/start.sh)"` or `. "$LOCAL_SLURM_DIR/env.sh"` both work.
#
# Exit status: 0 ready, 1 the cluster did not come up, 2 not root (the daemons run as
# root and packages are installed with apt-get), 3 package install failed.
#
# Knobs (environment; not CASCADE_*: Cascade reads those as config keys and rejects
# unknown ones, and every job inherits the submitting shell's environment):
#   LOCAL_SLURM_DIR      state, config, logs, pid files  (default ${TMPDIR:-/tmp}/cascade-slurm)
#   LOCAL_SLURM_CPUS     CPUs the node advertises; may exceed the real cores so that
#                        multi-rank jobs fit on small machines  (default 8)
#   LOCAL_SLURM_PORT     slurmctld port; slurmd uses PORT+1  (default 6817)
#   LOCAL_SLURM_MPI      MpiDefault  (default pmi2: what the PyPI mpich wheel speaks)
#   LOCAL_SLURM_TIMEOUT  seconds to wait for the node to become idle  (default 60)
#
# MPI: run ranks as `srun --mpi=pmi2 python -m mpi4py ...`. No LD_LIBRARY_PATH is
# needed: mpi4py dlopens libmpi from the venv's lib/ where the mpich wheel puts it,
# and srun exports the caller's environment (PATH, VIRTUAL_ENV) to every task.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CPUS=${LOCAL_SLURM_CPUS:-8}
PORT=${LOCAL_SLURM_PORT:-6817}
MPI=${LOCAL_SLURM_MPI:-pmi2}
TIMEOUT=${LOCAL_SLURM_TIMEOUT:-60}
NODE=$(hostname -s)
CONF=$DIR/slurm.conf
KEY=$DIR/munge/key
# munged refuses a socket below a directory that others cannot traverse (pytest's and
# many TMPDIRs are 0700), and socket paths are short: keep it in /run, one per DIR
SOCK=/run/cascade-munge-$(printf %s "$DIR" | cksum | cut -d' ' -f1)/socket

stop_all() { local d; for d in slurmd slurmctld munged; do running "$d" && kill -TERM "$(cat "$DIR/run/$d.pid")"; done; return 0; }

# exit 2 and 3 let callers (tests) tell "no SLURM possible here" from "SLURM broke"
if ((EUID != 0)); then say "must run as root"; exit 2; fi
mkdir -p "$DIR"/{munge,state,spool,log,run}
mkdir -p "$(dirname "$SOCK")"
chmod 755 "$(dirname "$SOCK")"

# --- packages: only when a binary is missing, so repeated runs stay fast and offline
missing=()
for b in munged slurmctld slurmd sbatch; do command -v "$b" >/dev/null || missing+=("$b"); done
if ((${#missing[@]})); then
  say "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
  # apt-get update only when the first attempt fails: the lists may already be fresh
  if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
           slurmctld slurmd slurm-client munge ||
         { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
             --no-install-recommends slurmctld slurmd slurm-client munge; }; } >"$DIR/log/apt.log" 2>&1; then
    tail -n 20 "$DIR/log/apt.log" >&2; say "package install failed; see $DIR/log/apt.log"; exit 3
  fi
fi

# --- munge key and slurm.conf (rewritten only when the content changes)
[[ -s $KEY ]] || (umask 077; head -c 1024 /dev/urandom >"$KEY")
chmod 600 "$KEY"

# MPICH names its shared-memory slab after the PMI job id ("JOB.STEP") and leaves it in
# /dev/shm when a step is killed; a later step with the same id attaches to the stale
# slab and hangs in MPI_Init. Job ids therefore start at a random number each time
# slurmctld starts with fresh state, so neither a restarted nor a concurrent local
# cluster reuses one; a running slurmctld keeps its number.
first_id=
if running slurmctld && [[ -f $CONF ]]; then first_id=$(sed -n 's/^FirstJobId=//p' "$CONF"); fi
first_id=${first_id:-$(( ((RANDOM << 15) | RANDOM) % 60000000 + 1000 ))}

cat >"$CONF.tmp" <<EOF
# Written by Cascade's slurm/local/start.sh; edits are overwritten.
ClusterName=cascade
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
# root everywhere: this cluster lives and dies with one test session or one user
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$DIR/state
FirstJobId=$first_id
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
MailProg=/bin/true
# no cgroups: containers and CI machines rarely delegate them
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# finished jobs stay visible to 'scontrol show job' for 5 minutes (no slurmdbd here)
MinJobAge=300
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=$MPI
# a node that went down (e.g. slurmd restarted) comes back by itself
ReturnToService=2
# the advertised CPU count may exceed the real cores; do not drain the node for it
SlurmdParameters=config_overrides
# a task that exits non-zero ends its whole step (MPI ranks would wait for it forever),
# and the rest are killed within seconds, not the default 30
KillOnBadExit=1
KillWait=5
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
changed=0
if cmp -s "$CONF.tmp" "$CONF"; then rm "$CONF.tmp"; else mv "$CONF.tmp" "$CONF"; changed=1; fi
printf 'export SLURM_CONF=%q\n' "$CONF" >"$DIR/env.sh"
export SLURM_CONF=$CONF

# --- daemons
if ! running munged; then
  say "starting munged"
  rm -f "$SOCK" "$SOCK.lock"
  munged --socket="$SOCK" --key-file="$KEY" --pid-file="$DIR/run/munged.pid" \
         --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed"
fi
# slurmctld aborts if munged does not answer yet: wait for a credential round trip
for _ in $(seq 50); do munge -n -S "$SOCK" 2>/dev/null | unmunge -S "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done
if ! munge -n -S "$SOCK" | unmunge -S "$SOCK" >/dev/null; then
  say "munged does not answer"; tail -n 5 "$DIR/log/munged.log" >&2 || true; stop_all; exit 1
fi

started=0
if ! running slurmctld; then
  say "starting slurmctld"
  # -c: fresh state, so jobs of an earlier run never come back
  rm -rf "${DIR:?}/state/"*
  slurmctld -c -f "$CONF"
  started=1
fi
if ! running slurmd; then
  say "starting slurmd"
  slurmd -N "$NODE" -f "$CONF"
  started=1
fi
if ((changed && !started)); then say "config changed: reconfiguring"; scontrol reconfigure; fi

# --- wait until the node takes jobs
state=
t0=$SECONDS
deadline=$((t0 + TIMEOUT))
while ((SECONDS < deadline)); do
  # the daemons fork before writing their pid files: give them a moment before judging
  if ((SECONDS - t0 >= 2)) && ! { running slurmctld && running slurmd; }; then state="daemon exited"; break; fi
  state=$(timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case $state in
    idle|mixed|allocated) break ;;
    down*|drain*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.3
done
case $state in
  idle|mixed|allocated) ;;
  *) say "node not ready (state '${state:-none}'); log tails follow and the daemons are stopped"
     tail -n 15 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
     stop_all; exit 1 ;;
esac
say "ready in ${SECONDS}s: node $NODE $state, munged $(cat "$DIR/run/munged.pid")," \
    "slurmctld $(cat "$DIR/run/slurmctld.pid"), slurmd $(cat "$DIR/run/slurmd.pid")"
echo "export SLURM_CONF=$CONF"
