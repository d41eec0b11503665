#!/usr/bin/env bash
# The three regimes of ReLoRA's own check script, in this project's words, on the demo data: 20 steps of DDP, 20 of
# FSDP (both full rank), then ReLoRA on FSDP starting from the FSDP run's step-20 weights; each evaluates and saves
# at steps 10 and 20. Then it checks what each run wrote and prints one line per run.
#
#   scripts/regimes.sh                                   # demo data made in $OUT/demo, configs/tiny.yaml
#   DATA=runs/demo/tokens scripts/regimes.sh             # tokens made already
#   DATA=runs/demo/tokens scripts/regimes.sh --global_train_batch_size=8   # extra overrides go to every run
#
# Environment: CONFIG (configs/tiny.yaml), OUT (runs/regimes), NPROC (2), DATA (token files or directory; default:
# made from the demo corpus), LORA_RANK (32: the issue's 128 is the tiny model's whole width).
set -euo pipefail
CONFIG=${CONFIG:-configs/tiny.yaml}
OUT=${OUT:-runs/regimes}
NPROC=${NPROC:-2}
LORA_RANK=${LORA_RANK:-32}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [[ -z "${DATA:-}" ]]; then
  step "demo corpus and tokens in $OUT/demo"
  olmo-data demo-data --destination "$OUT/demo"
  olmo-data tokenize --documents "$OUT"/demo/documents/*.jsonl.gz --tokenizer "$OUT/demo/tokenizer.json" \
    --destination "$OUT/demo/tokens" --processes "$NPROC"
  DATA="$OUT/demo/tokens"
fi
rm -rf "$OUT/ddp" "$OUT/fsdp" "$OUT/relora"  # each regime starts afresh (a run folder would be resumed)

COMMON=("$CONFIG" "--data.paths=[$DATA]" --max_duration=20 --save_interval=10 --eval_interval=10
  "--evaluators=[{label: demo, paths: [$DATA], max_batches: 4}]" --console_log_interval=5 "$@")
train() { torchrun --standalone --nproc-per-node "$NPROC" -m olmo_train "${COMMON[@]}" "$@"; }

step "1. full rank, DDP"
train --distributed_strategy=ddp "--save_folder=$OUT/ddp"

step "2. full rank, FSDP"
train --distributed_strategy=fsdp "--save_folder=$OUT/fsdp"

step "3. ReLoRA on FSDP, from the FSDP run's weights: merges after steps 10 and 20, jagged cosine, pruned optimizer"
train --distributed_strategy=fsdp "--save_folder=$OUT/relora" \
  "--relora.rank=$LORA_RANK" --relora.merge_every=10 --relora.cycle_length=10 --relora.restart_warmup_steps=5 \
  --scheduler.name=cosine_restarts --scheduler.t_warmup=5 \
  --relora.optimizer_reset=prune --relora.prune_fraction=0.9 "--relora.continue_from=$OUT/fsdp/step20"

step "what the runs wrote"
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"{'regime':8} {'loss@1':>8} {'loss@20':>8} {'eval@10':>8} {'eval@20':>8} {'tok/s':>8}  merges")
for name in ("ddp", "fsdp", "relora"):
    run = out / name
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == list(range(1, 21)), f"{name}: steps {sorted(rows)}"
    for step in (10, 20):
        assert "eval/demo/loss" in rows[step], f"{name}: no evaluation at step {step}"
        assert (run / f"step{step}" / "trainer_state.json").is_file(), f"{name}: no checkpoint at step {step}"
    merges = rows[20].get("relora/merges", "-")
    if name == "relora":
        assert merges == 2, f"relora: {merges} merges"
        assert rows[11]["optim/lr"] < rows[10]["optim/lr"] / 4, "the learning rate restarts after the merge"
        for step in (10, 20):
            assert abs(rows[step]["relora/optimizer_zeroed_fraction"] - 0.9) < 0.01
    speed = sorted(r["throughput/tokens_per_second"] for r in rows.values())[10]
    print(
        f"{name:8} {rows[1]['train/loss']:8.4f} {rows[20]['train/loss']:8.4f} "
        f"{rows[10]['eval/demo/loss']:8.4f} {rows[20]['eval/demo/loss']:8.4f} {speed:8,.0f}  {merges}"
    )
print("regimes: OK")
PY
