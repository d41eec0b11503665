"""`olmo-data tokenize`: documents in, token files out, compatible with `dolma tokens`.

Layout of the destination (see also olmo_data/dataset/manifest.py):
  part-IIIII-KKKKK.npy     headerless little-endian uint16/uint32 tokens; input file I, part K
  part-IIIII-KKKKK.csv.gz  headerless rows `start,end,id,src,loc` (token offsets, end exclusive; 1-based line)
  manifest.json            what the directory holds; written last, so its presence means "complete"
  .progress/               per-input completion records, so a killed run resumes where it stopped

Each input file is tokenized on its own into its own parts, in file order. That makes the output a function of the
inputs and options only, byte-identical whatever `processes` is, and lets a rerun skip finished inputs.

The same independence spreads one destination over machines (`Shard`, `--shard I/N`, a Slurm array): each machine
tokenizes every N-th input into the shared destination, the last to finish writes the manifest (or `merge_shards`
does, after all of them), and the directory ends byte-identical to a one-machine run.

Modules: `run` (the driver: `tokenize`, `merge_shards`), `workers` (each input tokenized in a worker process, and
the pool with its progress bar), `reading` (an input read into batches, beside the encoding or ahead of it),
`parts` (writing an input's part files), `options` (what a run is asked to do and
what it did).
"""

from olmo_data.tokenize.options import (
    DEFAULT_MAX_TOKENS_PER_FILE,
    InputResult,
    ResolvedOptions,
    Shard,
    TokenizeOptions,
    TokenizeSummary,
)
from olmo_data.tokenize.parts import PartWriter
from olmo_data.tokenize.reading import BATCH_CHARS, BATCH_DOCUMENTS
from olmo_data.tokenize.run import PROGRESS_DIR, merge_shards, tokenize

__all__ = [
    "BATCH_CHARS",
    "BATCH_DOCUMENTS",
    "DEFAULT_MAX_TOKENS_PER_FILE",
    "PROGRESS_DIR",
    "InputResult",
    "PartWriter",
    "ResolvedOptions",
    "Shard",
    "TokenizeOptions",
    "TokenizeSummary",
    "merge_shards",
    "tokenize",
]
