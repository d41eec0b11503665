"""`prepare_chat` (`olmo-data prepare-tulu`): chat rows in, a directory of instances and label masks out.

Rows are read in order (`rows`), parsed and encoded with the template (`templates`) in worker processes, and
placed into instances in input order (`packing`), so the output bytes depend only on the inputs and options,
never on the number of processes. Conversations left with no trained token after truncation are dropped and
counted by reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data import __version__
from olmo_data.chat.hf_template import ChatTemplate, TemplateEncoder, resolve_template
from olmo_data.chat.packing import (
    BOUNDARIES,
    DOC_METADATA,
    EXAMPLES,
    INPUT_IDS,
    LABEL_MASK,
    OUTPUT_FILES,
    InstanceWriter,
)
from olmo_data.chat.rows import BAD_ROW_HINT, Conversation, RowChunk, count_rows, is_hub_dataset, parse_rows, row_chunks
from olmo_data.chat.templates import TEMPLATES, encode_conversations
from olmo_data.dataset import MANIFEST_NAME, MANIFEST_VERSION, read_manifest, smallest_dtype
from olmo_data.display import progress_bar
from olmo_data.documents import file_format
from olmo_data.errors import DataError, is_disk_full
from olmo_data.interrupts import quiet_worker, signals_deferred
from olmo_data.io import (
    atomic_path,
    expand_patterns,
    file_size,
    remove_live_temporaries,
    remove_stale_temporaries,
    write_json_atomic,
)
from olmo_data.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

FORMAT = "olmo-data.chat"
CHUNK_CONVERSATIONS = 512  # conversations per encode call / per task sent to a worker process
DEFAULT_PACK_WINDOW = 16
DROP_NO_ASSISTANT = "no_assistant_message"
DROP_TRUNCATED = "no_trained_token_after_truncation"


@dataclass(frozen=True)
class ChatOptions:
    """Everything that changes the bytes of the output (recorded in the manifest and in the rerun check)."""

    tokenizer: str
    seq_len: int
    template: str = "olmo"
    backend: str = "auto"
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    pack: bool = False
    pack_window: int = DEFAULT_PACK_WINDOW
    skip_bad_rows: bool = False
    split: str = "train"  # for Hugging Face dataset ids only


@dataclass
class ChatSummary:
    destination: str
    read: int
    written: int
    truncated: int
    dropped: dict[str, int]
    bad_rows: int
    instances: int
    seq_len: int
    tokens: int
    trained_tokens: int
    padding_tokens: int
    dtype: str
    template: str
    pack: bool
    seconds: float = 0.0
    reused: bool = False
    bad_examples: list[str] = field(default_factory=list)

    @property
    def trained_share(self) -> float:
        return self.trained_tokens / self.tokens if self.tokens else 0.0

    @property
    def padding_share(self) -> float:
        return self.padding_tokens / self.tokens if self.tokens else 0.0

    def line(self) -> str:
        dropped = sum(self.dropped.values())
        reasons = ", ".join(f"{n:,} {r.replace('_', ' ')}" for r, n in sorted(self.dropped.items()) if n)
        packed = "packed " if self.pack else ""
        again = " (already complete: nothing redone)" if self.reused else f"; {self.seconds:.1f} s"
        return (
            f"read {self.read:,} conversations, wrote {self.written:,} into {self.instances:,} "
            f"{packed}instances of {self.seq_len} tokens ({self.tokens:,} tokens, {self.dtype}, "
            f"template {self.template}); "
            f"{self.truncated:,} truncated; dropped {dropped:,}{f' ({reasons})' if reasons else ''}; "
            f"{self.bad_rows:,} bad rows skipped; trained tokens {100 * self.trained_share:.1f}%, "
            f"padding {100 * self.padding_share:.1f}%{again}"
        )


@dataclass
class _Chunk:
    """What a worker made of a `RowChunk`: the good conversations' records and tokens, and the bad rows."""

    records: list[dict[str, Any]]
    has_assistant: list[bool]
    ids: np.ndarray  # uint32, the truncated conversations back to back
    mask: np.ndarray  # bool, aligned with ids
    lengths: list[int]
    full_lengths: list[int]
    bad: list[str]


# ------------------------------------------------------------------------------------------------------------
# Parsing and tokenizing chunks (in worker processes when processes > 1)

_worker: dict[str, Any] = {}


def _init_worker(
    options: ChatOptions,
    eos: int,
    template: ChatTemplate | None,
    tok: Tokenizer | None = None,
    encoder: TemplateEncoder | None = None,
) -> None:
    if tok is None:  # a worker process: N processes on N cores, so no thread pools inside each
        quiet_worker()  # SIGTERM and Ctrl-C are the parent's to handle: it ends the pool
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ["RAYON_NUM_THREADS"] = "1"
        tok = load_tokenizer(options.tokenizer, options.backend)  # type: ignore[arg-type]
        if template is not None:
            encoder = TemplateEncoder(template, options.tokenizer, eos)
    _worker.update(tok=tok, options=options, eos=eos, encoder=encoder)


def _encode_with_template(
    encoder: TemplateEncoder, task: RowChunk, conversations: list[Conversation], bad: list[str], options: ChatOptions
) -> tuple[list[Conversation], list[tuple[list[int], list[bool], int]]]:
    """A tokenizer's chat template: a row it fails to render (a Jinja error, a role it refuses, a template that
    rewrites earlier turns) is a bad row, named with the template."""
    kept, texts, spans = [], [], []
    for c in conversations:
        try:
            text, turns = encoder.turns(c.messages)
        except ValueError as e:
            where = f"{c.source}:{c.row}" if task.jsonl else f"{c.source}: row {c.row}"
            message = f"{where}: chat template {encoder.template.source}: {e}"
            if not options.skip_bad_rows:
                raise DataError(message + BAD_ROW_HINT) from None
            bad.append(message)
            continue
        kept.append(c)
        texts.append(text)
        spans.append(turns)
    encoded = encoder.encode(texts, spans)
    L = options.seq_len
    return kept, [(ids[:L], mask[:L], len(ids)) for ids, mask in encoded]


def _process(task: RowChunk) -> _Chunk:
    options: ChatOptions = _worker["options"]
    conversations, bad = parse_rows(task, options.skip_bad_rows)
    if _worker["encoder"] is not None:
        conversations, encoded = _encode_with_template(_worker["encoder"], task, conversations, bad, options)
    else:
        encoded = encode_conversations(
            _worker["tok"],
            [c.messages for c in conversations],
            template=options.template,
            eos_token_id=_worker["eos"],
            seq_len=options.seq_len,
        )
    lengths = [len(ids) for ids, _, _ in encoded]
    total = sum(lengths)
    return _Chunk(
        records=[{"id": c.id, "dataset": c.dataset, "src": c.source, "row": c.row} for c in conversations],
        has_assistant=[any(role == "assistant" for role, _ in c.messages) for c in conversations],
        ids=np.fromiter(itertools.chain.from_iterable(e[0] for e in encoded), dtype=np.uint32, count=total),
        mask=np.fromiter(itertools.chain.from_iterable(e[1] for e in encoded), dtype=np.bool_, count=total),
        lengths=lengths,
        full_lengths=[e[2] for e in encoded],
        bad=bad,
    )


def _processed(
    tasks: Iterator[RowChunk],
    options: ChatOptions,
    eos: int,
    tok: Tokenizer,
    processes: int,
    encoder: TemplateEncoder | None = None,
) -> Generator[_Chunk, None, None]:
    """Processed chunks in input order; at most 2 x processes chunks in flight, so memory stays bounded."""
    if processes == 1:
        _init_worker(options, eos, None, tok, encoder)
        yield from map(_process, tasks)
        return
    ctx = mp.get_context("spawn")  # no fork: tokenizer thread pools do not survive fork
    template = encoder.template if encoder is not None else None
    pool = ProcessPoolExecutor(processes, ctx, initializer=_init_worker, initargs=(options, eos, template))
    try:
        pending: deque[Future[_Chunk]] = deque()
        for task in tasks:
            with signals_deferred():  # a submit may spawn a worker: a signal mid-spawn leaves it reading a closed pipe
                pending.append(pool.submit(_process, task))
            if len(pending) >= 2 * processes:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # also on failure, interrupt or close: chunks in flight are small, so waiting for them is short, and
        # no worker is killed mid-write (see olmo_data.interrupts)
        pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------------------------------
# The driver


@dataclass
class _Counts:
    read: int = 0
    truncated: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {DROP_NO_ASSISTANT: 0, DROP_TRUNCATED: 0})
    bad_rows: int = 0
    bad_examples: list[str] = field(default_factory=list)


def _place_all(
    chunks: Iterator[_Chunk],
    writer: InstanceWriter,
    counts: _Counts,
    seq_len: int,
    progress: bool | None,
    paths: Sequence[str] = (),
) -> None:
    """Drop what has nothing to train, record the rest and hand it to the writer, in input order. The bar counts
    rows against the inputs' row count (counted only when the bar shows), so it has a total and an ETA."""
    with progress_bar(desc="prepare-tulu", unit=" rows", progress=progress) as bar:
        if not bar.disable:
            bar.total = count_rows(paths)
            bar.refresh()
        for chunk in chunks:
            counts.bad_rows += len(chunk.bad)
            counts.bad_examples += chunk.bad[: 5 - len(counts.bad_examples)]
            offsets = np.concatenate([[0], np.cumsum(chunk.lengths)])
            for k, record in enumerate(chunk.records):
                counts.read += 1
                ids = chunk.ids[offsets[k] : offsets[k + 1]]
                mask = chunk.mask[offsets[k] : offsets[k + 1]]
                trained = int(mask.sum())
                if trained == 0:
                    counts.dropped[DROP_TRUNCATED if chunk.has_assistant[k] else DROP_NO_ASSISTANT] += 1
                    continue
                full = chunk.full_lengths[k]
                counts.truncated += full > seq_len
                record.update(tokens=len(ids), trained_tokens=trained, full_tokens=full, truncated=full > seq_len)
                writer.add(ids, mask, record)
            bar.update(len(chunk.records) + len(chunk.bad))
        if bar.total is not None:  # blank lines counted as rows: the bar ends full all the same
            bar.total = bar.n


def _resolve_ids(options: ChatOptions, tok: Tokenizer, encoder: TemplateEncoder | None = None) -> tuple[int, int, str]:
    """(eos, pad, dtype). Pad defaults to the tokenizer's pad token, else EOS: padding sits after the last
    real token of an instance and is never trained, so under causal attention its value changes nothing. With a
    tokenizer's chat template, the template writes its own end-of-turn tokens; EOS is then only recorded (and the
    pad default), and transformers' EOS is the fallback."""
    eos = options.eos_token_id if options.eos_token_id is not None else tok.eos_token_id
    if eos is None and encoder is not None:
        eos = encoder.hf.eos_token_id
    if eos is None:
        raise DataError(
            f"{options.tokenizer}: the tokenizer has no recognisable EOS token (<|endoftext|>, </s>, ...); "
            "pass --eos-token-id"
        )
    pad = options.pad_token_id if options.pad_token_id is not None else tok.pad_token_id
    if pad is None:
        log.info("%s has no pad token: padding with the EOS id %d (never trained)", tok.name, eos)
        pad = eos
    for name, value in (("--eos-token-id", eos), ("--pad-token-id", pad)):
        if value < 0 or value >= 2**32:
            raise DataError(f"{name} {value} is not a valid token id (0 <= id < 2**32)")
    vocab = max(tok.vocab_size, encoder.vocab_size if encoder is not None else 0)  # transformers may add tokens
    return eos, pad, smallest_dtype(max(vocab, eos + 1, pad + 1))


def _check_options(options: ChatOptions, processes: int) -> None:
    if options.seq_len < 1:
        raise DataError(f"--sequence-length must be a positive number of tokens, got {options.seq_len}")
    if options.pack_window < 1:
        raise DataError(f"--pack-window must be at least 1, got {options.pack_window}")
    if processes < 1:
        raise DataError(f"--processes must be at least 1, got {processes}")


def _expand_inputs(inputs: Sequence[str]) -> list[str]:
    out: list[str] = []
    for spec in inputs:
        if is_hub_dataset(str(spec)):
            out.append(str(spec))
            continue
        for path in expand_patterns([str(spec)]):
            file_format(path)  # an unsupported file type is an error before any work
            out.append(path)
    if not out:
        raise DataError("no input given; pass --documents FILE (JSON lines or parquet) at least once")
    return list(dict.fromkeys(out))


def _recorded_options(options: ChatOptions) -> dict[str, Any]:
    d = asdict(options)
    for k in ("tokenizer", "backend", "eos_token_id", "pad_token_id"):
        d.pop(k)  # recorded resolved, elsewhere in the manifest; the backend does not change the ids
    return d


def prepare_chat(
    inputs: Sequence[str],
    destination: str | os.PathLike[str],
    options: ChatOptions,
    *,
    processes: int = 1,
    progress: bool | None = None,
) -> ChatSummary:
    """Tokenize conversations into `destination` (layout: `olmo_data.chat.packing`) and return the summary.

    Output bytes depend only on the inputs and options, never on `processes`. Nothing is left in the
    destination when this fails; a rerun with the same inputs and options finds the manifest and does nothing;
    a destination holding another run's output is refused.
    """
    t0 = time.perf_counter()
    _check_options(options, processes)
    paths = _expand_inputs(inputs)
    recorded_inputs = [
        {"path": p, "split": options.split, "size": None} if is_hub_dataset(p) else {"path": p, "size": file_size(p)}
        for p in paths
    ]
    template = None if options.template in TEMPLATES else resolve_template(options.template, options.tokenizer)
    tok = load_tokenizer(options.tokenizer, options.backend)  # type: ignore[arg-type]
    encoder = None
    if template is not None:
        given_eos = options.eos_token_id if options.eos_token_id is not None else tok.eos_token_id
        encoder = TemplateEncoder(template, options.tokenizer, -1 if given_eos is None else given_eos)
        encoder.check()
    eos, pad, dtype = _resolve_ids(options, tok, encoder)
    identity = {k: v for k, v in tok.identity().items() if k != "backend"}
    recorded_template = None if template is None else {"source": template.source, "sha256": template.sha256}
    key = [_recorded_options(options), identity, eos, pad, dtype, recorded_inputs]
    run_key = hashlib.sha256(
        json.dumps(key + [recorded_template] if template is not None else key, sort_keys=True).encode()
    ).hexdigest()
    dest = Path(destination)
    existing = read_manifest(str(dest)) if dest.is_dir() else None
    if existing is not None:
        if existing.get("format") != FORMAT or existing.get("run_key") != run_key:
            raise DataError(
                f"{dest}: already holds {existing.get('format', 'olmo-data')} output of a different run "
                "(other inputs, options or tokenizer); use an empty destination, or delete it to start over"
            )
        if not any(i["size"] is None for i in recorded_inputs):  # hub datasets may change: always redone
            return _summary_from(existing, str(dest), reused=True)
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dest)  # what a killed run left under `.tmp-` names

    counts = _Counts()
    chunks = _processed(row_chunks(paths, options.split, CHUNK_CONVERSATIONS), options, eos, tok, processes, encoder)
    try:
        with contextlib.ExitStack() as stack:
            tmp = {name: stack.enter_context(atomic_path(dest / name)) for name in OUTPUT_FILES}
            writer = InstanceWriter(tmp, options.seq_len, options.pack, options.pack_window, dtype, pad)
            try:
                _place_all(chunks, writer, counts, options.seq_len, progress, paths)
                writer.close()
            except BaseException:
                writer.abort()
                raise
            if writer.examples == 0:
                raise DataError(
                    f"no conversation left to write: read {counts.read}, dropped "
                    f"{counts.dropped[DROP_NO_ASSISTANT]} without an assistant message and "
                    f"{counts.dropped[DROP_TRUNCATED]} with nothing trained within --sequence-length "
                    f"{options.seq_len}, {counts.bad_rows} bad rows skipped; check the inputs and --sequence-length"
                )
            (dest / MANIFEST_NAME).unlink(missing_ok=True)  # a stale manifest must never describe new files
    except BaseException as e:
        with contextlib.suppress(Exception):
            chunks.close()  # its worker processes end now, not whenever the generator is collected
        remove_live_temporaries()  # one a signal caught before the ExitStack held it (see io.atomic_path)
        if created:
            with contextlib.suppress(OSError):
                dest.rmdir()
        if is_disk_full(e):
            raise DataError(f"{dest}: the disk is full ({e}); free space there and rerun") from e
        raise

    L = options.seq_len
    totals = {
        "read": counts.read,
        "written": writer.examples,
        "truncated": counts.truncated,
        "dropped": counts.dropped,
        "bad_rows": counts.bad_rows,
        "bad_examples": counts.bad_examples,
        "instances": writer.instances,
        "tokens": writer.instances * L,
        "trained_tokens": writer.trained,
        "padding_tokens": writer.padding,
    }
    manifest = {
        "format": FORMAT,
        "version": MANIFEST_VERSION,
        "tool_version": __version__,
        "dtype": dtype,
        "tokenizer": identity,
        "eos_token_id": eos,
        "bos_token_id": None,
        "pad_token_id": pad,
        "sequence_length": L,
        "template": options.template,
        **({"chat_template": template.record()} if template is not None else {}),
        "pack": options.pack,
        "options": _recorded_options(options),
        "inputs": recorded_inputs,
        "files": [
            {
                "path": INPUT_IDS,
                "label_mask": LABEL_MASK,
                "metadata": DOC_METADATA,
                "documents": writer.examples,
                "tokens": writer.instances * L,
                "instances": writer.instances,
            }
        ],
        "examples": EXAMPLES,
        "doc_boundaries": BOUNDARIES,
        "totals": totals,
        "run_key": run_key,
    }
    write_json_atomic(dest / MANIFEST_NAME, manifest)
    return _summary_from(manifest, str(dest), seconds=time.perf_counter() - t0)


def _summary_from(
    manifest: dict[str, Any], destination: str, seconds: float = 0.0, reused: bool = False
) -> ChatSummary:
    t = manifest["totals"]
    return ChatSummary(
        destination=destination,
        read=t["read"],
        written=t["written"],
        truncated=t["truncated"],
        dropped=dict(t["dropped"]),
        bad_rows=t["bad_rows"],
        instances=t["instances"],
        seq_len=manifest["sequence_length"],
        tokens=t["tokens"],
        trained_tokens=t["trained_tokens"],
        padding_tokens=t["padding_tokens"],
        dtype=manifest["dtype"],
        template=manifest["template"],
        pack=manifest["pack"],
        seconds=seconds,
        reused=reused,
        bad_examples=list(t.get("bad_examples", [])),
    )
