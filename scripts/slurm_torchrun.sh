#!/bin/bash
# Train with olmo_train on Slurm, one torchrun per node: torchrun starts the node's processes (one per GPU) and the
# torchruns of all nodes meet at the first node (c10d rendezvous). Preemption-safe and requeued until the run is
# finished, as scripts/slurm_train.sh (one Slurm task per GPU); use whichever your cluster prefers.
#
#   mkdir -p logs && sbatch --nodes=4 scripts/slurm_torchrun.sh configs/olmo2-1b.yaml --data.paths=[/data/tokens/dolma2]
#
# Slurm's SIGUSR1 (two minutes before the time limit, or `scancel --signal=USR1 JOB`) reaches each torchrun, which
# passes it on to its processes (--signals-to-handle, in recent PyTorch, 2.13 here; without it torchrun dies of
# the signal at once), and so does SIGTERM (preemption). The trainer saves at the end of the current step and
# exits; torchrun waits up to SAVE_TIMEOUT seconds for that, and this script requeues the job, which resumes from
# the checkpoint. From the environment: NPROC_PER_NODE (default: the node's GPUs, else 1), MASTER_PORT (default
# 29500), SAVE_TIMEOUT (default 110, below the 120 s of --signal).
#SBATCH --job-name=olmo-torchrun
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=128
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%j.out

set -euo pipefail
CONFIG=${1:?usage: sbatch scripts/slurm_torchrun.sh CONFIG [--key=value ...]}
shift

# the batch script survives a signal sent to it too (`scancel --full`), as in slurm_train.sh
trap 'echo "slurm_torchrun.sh: SIGUSR1 received; the trainer saves and stops"' USR1
trap 'echo "slurm_torchrun.sh: SIGTERM received; the trainer saves and stops"' TERM

# the first node's address as Slurm reaches it (its NodeAddr; by default the host name)
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
MASTER_PORT=${MASTER_PORT:-29500}
gpus=${SLURM_GPUS_ON_NODE:-0}
NPROC_PER_NODE=${NPROC_PER_NODE:-$((gpus > 0 ? gpus : 1))}
SAVE_TIMEOUT=${SAVE_TIMEOUT:-110}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

# what the trainer says in this run only: a requeued job appends to the same log
log=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *StdOut=//p')
before=$(stat -c %s "$log" 2>/dev/null || echo 0)

srun --kill-on-bad-exit=1 torchrun \
  --nnodes="$SLURM_NNODES" --nproc-per-node="$NPROC_PER_NODE" \
  --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
  --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown-timeout="$SAVE_TIMEOUT" \
  -m olmo_train "$CONFIG" "$@" || status=$?

# after saving, the trainer's last word is "preempted at step N" (torchrun then exits non-zero: it was signalled);
# a run that crashed says nothing, and is not requeued (it would crash again)
last=$(tail -c +$((before + 1)) "$log" 2>/dev/null | grep -E "(preempted|finished|stopped \(stop_at\)) at step" |
  tail -n 1 || true)
if [[ $last == *"preempted at step"* ]]; then
  echo "preempted: requeueing $SLURM_JOB_ID; the requeued job resumes from the checkpoint just written"
  scontrol requeue "$SLURM_JOB_ID" || echo "not requeued here: Slurm is requeueing $SLURM_JOB_ID already"
  exit 0
fi
exit "${status:-0}"
