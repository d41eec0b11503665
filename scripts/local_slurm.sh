#!/usr/bin/env bash
# A throw-away Slurm cluster on this machine, for trying the Slurm scripts (and for the tests, which use this
# script through tests/slurm_cluster.py): one controller and NODES node daemons on loopback, no munge, no systemd.
#
#   sudo apt-get install slurmctld slurmd slurm-client      # Debian/Ubuntu (no root needed after that)
#   scripts/local_slurm.sh start /tmp/slurm                  # prints the line to paste: export SLURM_CONF=...
#   export SLURM_CONF=/tmp/slurm/slurm.conf
#   sinfo; sbatch ...; squeue
#   scripts/local_slurm.sh stop /tmp/slurm
#
# The daemons and the jobs run as the user who starts it. Several node daemons share this host (NodeName n1, n2, ...
# with one port each, all at 127.0.0.1), so multi-node jobs run for real.
# Every node claims CPUS cpus whatever the hardware has (SlurmdParameters=config_overrides): enough to place
# several tasks. Two partitions: `debug` (the default) whose jobs are requeued when a job of `urgent` needs
# their node (PreemptMode=REQUEUE: Slurm sends SIGTERM, waits KillWait seconds, kills, requeues).
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [NODES [CPUS]] | stop DIR" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
action=$1
dir=$(realpath -m "$2")
nodes=${3:-2}
cpus=${4:-4}
[[ $nodes =~ ^[1-9][0-9]*$ && $cpus =~ ^[1-9][0-9]*$ ]] || {
  echo "$0: NODES and CPUS must be positive numbers, got '$nodes' and '$cpus'" >&2
  exit 2
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_conf() {
  local host
  host=$(hostname)
  mkdir -p "$dir/state" "$dir/log"
  {
    cat <<EOF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
AuthType=auth/none
CredType=cred/none
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=30
SchedulerParameters=sched_interval=2
EOF
    for i in $(seq 1 "$nodes"); do
      mkdir -p "$dir/spool/n$i"
      echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$cpus RealMemory=4000"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE"
    echo "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
  } >"$dir/slurm.conf"
}

start() {
  local tool
  for tool in slurmctld slurmd sinfo; do
    if ! command -v "$tool" >/dev/null; then
      echo "$0: $tool not found (Debian/Ubuntu: apt-get install slurmctld slurmd slurm-client)" >&2
      exit 1
    fi
  done
  if [[ -e $dir/slurm.conf ]]; then
    echo "$0: $dir already holds a cluster; '$0 stop $dir' first, or pick another directory" >&2
    exit 1
  fi
  write_conf
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF"
  for i in $(seq 1 "$nodes"); do
    slurmd -f "$SLURM_CONF" -N "n$i"
  done
  # the nodes register within a second or two; a node that does not is down, and its log says why
  for _ in $(seq 1 60); do
    if [[ $(sinfo -h -N -p debug -t idle -o %N 2>/dev/null | wc -l) -eq $nodes ]]; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.5
  done
  echo "$0: the nodes did not become idle in 30 s; see $dir/log/" >&2
  sinfo -N >&2 || true
  stop
  exit 1
}

stop() {
  # jobs first, so that no task outlives its daemons; then the daemons, by the process ids they wrote (never by
  # name: other clusters may run on this machine)
  if [[ -f $dir/slurm.conf ]]; then
    export SLURM_CONF=$dir/slurm.conf
    squeue -h -o %A 2>/dev/null | sort -u | xargs -r scancel 2>/dev/null || true
    for _ in $(seq 1 50); do
      [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  local pids=()
  for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
    [[ -f $f ]] && pids+=("$(cat "$f")")
  done
  if [[ ${#pids[@]} -gt 0 ]]; then kill "${pids[@]}" 2>/dev/null || true; fi
  for _ in $(seq 1 50); do
    local alive=0
    for pid in "${pids[@]}"; do
      if [[ -e /proc/$pid ]] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then alive=1; fi
    done
    [[ $alive -eq 0 ]] && break
    sleep 0.2
  done
  rm -f "$dir/slurm.conf"
}

case $action in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
