# shellcheck shell=bash
# slurm/profiles/perlmutter.sh -- NERSC Perlmutter GPU nodes (4x A100, 64 cores,
# Slingshot, Lustre $SCRATCH) with Cray MPICH. Sourced by slurm/lib.sh; chosen
# automatically when NERSC_HOST=perlmutter.
#
# Submit from the checkout with the site's options, e.g.
#   sbatch -A m0000 -C gpu -q regular --gpus-per-node=4 slurm/single_node.sbatch
#
# One-time setup (mpi4py must use Cray MPICH, so do NOT install the PyPI mpich wheel):
#   module load python cudatoolkit cray-mpich
#   python -m venv $JOB_VENV && . $JOB_VENV/bin/activate
#   MPICC="cc -shared" pip install --force-reinstall --no-binary=mpi4py mpi4py
#   pip install -e '.[gpu,bench]'
#
# Knobs (environment):
#   JOB_VENV                     venv to activate after the modules  (default $ROOT/.venv-pm)
#   JOB_MODULES                  modules to load  (default "python cudatoolkit cray-mpich")
#   JOB_FILE_BASE                where the per-job file-tier directory goes  (default $SCRATCH)
#   CASCADE_LUSTRE_STRIPE_COUNT  OSTs each aggregated file is striped over  (default 8)
#   CASCADE_LUSTRE_STRIPE_SIZE   stripe size; a multiple of the block size  (default 16M)
#   CASCADE_GPU_BYTES            GPU tier per rank, on its own A100 (40 or 80 GB)  (default 16G)

# the module function reads unset variables
set +u
# shellcheck disable=SC2086  # word-splitting the module list is the point
module load ${JOB_MODULES:-python cudatoolkit cray-mpich}
VENV=${JOB_VENV:-$ROOT/.venv-pm}
# shellcheck source=/dev/null
if [[ -f $VENV/bin/activate ]]; then source "$VENV/bin/activate"; fi
set -u

# cudatoolkit turns on GPU-aware Cray MPICH, which aborts unless the binary links the
# GTL library; mpi4py does not, and Cascade never hands device buffers to MPI
export MPICH_GPU_SUPPORT_ENABLED=0

# shellcheck disable=SC2034  # read by slurm/lib.sh
FILE_BASE=${JOB_FILE_BASE:-${SCRATCH:?SCRATCH is not set: not on Perlmutter?}}
export CASCADE_LUSTRE_STRIPE_COUNT=${CASCADE_LUSTRE_STRIPE_COUNT:-8}
export CASCADE_LUSTRE_STRIPE_SIZE=${CASCADE_LUSTRE_STRIPE_SIZE:-16M}
export CASCADE_GPU_BYTES=${CASCADE_GPU_BYTES:-16G}

# profile_srun_opts RANKS_PER_NODE: extra srun options, one per line. The node's 128
# hardware threads are split evenly; with up to 4 ranks per node each rank sees its
# own A100 as device 0, with more they share the 4.
profile_srun_opts() {
  local per_node=$1
  echo "--cpus-per-task=$((128 / per_node))"
  echo "--cpu-bind=cores"
  if ((per_node <= 4)); then echo "--gpus-per-task=1"; else echo "--gpus-per-node=4"; fi
}
