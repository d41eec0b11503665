#!/bin/bash
# Train with olmo_train on Slurm: one task per GPU, preemption-safe, requeued until the run is finished.
#
#   mkdir -p logs && sbatch --nodes=4 scripts/slurm_train.sh configs/olmo2-1b.yaml --data.paths=[/data/tokens/dolma2]
#
# Slurm sends SIGUSR1 two minutes before the time limit (--signal); every rank receives it, the trainer saves a
# checkpoint at the end of the current step and exits 0, and this script requeues the job. The requeued job runs
# the same command, which resumes from the newest complete checkpoint in save_folder (also on a different number
# of nodes: sharded checkpoints reshard). Nothing else to pass: no --load_path, no step numbers.
# The same holds for `scancel --signal=USR1 JOB` (stop now, come back later), for the signal sent to this script
# too (`scancel --signal=USR1 --full`), and for preemption (PreemptMode=REQUEUE sends SIGTERM to everything, kills
# after KillWait seconds and requeues the job itself). Not `--signal=B:USR1`: that reaches this script only.
# One torchrun per node instead of one task per GPU: scripts/slurm_torchrun.sh.
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

# A signal sent to the batch script too must not end it: by default SIGUSR1 kills bash, the job ends FAILED and
# nobody requeues it. Trapped, bash runs the trap once srun has returned, i.e. after the trainer saved.
trap 'echo "slurm_train.sh: SIGUSR1 received; the trainer saves and stops"' USR1
trap 'echo "slurm_train.sh: SIGTERM received; the trainer saves and stops"' TERM

# the first node's address as Slurm reaches it (its NodeAddr; by default the host name)
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
export MASTER_ADDR
export MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

# what the trainer says in this run only: a requeued job appends to the same log
log=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *StdOut=//p')
before=$(stat -c %s "$log" 2>/dev/null || echo 0)

# one process per GPU; torch.distributed reads RANK / WORLD_SIZE / LOCAL_RANK from the environment
# shellcheck disable=SC2016  # expanded by each task's own shell
srun --kill-on-bad-exit=1 bash -c '
  export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID
  exec python -m olmo_train "$@"
' olmo_train "$CONFIG" "$@" || status=$?

# after saving, the trainer's last word is "preempted at step N"; a run that crashed says nothing, and is not
# requeued (it would crash again). srun's status does not matter then: the checkpoint is complete.
last=$(tail -c +$((before + 1)) "$log" 2>/dev/null | grep -E "(preempted|finished|stopped \(stop_at\)) at step" |
  tail -n 1 || true)
if [[ $last == *"preempted at step"* ]]; then
  echo "preempted: requeueing $SLURM_JOB_ID; the requeued job resumes from the checkpoint just written"
  # under PreemptMode=REQUEUE Slurm requeues the job itself and refuses a second requeue
  scontrol requeue "$SLURM_JOB_ID" || echo "not requeued here: Slurm is requeueing $SLURM_JOB_ID already"
  exit 0
fi
exit "${status:-0}"
