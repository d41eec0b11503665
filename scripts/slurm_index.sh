#!/bin/bash
# Build the suffix index of a run on many machines as one Slurm array job: array task I of N sorts shards I, I+N,
# I+2N, ... of the run's token files into the shared index folders (`olmo-data index` reads SLURM_ARRAY_TASK_ID and
# SLURM_ARRAY_TASK_COUNT as --shard I/N); the task that finds every shard of a token file done writes its manifest.
# The index ends byte-identical to a one-machine build.
#
#   mkdir -p logs && sbatch --array=0-15 scripts/slurm_index.sh configs/olmo2-1b.yaml --index-dir /scratch/index
#
# A task that failed: `scontrol requeue JOBID_I` runs it again; it sorts only its own unfinished shards.
#SBATCH --job-name=olmo-index
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

set -euo pipefail
[[ $# -gt 0 ]] || {
  echo "usage: sbatch --array=0-N scripts/slurm_index.sh CONFIG [--index-dir DIR ...]" >&2
  exit 2
}
# one shard sorted per CPU of the task (a later --processes/-p among the arguments wins)
exec olmo-data index --processes "${SLURM_CPUS_PER_TASK:-1}" --no-progress "$@"
