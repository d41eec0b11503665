#!/usr/bin/env bash
# The reference environment for tests/convert/test_hf_olmo.py: ai2-olmo 0.6.0 (the `hf_olmo` code that wrote
# DataDecide's checkpoints) in a venv of its own, since ai2-olmo ships a top-level package named `olmo_data`,
# which is this project's name. The tests run tests/convert/hf_olmo_reference.py with its python and skip,
# giving the reason this script recorded, when it is not there.
#
#   bash scripts/ai2_olmo_env.sh [DIR]     (DIR: default .venv-refs/ai2-olmo, or $AI2_OLMO_ENV)
#
# Instant when nothing changed (a stamp holding the pins below); otherwise an install from a wheelhouse kept in
# the user's cache (no index asked), filled once from pip's configured index, wheels only (--only-binary). torch is
# the CPU build pip's configured index holds here (as in the Makefile); ai2-olmo 0.6.0 asks only torch>=2.1.
# transformers is pinned to 4.46.3, of ai2-olmo 0.6.0's time: from transformers 5 on, its OLMoConfig loses
# `use_cache` and OLMoForCausalLM's forward fails. Exit status 1 on failure, with the reason in DIR.failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ENV_DIR=${1:-${AI2_OLMO_ENV:-.venv-refs/ai2-olmo}}
PINS=(ai2-olmo==0.6.0 torch==2.13.0 transformers==4.46.3 "numpy<2" safetensors)
STAMP="$ENV_DIR/.installed"
WANT="${PINS[*]} datasets-stand-in-1"
if [[ -f $STAMP && "$(cat "$STAMP")" == "$WANT" && -x $ENV_DIR/bin/python ]]; then
  exit 0
fi
fail() {
  mkdir -p "$(dirname "$ENV_DIR")"
  echo "$1" >"$ENV_DIR.failed"
  echo "ai2_olmo_env.sh: $1" >&2
  exit 1
}
rm -rf "$ENV_DIR" "$ENV_DIR.failed"
mkdir -p "$(dirname "$ENV_DIR")"
LOG="$(dirname "$ENV_DIR")/$(basename "$ENV_DIR").log"
python3 -m venv "$ENV_DIR" >"$LOG" 2>&1 || fail "python3 -m venv $ENV_DIR failed (see $LOG)"
PY="$ENV_DIR/bin/python"
# The wheels are kept outside the checkout (CI's is a fresh clone): once they are there, the install asks no index.
PYVER=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
WHEELS=${AI2_OLMO_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/olmo-data/wheels/ai2-olmo-0.6.0-$PYVER}
install() { "$PY" -m pip install --quiet --no-compile --no-index --find-links "$WHEELS" "${PINS[@]}" >>"$LOG" 2>&1; }
if ! install; then
  echo "fetching the wheels into $WHEELS" >>"$LOG"
  mkdir -p "$WHEELS"
  "$PY" -m pip download --quiet --only-binary=:all: -d "$WHEELS" "${PINS[@]}" >>"$LOG" 2>&1 ||
    fail "pip download ${PINS[*]} failed: $(grep -m1 -E '^ERROR' "$LOG" || tail -n1 "$LOG") (see $LOG)"
  install || fail "pip install ${PINS[*]} failed: $(grep -m1 -E '^ERROR' "$LOG" || tail -n1 "$LOG") (see $LOG)"
fi
# ai2-olmo 0.6.0's olmo/util.py imports Hugging Face `datasets` at module level (and names two of its classes in
# a signature) without listing it in its requirements; its model code never uses it. The real package brings
# pandas and pyarrow, whose current releases need the numpy>=2 that ai2-olmo refuses: a stand-in that says so.
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/datasets"
cat >"$SITE/datasets/__init__.py" <<'EOF'
"""A stand-in for Hugging Face `datasets` (scripts/ai2_olmo_env.sh): ai2-olmo imports it but its models do not
use it."""


class Dataset:
    pass


class DatasetDict:
    pass


def __getattr__(name):
    raise AttributeError(f"datasets.{name}: this reference environment has only a stand-in for `datasets`")
EOF
"$PY" -I -c 'import hf_olmo, olmo' >>"$LOG" 2>&1 ||
  fail "ai2-olmo installed but 'import hf_olmo' fails: $(tail -n1 "$LOG") (see $LOG)"
echo "$WANT" >"$STAMP"
