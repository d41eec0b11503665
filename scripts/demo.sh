#!/usr/bin/env bash
# The whole pipeline on built-in data (Python's standard library as the corpus), on CPU, in a few minutes:
# make data -> sample -> tokenize -> stats -> train 2 processes, stop at step 30 -> resume to the end
# -> rebuild the batch of a step with inspect-batch and check it against what the trainer logged
# -> generate text -> unshard a checkpoint -> export to Hugging Face transformers and load it there
# -> import it back and fine-tune it on chat data prepared with prepare-tulu.
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
olmo-train train --nproc "$NPROC" "${TRAIN[@]}" --stop_at=30

step "6. run again: it resumes from the step-30 checkpoint, same data order and token count"
olmo-train train --nproc "$NPROC" "${TRAIN[@]}"

step "7. rebuild the batch of step $STEP and compare with the fingerprint the trainer logged"
olmo-data inspect-batch "$OUT/run/config.yaml" --step "$STEP" --decode --tokenizer "$OUT/data/tokenizer.json" \
  | head -n 40
python - "$OUT" "$STEP" <<'PY'
import json, sys
from olmo_data.run import inspect_batch
out, step = sys.argv[1], int(sys.argv[2])
logged = {r["step"]: r for r in map(json.loads, open(f"{out}/run/metrics.jsonl"))}
report = inspect_batch(f"{out}/run/config.yaml", step=step)
trained = logged[step]["train/batch_fingerprint"]
print(f"step {step}: trained fingerprint {trained}, rebuilt {report.batch_fingerprint}")
assert trained == report.batch_fingerprint, "the rebuilt batch differs from the trained one"
last = max(logged)
print(f"steps logged: {len(logged)} (1..{last}), tokens seen: {logged[last]['train/tokens_seen']:,}")
PY
step "8. generate: greedy, then beam search, from the last checkpoint"
olmo-train generate "$OUT/run/latest" --prompt "def " --prompt "import " --max-steps 24
olmo-train generate "$OUT/run/latest" --prompt "class " --max-steps 16 --beam-size 3 --all-beams

step "9. unshard the step-75 checkpoint (written by $NPROC processes) in one process"
olmo-train unshard "$OUT/run/step75" --destination "$OUT/step75-unsharded"

step "10. export to Hugging Face transformers, compared block by block with our model (--check)"
olmo-train export-hf "$OUT/run/latest" --destination "$OUT/hf" --check
python - "$OUT/hf" <<'PY'
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
from olmo_train.optional import quietly
with quietly():  # torchao, which transformers imports when installed, warns of its CUDA kernels on CPU machines
    model, tok = AutoModelForCausalLM.from_pretrained(sys.argv[1]), AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok("def ", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=24, do_sample=False)
print("transformers:", repr(tok.decode(out[0])))
PY

step "11. import it back and fine-tune it on chat data (prepare-tulu: only the assistant's tokens train)"
olmo-train import-hf "$OUT/hf" --destination "$OUT/imported"
olmo-data prepare-tulu --documents "$OUT/data/chat/tulu.jsonl" --tokenizer "$OUT/imported/tokenizer.json" \
  --sequence-length 128 --destination "$OUT/sft-data"
olmo-train train --nproc "$NPROC" "$OUT/imported/config.yaml" \
  "--data.paths=[$OUT/sft-data]" "--save_folder=$OUT/sft" --max_duration=20 --global_train_batch_size=16 \
  --device_train_microbatch_size=8 --save_interval=20 --console_log_interval=5 --optimizer.learning_rate=1e-3
olmo-train generate "$OUT/sft/latest" --prompt "What is the Python module \`json\` for?" --max-steps 24

step "done: outputs in $OUT/"
