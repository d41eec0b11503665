#!/bin/bash
# Tokenize on many machines as one Slurm array job: array task I of N tokenizes input files I, I+N, I+2N, ... into
# one shared destination (`olmo-data tokenize` reads SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT as --shard I/N),
# and the last task to finish writes manifest.json. The directory ends byte-identical to a one-machine run.
#
#   mkdir -p logs && sbatch --array=0-15 scripts/slurm_tokenize.sh -d '/data/dolma/*.json.gz' \
#       -t allenai/dolma2-tokenizer --destination /data/tokens/dolma2
#
# Quote the globs: olmo-data expands them itself, the same on every task. A task that failed (a bad input, fixed
# since): `scontrol requeue JOBID_I` runs it again (held about two minutes, or `scontrol update JobId=JOBID_I
# StartTime=now`); it redoes only its own inputs and, being the last, writes the manifest. A final check once every task has ended, which writes the manifest too, or fails naming the
# inputs a failed task left undone:
#
#   sbatch --dependency=afterany:JOBID --output=logs/%x-merge-%j.out scripts/slurm_tokenize.sh \
#       -d '/data/dolma/*.json.gz' -t allenai/dolma2-tokenizer --destination /data/tokens/dolma2 --merge
#SBATCH --job-name=olmo-tokenize
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

set -euo pipefail
[[ $# -gt 0 ]] || {
  echo "usage: sbatch --array=0-N scripts/slurm_tokenize.sh -d PATTERN -t TOKENIZER --destination DIR [...]" >&2
  exit 2
}
# one worker process per CPU of the task (a later --processes/-p among the arguments wins)
exec olmo-data tokenize --processes "${SLURM_CPUS_PER_TASK:-1}" --no-progress "$@"
