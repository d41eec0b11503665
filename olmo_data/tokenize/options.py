"""What a tokenize run is asked to do (`TokenizeOptions`, `Shard`), what the options resolve to against the
tokenizer (`ResolvedOptions`), and what the run did (`InputResult` per input, `TokenizeSummary`)."""

from __future__ import annotations

import array
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from olmo_data.dataset import DTYPE_NAMES, smallest_dtype
from olmo_data.errors import DataError
from olmo_data.tokenizer import Tokenizer

DEFAULT_MAX_TOKENS_PER_FILE = 512 * 1024 * 1024  # as `dolma tokens`: 1 GiB of uint16
# The `array` typecodes of the token dtypes (`DTYPE_NAMES`): the workers collect tokens in these, in this machine's byte
# order as numpy's arrays of those dtypes hold them, with no numpy on the way
TYPECODES = {"uint16": "H", "uint32": "I"}
assert [array.array(TYPECODES[d]).itemsize for d in ("uint16", "uint32")] == [2, 4], "2- and 4-byte C unsigned types"


def dtype_max(dtype: str) -> int:
    """The largest token id `dtype` (uint16 or uint32) holds."""
    return (1 << (8 * array.array(TYPECODES[dtype]).itemsize)) - 1


@dataclass(frozen=True)
class TokenizeOptions:
    """Everything that changes the bytes of the output (and so goes into the manifest and the rerun check)."""

    tokenizer: str
    backend: str = "auto"
    dtype: str | None = None
    eos_token_id: int | None = None
    bos_token_id: int | None = None
    max_tokens_per_file: int = DEFAULT_MAX_TOKENS_PER_FILE
    text_field: str = "text"
    id_field: str = "id"
    skip_bad_documents: bool = False


@dataclass
class InputResult:
    """What one input file produced (also the content of its `.progress/` record)."""

    index: int
    path: str
    size: int
    parts: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    tokens: int = 0
    skipped_empty: int = 0
    skipped_bad: int = 0
    bad_examples: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Shard:
    """One machine's share of a tokenize run spread over `count` machines: input files index, index + count, ...

    Every count-th file rather than a contiguous block, so that sorted inputs of growing size (dated dumps) spread
    evenly. Shards share the destination: each input's parts and progress record carry its own index, so they never
    collide, and a re-run of one shard redoes only its own unfinished inputs.
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise DataError(f"shard {self}: N must be at least 1")
        if not 0 <= self.index < self.count:
            raise DataError(f"shard {self}: I must be below N, from 0 to {self.count - 1}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`I/N`, as `--shard` takes it."""
        index, slash, count = text.strip().partition("/")
        if not (slash and index.isdigit() and count.isdigit()):
            raise DataError(f"shard {text!r}: expected I/N, this machine's index (from 0) of N machines, e.g. 0/3")
        return cls(int(index), int(count))

    @classmethod
    def from_slurm_array(cls, environ: Mapping[str, str]) -> Shard | None:
        """This Slurm array task's shard (None outside an array task): task SLURM_ARRAY_TASK_ID of
        SLURM_ARRAY_TASK_COUNT, counted from the array's first index, so `--array=0-2` and `--array=1-3` both
        give shards 0/3, 1/3, 2/3. Indexes must be consecutive: `--array=0-8:4` would leave inputs to no task."""
        if "SLURM_ARRAY_TASK_ID" not in environ or "SLURM_ARRAY_TASK_COUNT" not in environ:
            return None
        values = {k: environ.get(f"SLURM_ARRAY_TASK_{k}", "") for k in ("ID", "COUNT", "MIN", "STEP")}
        values["MIN"] = values["MIN"] or "0"
        values["STEP"] = values["STEP"] or "1"
        if not all(v.isdigit() for v in values.values()):
            raise DataError(f"Slurm array variables {values} are not numbers; pass --shard I/N")
        if values["STEP"] != "1":
            raise DataError(
                f"SLURM_ARRAY_TASK_STEP is {values['STEP']}: shards need consecutive array indexes "
                "(sbatch --array=0-N); or pass --shard I/N"
            )
        return cls(int(values["ID"]) - int(values["MIN"]), int(values["COUNT"]))

    def takes(self, input_index: int) -> bool:
        return input_index % self.count == self.index


@dataclass
class TokenizeSummary:
    destination: str
    documents: int
    tokens: int
    skipped_empty: int
    skipped_bad: int
    files: int
    inputs: int
    inputs_reused: int
    seconds: float
    dtype: str
    backend: str
    bad_examples: list[str] = field(default_factory=list)
    shard: str | None = None  # "I/N" when this call tokenized one shard; the counts above are that shard's
    inputs_pending: int = 0  # inputs of other shards not done yet: no manifest until they are

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        reused = f", {self.inputs_reused} of {self.inputs} inputs already done" if self.inputs_reused else ""
        line = (
            f"tokenized {self.documents:,} documents into {self.tokens:,} tokens ({self.dtype}, {self.files} "
            f"file{'' if self.files == 1 else 's'}, "
            f"{self.backend} backend); skipped {self.skipped_empty:,} empty and {self.skipped_bad:,} bad documents; "
            f"{self.seconds:.1f} s, {self.tokens_per_second / 1e6:.2f} M tokens/s{reused}"
        )
        if self.shard is None:
            return line
        if self.inputs_pending:
            after = (
                f"{_count(self.inputs_pending, 'input')} of other shards still to do; the last shard to finish "
                "(or --merge) writes manifest.json"
            )
        else:
            after = "all shards done: manifest.json written"
        return f"shard {self.shard} ({_count(self.inputs, 'input')}): {line}; {after}"

    def merge_line(self) -> str:
        """What `merge_shards` did, in one line."""
        return (
            f"merged {self.inputs} inputs: {self.documents:,} documents, {self.tokens:,} tokens ({self.dtype}, "
            f"{self.files} files); manifest.json written"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class ResolvedOptions:
    """Options with defaults filled in from the tokenizer, as recorded in the manifest."""

    options: TokenizeOptions
    dtype: str
    eos: int | None
    bos: int | None
    tokenizer_identity: dict[str, Any]

    def run_record(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """What decides the output, as `.progress/run.json` records it: a rerun must match it to reuse work.

        Input files are named by path only: a file whose content changed (one fixed after a truncated download)
        is redone, since its own progress record names its size, and the other inputs are reused.
        """
        parts = {
            "options": recorded_options(self.options),
            "dtype": self.dtype,
            "eos": self.eos,
            "bos": self.bos,
            "tokenizer": self.tokenizer_identity["sha256"],
            "inputs": [str(i["path"]) for i in inputs],
        }
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        return {"run_key": key, "parts": parts, "inputs": inputs}


def recorded_options(options: TokenizeOptions) -> dict[str, Any]:
    d = asdict(options)
    for k in ("tokenizer", "backend", "dtype", "eos_token_id", "bos_token_id"):
        d.pop(k)  # recorded in their resolved form elsewhere in the manifest
    return d


def resolve_options(options: TokenizeOptions, tok: Tokenizer) -> ResolvedOptions:
    eos = options.eos_token_id if options.eos_token_id is not None else tok.eos_token_id
    if eos is None:
        raise DataError(f"{options.tokenizer}: the tokenizer has no recognisable EOS token; pass --eos-token-id")
    dtype = options.dtype or smallest_dtype(tok.vocab_size)
    if dtype not in DTYPE_NAMES:
        raise DataError(f"--dtype {dtype!r}: expected uint16 or uint32")
    limit = dtype_max(dtype)
    for name, value in (("--eos-token-id", eos), ("--bos-token-id", options.bos_token_id)):
        if value is not None and not 0 <= value <= limit:
            raise DataError(f"{name} {value} does not fit {dtype} (0..{limit}); use --dtype uint32")
    if options.max_tokens_per_file < 1:
        raise DataError(f"--max-tokens-per-file must be positive, got {options.max_tokens_per_file}")
    identity = tok.identity()
    identity.pop("backend")  # the backend does not change the bytes: both give identical ids
    return ResolvedOptions(options, dtype, eos, options.bos_token_id, identity)
