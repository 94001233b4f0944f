# shellcheck shell=bash source-path=SCRIPTDIR
# slurm/lib.sh -- sourced by Cascade's sbatch scripts (not run on its own).
#
# Finds the Cascade checkout, enters it, loads a site profile (slurm/profiles/*.sh) and
# provides `cascade_srun NODES RANKS_PER_NODE CMD...`.
#
# Knobs (environment; JOB_*, not CASCADE_*, which Cascade reads as config keys):
#   JOB_ROOT     the Cascade checkout  (default $SLURM_SUBMIT_DIR: sbatch runs a copy of
#                the script from its spool directory, so the script cannot find itself)
#   JOB_PROFILE  generic | perlmutter  (default perlmutter when NERSC_HOST=perlmutter)
#   JOB_MPI      srun --mpi plugin  (default pmi2: the PyPI mpich wheel and Cray MPICH)
#   JOB_KEEP_FILES=1  keep the per-job file-tier directory made when CASCADE_FILE_DIR
#                is unset ($FILE_BASE/cascade-files-$SLURM_JOB_ID; removed by default)
# A profile may also read its own knobs; see its header.

ROOT=${JOB_ROOT:-${SLURM_SUBMIT_DIR:?run this script with sbatch, or set JOB_ROOT}}
if [[ ! -f $ROOT/cascade/launch.py ]]; then
  echo "error: $ROOT is not a Cascade checkout: submit from its top directory or set JOB_ROOT" >&2
  exit 2
fi
cd "$ROOT" || exit 2

PROFILE=${JOB_PROFILE:-$([[ ${NERSC_HOST:-} == perlmutter ]] && echo perlmutter || echo generic)}
if [[ ! -f slurm/profiles/$PROFILE.sh ]]; then
  echo "error: no profile slurm/profiles/$PROFILE.sh" >&2
  exit 2
fi
# a profile loads the software, sets FILE_BASE, Lustre stripes and other CASCADE_* keys,
# and defines profile_srun_opts
SRUN_OPTS=(--mpi="${JOB_MPI:-pmi2}")
# shellcheck source=profiles/generic.sh
source "slurm/profiles/$PROFILE.sh"

# A fresh file-tier directory per job unless the user names one (e.g. for a warm
# restart); only a directory made here is removed at the end.
MADE_FILE_DIR=
if [[ -z ${CASCADE_FILE_DIR:-} ]]; then
  export CASCADE_FILE_DIR=$FILE_BASE/cascade-files-$SLURM_JOB_ID
  MADE_FILE_DIR=$CASCADE_FILE_DIR
fi

# cascade_srun NODES RANKS_PER_NODE CMD...: one job step of NODES x RANKS_PER_NODE ranks.
# `python -m mpi4py` in CMD makes a rank's uncaught exception abort the whole step;
# --kill-on-bad-exit also ends it when a rank dies without a word (signal, os._exit).
cascade_srun() {
  local nodes=$1 per_node=$2 extra=()
  shift 2
  mapfile -t extra < <(profile_srun_opts "$per_node")
  srun "${SRUN_OPTS[@]}" "${extra[@]}" --kill-on-bad-exit=1 --nodes="$nodes" \
    --ntasks=$((nodes * per_node)) --ntasks-per-node="$per_node" "$@"
}

# remove_files DIR: DIR removed on every node of the job (unless JOB_KEEP_FILES=1).
remove_files() {
  if [[ ${JOB_KEEP_FILES:-0} != 1 ]]; then
    srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --mpi=none \
      rm -rf -- "$1" 2>/dev/null || true
  fi
}

# The job's file tier is garbage afterwards, on every node when FILE_BASE is node-local.
cleanup_files() {
  if [[ -n $MADE_FILE_DIR ]]; then remove_files "$MADE_FILE_DIR"; fi
}
trap cleanup_files EXIT

echo "cascade: job $SLURM_JOB_ID, profile $PROFILE, root $ROOT, python $(command -v python)," \
  "file dir $CASCADE_FILE_DIR, $SLURM_NNODES node(s)"
