#!/bin/bash
# Train with olmo_train on Slurm: one task per GPU, preemption-safe, requeued until the run is finished.
#
#   mkdir -p logs && sbatch --nodes=4 scripts/slurm_train.sh configs/olmo2-1b.yaml --data.paths=[/data/tokens/dolma2]
#
# Slurm sends SIGUSR1 two minutes before the time limit (--signal); every rank receives it, the trainer saves a
# checkpoint at the end of the current step and exits 0, and this script requeues the job. The requeued job runs
# the same command, which resumes from the newest complete checkpoint in save_folder (also on a different number
# of nodes: sharded checkpoints reshard). Nothing else to pass: no --load_path, no step numbers.
#SBATCH --job-name=olmo-train
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%j.out

set -euo pipefail
CONFIG=${1:?usage: sbatch scripts/slurm_train.sh CONFIG [--key=value ...]}
shift

export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

# one process per GPU; torch.distributed reads RANK / WORLD_SIZE / LOCAL_RANK from the environment
srun --kill-on-bad-exit=1 bash -c '
  export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID
  exec python -m olmo_train "$@"
' olmo_train "$CONFIG" "$@" || status=$?

# --signal=USR1@120 (without B:) reaches every task; after saving, the trainer's last word is "preempted at step N"
# (a requeued job appends to the same log, so only the latest outcome counts)
last=$(grep -E "(preempted|finished|stopped \(stop_at\)) at step" "logs/${SLURM_JOB_NAME}-${SLURM_JOB_ID}.out" \
  2>/dev/null | tail -n 1 || true)
if [[ $last == *"preempted at step"* ]]; then
  echo "preempted: requeueing $SLURM_JOB_ID; the requeued job resumes from the checkpoint just written"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit ${status:-0}
