"""`olmo-data tokenize`: documents in, token files out, compatible with `dolma tokens`.

Layout of the destination (see also olmo_data/manifest.py):
  part-IIIII-KKKKK.npy     headerless little-endian uint16/uint32 tokens; input file I, part K
  part-IIIII-KKKKK.csv.gz  headerless rows `start,end,id,src,loc` (token offsets, end exclusive; 1-based line)
  manifest.json            what the directory holds; written last, so its presence means "complete"
  .progress/               per-input completion records, so a killed run resumes where it stopped

Each input file is tokenized on its own into its own parts, in file order. That makes the output a function of the
inputs and options only, byte-identical whatever `processes` is, and lets a rerun skip finished inputs.

The same independence spreads one destination over machines (`Shard`, `--shard I/N`, a Slurm array): each machine
tokenizes every N-th input into the shared destination, the last to finish writes the manifest (or `merge_shards`
does, after all of them), and the directory ends byte-identical to a one-machine run.
"""

from __future__ import annotations

import array
import csv
import hashlib
import io
import json
import logging
import multiprocessing as mp
import os
import queue
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from olmo_data import __version__
from olmo_data.documents import BadDocuments, Document, ReadPosition, read_documents
from olmo_data.errors import DataError
from olmo_data.io import expand_patterns, file_size, gzip_text_writer, remove_stale_temporaries, write_json_atomic
from olmo_data.manifest import DTYPES, MANIFEST_NAME, MANIFEST_VERSION, smallest_dtype
from olmo_data.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

assert array.array("I").itemsize == 4, "uint32 token buffers need a 4-byte C unsigned int"

DEFAULT_MAX_TOKENS_PER_FILE = 512 * 1024 * 1024  # as `dolma tokens`: 1 GiB of uint16
BATCH_DOCUMENTS = 512  # documents per encode call: large enough to amortise call overhead
BATCH_CHARS = 1024 * 1024  # ... but bounded in size: memory stays small and the progress bar moves
PROGRESS_DIR = ".progress"


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


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# ----------------------------------------------------------------------------------------------------------------
# Resolving options against the tokenizer


@dataclass(frozen=True)
class _Resolved:
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
            "options": _recorded_options(self.options),
            "dtype": self.dtype,
            "eos": self.eos,
            "bos": self.bos,
            "tokenizer": self.tokenizer_identity["sha256"],
            "inputs": [str(i["path"]) for i in inputs],
        }
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        return {"run_key": key, "parts": parts, "inputs": inputs}


def _recorded_options(options: TokenizeOptions) -> dict[str, Any]:
    d = asdict(options)
    for k in ("tokenizer", "backend", "dtype", "eos_token_id", "bos_token_id"):
        d.pop(k)  # recorded in their resolved form elsewhere in the manifest
    return d


def _resolve(options: TokenizeOptions, tok: Tokenizer) -> _Resolved:
    eos = options.eos_token_id if options.eos_token_id is not None else tok.eos_token_id
    if eos is None:
        raise DataError(f"{options.tokenizer}: the tokenizer has no recognisable EOS token; pass --eos-token-id")
    dtype = options.dtype or smallest_dtype(tok.vocab_size)
    if dtype not in DTYPES:
        raise DataError(f"--dtype {dtype!r}: expected uint16 or uint32")
    limit = int(np.iinfo(DTYPES[dtype]).max)
    for name, value in (("--eos-token-id", eos), ("--bos-token-id", options.bos_token_id)):
        if value is not None and not 0 <= value <= limit:
            raise DataError(f"{name} {value} does not fit {dtype} (0..{limit}); use --dtype uint32")
    if options.max_tokens_per_file < 1:
        raise DataError(f"--max-tokens-per-file must be positive, got {options.max_tokens_per_file}")
    identity = tok.identity()
    identity.pop("backend")  # the backend does not change the bytes: both give identical ids
    return _Resolved(options, dtype, eos, options.bos_token_id, identity)


# ----------------------------------------------------------------------------------------------------------------
# Writing parts of one input


class _PartWriter:
    """Appends documents to `part-IIIII-KKKKK.npy` files, starting a new part when the next would overflow.

    Files are written under `.tmp-` names and renamed when each part is complete. A document is never split: one
    larger than `max_tokens` gets a part of its own.
    """

    def __init__(self, dest: Path, input_index: int, dtype: str, max_tokens: int):
        self.dest, self.input_index, self.dtype, self.max_tokens = dest, input_index, dtype, max_tokens
        self.parts: list[dict[str, Any]] = []
        self.tokens = 0
        self.documents = 0
        self._npy: Any = None
        self._csv: io.TextIOWrapper | None = None
        self._writer: Any = None
        self._names: tuple[str, str] = ("", "")

    def _open(self) -> None:
        stem = f"part-{self.input_index:05d}-{len(self.parts):05d}"
        self._names = (f"{stem}.npy", f"{stem}.csv.gz")
        self._npy = open(self.dest / f".tmp-{self._names[0]}", "wb")  # noqa: SIM115
        self._csv = gzip_text_writer(self.dest / f".tmp-{self._names[1]}")
        self._writer = csv.writer(self._csv, lineterminator="\n")
        self.tokens = self.documents = 0

    def close_part(self) -> None:
        if self._npy is None:
            return
        self._npy.close()
        assert self._csv is not None
        self._csv.close()
        for name in self._names:
            os.replace(self.dest / f".tmp-{name}", self.dest / name)
        self.parts.append(
            {"path": self._names[0], "metadata": self._names[1], "documents": self.documents, "tokens": self.tokens}
        )
        self._npy = self._csv = None

    def abort(self) -> None:
        for f in (self._npy, self._csv):
            if f is not None:
                f.close()
        for name in self._names:
            (self.dest / f".tmp-{name}").unlink(missing_ok=True)
        self._npy = self._csv = None

    def write(self, flat: np.ndarray, lengths: Sequence[int], docs: Sequence[Document], src: str) -> None:
        """Append a batch: `flat` holds the documents' tokens back to back, `lengths[i]` tokens each."""
        pos = 0
        run_start = 0  # start in `flat` of the run of documents not yet written to the open part
        for doc, n in zip(docs, lengths, strict=True):
            if self._npy is None or (self.tokens > 0 and self.tokens + n > self.max_tokens):
                if self._npy is not None:
                    self._npy.write(flat[run_start:pos].tobytes())
                    self.close_part()
                self._open()
                run_start = pos
            self._writer.writerow((self.tokens, self.tokens + n, doc.id, src, doc.line))
            self.tokens += n
            self.documents += 1
            pos += n
        if self._npy is not None and pos > run_start:
            self._npy.write(flat[run_start:pos].tobytes())


# ----------------------------------------------------------------------------------------------------------------
# Tokenizing one input file (runs in worker processes)

_worker: dict[str, Any] = {}


def _init_worker(resolved: _Resolved, tok: Tokenizer, progress: Any, threads: int) -> None:
    """Per-process state. `tok` comes from the parent (inherited through fork, or pickled cheaply)."""
    if threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # N processes on N cores: no thread pools inside each
        os.environ["RAYON_NUM_THREADS"] = "1"
    tok.set_num_threads(threads)
    _worker.update(resolved=resolved, tok=tok, progress=progress)


def _encode(tok: Tokenizer, texts: list[str], eos: int | None, bos: int | None) -> tuple[np.ndarray, list[int]]:
    """Encode a batch and add BOS/EOS where not already present; returns (flat uint32 tokens, lengths)."""
    encoded = tok.encode_batch(texts)
    for ids in encoded:
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
    lengths = [len(ids) for ids in encoded]
    flat = array.array("I")  # C-level extend from lists: faster than np.fromiter over a chain
    for ids in encoded:
        flat.extend(ids)
    return np.frombuffer(flat, dtype=np.uint32), lengths


def _tokenize_input(task: tuple[int, str, int, str]) -> InputResult:
    index, path, size, dest = task
    resolved: _Resolved = _worker["resolved"]
    tok: Tokenizer = _worker["tok"]
    progress = _worker["progress"]
    opts = resolved.options
    result = InputResult(index=index, path=path, size=size)
    bad = BadDocuments() if opts.skip_bad_documents else None
    limit = int(np.iinfo(DTYPES[resolved.dtype]).max)
    writer = _PartWriter(Path(dest), index, resolved.dtype, opts.max_tokens_per_file)
    docs: list[Document] = []
    texts: list[str] = []
    chars = 0
    position = ReadPosition()
    reported = 0  # input bytes reported to the progress bar so far

    def report(docs_done: int, tokens: int, chars: int, end: bool = False) -> None:
        nonlocal reported
        if progress is None:
            return
        now = size if end else min(position.bytes() or reported, size)
        progress.put((index, docs_done, tokens, chars, now - reported))
        reported = now

    def flush() -> None:
        nonlocal chars
        flat, lengths = _encode(tok, texts, resolved.eos, resolved.bos)
        if flat.size and int(flat.max()) > limit:
            offending = int(np.argmax(flat > limit))
            doc_i = int(np.searchsorted(np.cumsum(lengths), offending, side="right"))
            raise DataError(
                f"{path}:{docs[doc_i].line}: token id {int(flat[offending])} does not fit {resolved.dtype} "
                f"(max {limit}); use --dtype uint32"
            )
        writer.write(flat.astype(resolved.dtype, copy=False), lengths, docs, path)
        result.documents += len(docs)
        result.tokens += int(flat.size)
        report(len(docs), int(flat.size), chars)
        docs.clear()
        texts.clear()
        chars = 0

    try:
        read = read_documents(path, text_field=opts.text_field, id_field=opts.id_field, bad=bad, position=position)
        for doc in read:
            text = doc.text.strip()
            if not text:
                result.skipped_empty += 1
                continue
            docs.append(doc)
            texts.append(text)
            chars += len(text)
            if len(docs) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
                flush()
        if docs:
            flush()
        writer.close_part()
        report(0, 0, 0, end=True)  # the whole file is done, whatever the position could tell
    except BaseException:
        writer.abort()
        for part in writer.parts:  # parts of an unfinished input are not reusable
            for key in ("path", "metadata"):
                (Path(dest) / part[key]).unlink(missing_ok=True)
        raise
    result.parts = writer.parts
    if bad is not None:
        result.skipped_bad, result.bad_examples = bad.count, bad.examples
    return result


# ----------------------------------------------------------------------------------------------------------------
# The driver


def tokenize(
    documents: Sequence[str],
    destination: str | os.PathLike[str],
    options: TokenizeOptions,
    *,
    processes: int = 1,
    progress: bool | None = None,
    shard: Shard | None = None,
) -> TokenizeSummary:
    """Tokenize every document of the input files into `destination`; see the module docstring for the layout.

    A rerun into the same destination with the same inputs and options reuses the inputs already done. Different
    inputs or options are refused, so one directory never mixes two runs. On bad input, this call's own outputs
    are removed (earlier complete inputs are kept for a rerun) and `DataError` names the file and line.

    With `shard`, only that shard's inputs are tokenized, while other shards may write into the same destination
    at the same time; the manifest is written by the shard that finds every input done when it ends.
    """
    start = time.perf_counter()
    if processes < 1:
        raise DataError(f"--processes must be at least 1, got {processes}")
    run = _Run.open(documents, destination, options, must_exist=False)
    dest, progress_dir, inputs = run.dest, run.dest / PROGRESS_DIR, run.inputs
    progress_dir.mkdir(exist_ok=True)
    if shard is None:  # alone in the destination: whatever a killed run left is stale
        remove_stale_temporaries(dest)
    write_json_atomic(progress_dir / "run.json", run.record)  # every shard writes the same bytes

    mine = [i for i in range(len(inputs)) if shard is None or shard.takes(i)]
    done = _completed(dest, inputs)
    results = {i: done[i] for i in mine if i in done}
    todo: list[tuple[int, str, int, str]] = []
    for i in mine:
        if i not in results:
            _remove_parts_of(dest, i)  # parts (and temporaries) of an unfinished earlier try
            todo.append((i, str(inputs[i]["path"]), int(inputs[i]["size"]), str(dest)))
    reused = len(results)
    written_now: list[int] = []
    try:
        sizes = [int(inputs[i]["size"]) for i in mine]
        total, reused_bytes = sum(sizes), sum(int(inputs[i]["size"]) for i in results)
        tasks = _run_tasks(todo, run.resolved, run.tok, processes, progress, len(mine), reused, total, reused_bytes)
        for result in tasks:
            write_json_atomic(progress_dir / f"{result.index:05d}.json", asdict(result))
            results[result.index] = result
            written_now.append(result.index)
    except BaseException as e:
        if isinstance(e, DataError):  # bad input: leave nothing of this call behind
            for task in todo:  # finished now, or cut off mid-write when the pool ended: temporaries too
                _remove_parts_of(dest, task[0])
            for i in written_now:
                (progress_dir / f"{i:05d}.json").unlink(missing_ok=True)
            # (a shard keeps the directory and its run record: other shards may be writing there)
            if shard is None and run.created:
                shutil.rmtree(dest, ignore_errors=True)
            elif shard is None and not any(progress_dir.glob("[0-9]*.json")):  # a fixed rerun starts afresh
                shutil.rmtree(progress_dir, ignore_errors=True)
        raise

    if shard is not None:  # the others' inputs too, as their records say now that this shard's are written
        results = {**_completed(dest, inputs), **results}
    pending = len(inputs) - len(results)
    if not pending:
        write_json_atomic(dest / MANIFEST_NAME, run.manifest([results[i] for i in range(len(inputs))]))
    summary = run.summary([results[i] for i in mine], reused, start)
    summary.shard, summary.inputs_pending = (None if shard is None else str(shard)), pending
    return summary


def merge_shards(
    documents: Sequence[str], destination: str | os.PathLike[str], options: TokenizeOptions
) -> TokenizeSummary:
    """Write the manifest of a destination that shards (`tokenize(..., shard=...)`) filled, once all are done.

    The last shard to finish does this by itself; this is the step to run after all of them (a job that depends on
    the array, say) when that is not certain: a shard killed after its last input, or a file system whose listings
    lag behind other machines' writes. Tokenizes nothing; refuses, naming them, while inputs are missing.
    """
    start = time.perf_counter()
    run = _Run.open(documents, destination, options, must_exist=True)
    dest, inputs = run.dest, run.inputs
    results = _completed(dest, inputs)
    missing = [i for i in range(len(inputs)) if i not in results]
    if missing:
        named = ", ".join(f"#{i} {inputs[i]['path']}" for i in missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise DataError(
            f"{dest}: {len(missing)} of {len(inputs)} inputs are not tokenized yet ({named}); rerun the shards "
            f"that take them (input #i belongs to shard i mod N of --shard I/N), then --merge again"
        )
    remove_stale_temporaries(dest)  # every input is done: no shard is writing here
    ordered = [results[i] for i in range(len(inputs))]
    write_json_atomic(dest / MANIFEST_NAME, run.manifest(ordered))
    return run.summary(ordered, len(ordered), start)


@dataclass
class _Run:
    """The inputs, tokenizer and options of one tokenize run into `dest`, checked against what `dest` holds."""

    dest: Path
    created: bool
    inputs: list[dict[str, Any]]
    tok: Tokenizer
    resolved: _Resolved
    record: dict[str, Any]

    @classmethod
    def open(
        cls, documents: Sequence[str], destination: str | os.PathLike[str], options: TokenizeOptions, must_exist: bool
    ) -> _Run:
        paths = expand_patterns(documents)
        inputs: list[dict[str, Any]] = [{"path": p, "size": file_size(p)} for p in paths]
        tok = load_tokenizer(options.tokenizer, options.backend)  # type: ignore[arg-type]
        resolved = _resolve(options, tok)
        dest = Path(destination)
        record = resolved.run_record(inputs)
        if must_exist and not (dest / PROGRESS_DIR / "run.json").is_file():
            raise DataError(f"{dest}: no tokenize run recorded there; run the shards (--shard I/N) first")
        created = not dest.exists()
        dest.mkdir(parents=True, exist_ok=True)
        _check_destination(dest, record)
        return cls(dest, created, inputs, tok, resolved, record)

    def manifest(self, ordered: list[InputResult]) -> dict[str, Any]:
        """What the directory holds, from every input's result in input order: the same bytes however many
        processes or shards produced them."""
        return {
            "format": "olmo-data.tokens",
            "version": MANIFEST_VERSION,
            "tool_version": __version__,
            "dtype": self.resolved.dtype,
            "tokenizer": self.resolved.tokenizer_identity,
            "eos_token_id": self.resolved.eos,
            "bos_token_id": self.resolved.bos,
            "pad_token_id": self.tok.pad_token_id,
            "options": _recorded_options(self.resolved.options),
            "inputs": self.inputs,
            "files": [dict(part, input=r.index) for r in ordered for part in r.parts],
            "totals": _totals(ordered),
        }

    def summary(self, results: list[InputResult], reused: int, start: float) -> TokenizeSummary:
        """What this call did (`results`: the inputs it was given, `reused` of them done before it)."""
        return TokenizeSummary(
            destination=str(self.dest),
            files=sum(len(r.parts) for r in results),
            inputs=len(results),
            inputs_reused=reused,
            seconds=time.perf_counter() - start,
            dtype=self.resolved.dtype,
            backend=self.tok.backend,
            bad_examples=[m for r in results for m in r.bad_examples][:5],
            **_totals(results),
        )


class _Totals(TypedDict):
    documents: int
    tokens: int
    skipped_empty: int
    skipped_bad: int


def _totals(results: list[InputResult]) -> _Totals:
    return {
        "documents": sum(r.documents for r in results),
        "tokens": sum(r.tokens for r in results),
        "skipped_empty": sum(r.skipped_empty for r in results),
        "skipped_bad": sum(r.skipped_bad for r in results),
    }


def _check_destination(dest: Path, record: dict[str, Any]) -> None:
    """Refuse a destination that holds output of a different run, saying what differs (inputs, options or
    tokenizer, and which)."""
    run_file = dest / PROGRESS_DIR / "run.json"
    # listed before looking for the run record: a shard starting beside others may see their parts appear, but
    # those come only after the record, which is then found
    leftovers = [p.name for p in dest.iterdir() if p.name.startswith("part-") or p.name == MANIFEST_NAME]
    if run_file.exists():
        try:
            previous = json.loads(run_file.read_text())
            key = previous.get("run_key")
        except (json.JSONDecodeError, AttributeError) as e:
            raise DataError(f"{run_file}: damaged ({e}); delete {dest / PROGRESS_DIR} to start over") from e
        if key != record["run_key"]:
            raise DataError(
                f"{dest}: holds tokenized output of a different run ({_what_differs(previous, record)}); "
                "use an empty destination, or delete this one to start over"
            )
        return
    if leftovers:
        raise DataError(
            f"{dest}: already holds token files ({leftovers[0]}, ...) that this tool did not record; "
            "use an empty destination"
        )


def _what_differs(previous: dict[str, Any], record: dict[str, Any]) -> str:
    before, now = previous.get("parts"), record["parts"]
    if not isinstance(before, dict):  # written by an older version, which recorded only a digest
        return "other inputs, options or tokenizer"
    found = []
    if before.get("inputs") != now["inputs"]:
        gone = [p for p in before.get("inputs", []) if p not in now["inputs"]]
        new = [p for p in now["inputs"] if p not in before.get("inputs", [])]
        detail = "; ".join(
            x for x in (f"not given now: {gone[:2]}" if gone else "", f"new: {new[:2]}" if new else "") if x
        )
        found.append(f"inputs ({detail or 'another order'})")
    for key in ("options", "dtype", "eos", "bos"):
        if before.get(key) != now[key]:
            if isinstance(now[key], dict):
                keys = sorted(
                    k
                    for k in set(before.get(key) or {}) | set(now[key])
                    if (before.get(key) or {}).get(k) != now[key].get(k)
                )
                found.append(f"options {', '.join(keys)}")
            else:
                found.append(f"{key} {before.get(key)} -> {now[key]}")
    if before.get("tokenizer") != now["tokenizer"]:
        found.append(f"tokenizer (sha256 {str(before.get('tokenizer'))[:12]}... -> {now['tokenizer'][:12]}...)")
    return "; ".join(found) or "other inputs, options or tokenizer"


def _completed(dest: Path, inputs: list[dict[str, Any]]) -> dict[int, InputResult]:
    """The inputs done (by this process, an earlier run or another shard): a progress record for the same file
    and size, and all the parts it names."""
    done = {}
    for i, inp in enumerate(inputs):
        result = _load_done(dest / PROGRESS_DIR, i, inp)
        if result is not None and all((dest / p["path"]).exists() for p in result.parts):
            done[i] = result
    return done


def _load_done(progress_dir: Path, index: int, inp: dict[str, Any]) -> InputResult | None:
    record = progress_dir / f"{index:05d}.json"
    if not record.exists():
        return None
    data = json.loads(record.read_text())
    if data.get("path") != inp["path"] or data.get("size") != inp["size"]:
        return None
    return InputResult(**data)


def _remove_parts_of(dest: Path, index: int) -> None:
    """One input's parts, and the temporaries of a killed try at it (only its own: shards may be writing theirs)."""
    for pattern in (f"part-{index:05d}-*", f".tmp-part-{index:05d}-*"):
        for p in dest.glob(pattern):
            p.unlink(missing_ok=True)


def _run_tasks(
    todo: list[tuple[int, str, int, str]],
    resolved: _Resolved,
    tok: Tokenizer,
    processes: int,
    show_progress: bool | None,
    n_inputs: int,
    reused: int,
    total_bytes: int,
    reused_bytes: int,
) -> Any:
    """Yield InputResults as inputs finish, with a progress bar fed by the workers.

    The bar counts input bytes (compressed, as on disk), which are known before any work starts, so it shows the
    percentage done and an ETA; it stays on screen when the work ends, as the record of what was done.
    """
    from tqdm import tqdm

    bar = tqdm(
        desc="tokenize",
        total=total_bytes,
        initial=reused_bytes,
        unit="B",
        unit_scale=True,
        disable=(None if show_progress is None else not show_progress),
        leave=True,
    )
    docs = tokens = chars = 0
    t0 = time.perf_counter()
    files_done = reused
    shown: dict[int, list[int]] = {}  # per input: [docs, tokens, bytes] the bar has counted so far
    finished: set[int] = set()

    def show(refresh: bool = False) -> None:
        dt = max(time.perf_counter() - t0, 1e-9)
        bar.set_postfix_str(
            f"files {files_done}/{n_inputs}, {docs:,} docs, {tokens / 1e6:.1f}M tokens, "
            f"{chars / dt / 1e6:.1f} MB/s of text",
            refresh=refresh,
        )

    def update(msg: tuple[int, int, int, int, int]) -> None:
        nonlocal docs, tokens, chars
        index, n_docs, n_tokens, n_chars, n_bytes = msg
        if index in finished:  # a late message of an input already counted in full
            return
        counted = shown.setdefault(index, [0, 0, 0])
        counted[0] += n_docs
        counted[1] += n_tokens
        counted[2] += n_bytes
        docs, tokens, chars = docs + n_docs, tokens + n_tokens, chars + n_chars
        show()
        bar.update(n_bytes)

    def finish(result: InputResult) -> InputResult:
        """A finished input counts in full, whatever of its progress messages are still on their way."""
        nonlocal files_done
        counted = shown.pop(result.index, [0, 0, 0])
        update((result.index, result.documents - counted[0], result.tokens - counted[1], 0, result.size - counted[2]))
        finished.add(result.index)
        files_done += 1
        show(refresh=True)
        return result

    try:
        if processes == 1 or len(todo) <= 1:
            local_q: queue.SimpleQueue[tuple[int, int, int, int, int]] = queue.SimpleQueue()
            _init_worker(resolved, tok, local_q, processes)
            for task in todo:
                result = _tokenize_input(task)
                while not local_q.empty():
                    update(local_q.get())
                yield finish(result)
            return
        # inputs are independent: largest first, so the last worker to finish is not stuck with a big file
        todo = sorted(todo, key=lambda t: -t[2])
        # fork where there is one: workers start at once and inherit the imported modules; each loads its own
        # tokenizer in the initializer, with thread pools off, so nothing threaded crosses the fork
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        progress_q = ctx.Queue()
        workers = min(processes, len(todo))
        threads = max(1, processes // workers)  # fewer inputs than processes: encode with threads instead
        with ctx.Pool(workers, initializer=_init_worker, initargs=(resolved, tok, progress_q, threads)) as pool:
            pending = pool.imap_unordered(_tokenize_input, todo)
            remaining = len(todo)
            while remaining:
                try:
                    done: InputResult | None = pending.next(timeout=0.2)
                except mp.TimeoutError:
                    done = None
                while True:
                    try:
                        update(progress_q.get_nowait())
                    except queue.Empty:
                        break
                if done is not None:
                    remaining -= 1
                    yield finish(done)
    finally:
        bar.close()
