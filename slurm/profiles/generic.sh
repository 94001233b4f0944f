# shellcheck shell=bash
# slurm/profiles/generic.sh -- any SLURM cluster (and slurm/local/): Python from a venv
# with the PyPI mpi4py + mpich wheels, file tier on local disk. Sourced by slurm/lib.sh.
#
# Submit from the checkout:  sbatch [-p PART] [-A ACCOUNT] slurm/single_node.sbatch
#
# Knobs (environment):
#   JOB_VENV                     venv to activate  (default $ROOT/.venv when present,
#                                else whatever python the submitting shell had on PATH)
#   JOB_FILE_BASE                where the per-job file-tier directory goes
#                                (default ${TMPDIR:-/tmp}: node-local)
#   CASCADE_LUSTRE_STRIPE_COUNT  stripes of the aggregated files, if FILE_BASE is Lustre (4)
#   CASCADE_LUSTRE_STRIPE_SIZE   stripe size (4M)
# Any other CASCADE_* config key set when submitting reaches the ranks unchanged.

VENV=${JOB_VENV:-$ROOT/.venv}
if [[ -f $VENV/bin/activate ]]; then
  # activate scripts reference unset variables (PS1 in a batch shell)
  set +u
  # shellcheck source=/dev/null
  source "$VENV/bin/activate"
  set -u
fi

# shellcheck disable=SC2034  # read by slurm/lib.sh
FILE_BASE=${JOB_FILE_BASE:-${TMPDIR:-/tmp}}
export CASCADE_LUSTRE_STRIPE_COUNT=${CASCADE_LUSTRE_STRIPE_COUNT:-4}
export CASCADE_LUSTRE_STRIPE_SIZE=${CASCADE_LUSTRE_STRIPE_SIZE:-4M}

# profile_srun_opts RANKS_PER_NODE: extra srun options, one per line (none here; the
# PyPI mpich wheel needs no LD_LIBRARY_PATH: mpi4py loads libmpi from the venv's lib/)
profile_srun_opts() { :; }
