#!/usr/bin/env bash
# The whole pipeline on built-in data (Python's standard library as the corpus), on CPU, in a few minutes:
# make data -> sample -> tokenize -> stats -> train 2 processes, stop at step 30 -> resume to the end
# -> rebuild the batch of a step with inspect-batch and check it against what the trainer logged.
# Run it through `make demo` (which installs first), or directly once olmo-data is installed.
set -euo pipefail
OUT=${OUT:-demo_output}
NPROC=${NPROC:-2}
STEP=${STEP:-40}
rm -rf "$OUT"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. demo corpus (standard-library sources, dolma format) and a BPE tokenizer trained on it"
olmo-data demo-data --destination "$OUT/data"

step "2. deterministic sample: 30% of documents by hash of (seed, id)"
olmo-data sample --documents "$OUT"/data/documents/*.jsonl.gz --destination "$OUT/sample" --fraction 0.3 --seed 1

step "3. tokenize the full corpus with $NPROC processes"
olmo-data tokenize --documents "$OUT"/data/documents/*.jsonl.gz --tokenizer "$OUT/data/tokenizer.json" \
  --destination "$OUT/tokens" --processes "$NPROC"

step "4. what the data holds"
olmo-data stats "$OUT/tokens" --sequence-length 128 --global-batch-size 16

TRAIN=(configs/tiny.yaml "--save_folder=$OUT/run" "--data.paths=[$OUT/tokens]")
step "5. train the tiny model on $NPROC processes (FSDP, gloo), stopping at step 30"
torchrun --standalone --nproc-per-node "$NPROC" -m olmo_train "${TRAIN[@]}" --stop_at=30

step "6. run again: it resumes from the step-30 checkpoint, same data order and token count"
torchrun --standalone --nproc-per-node "$NPROC" -m olmo_train "${TRAIN[@]}"

step "7. rebuild the batch of step $STEP and compare with the fingerprint the trainer logged"
olmo-data inspect-batch "$OUT/run/config.yaml" --step "$STEP" --decode --tokenizer "$OUT/data/tokenizer.json" \
  | head -n 40
python - "$OUT" "$STEP" <<'PY'
import json, sys
from olmo_data.inspect import inspect_batch
out, step = sys.argv[1], int(sys.argv[2])
logged = {r["step"]: r for r in map(json.loads, open(f"{out}/run/metrics.jsonl"))}
report = inspect_batch(f"{out}/run/config.yaml", step=step)
trained = logged[step]["train/batch_fingerprint"]
print(f"step {step}: trained fingerprint {trained}, rebuilt {report.batch_fingerprint}")
assert trained == report.batch_fingerprint, "the rebuilt batch differs from the trained one"
last = max(logged)
print(f"steps logged: {len(logged)} (1..{last}), tokens seen: {logged[last]['train/tokens_seen']:,}")
PY
step "done: outputs in $OUT/"
