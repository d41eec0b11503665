"""Chat conversations into token ids and label masks for supervised fine-tuning (`olmo-data prepare-tulu`).

Input rows (JSON lines or parquet, local or remote, or a Hugging Face dataset when `datasets` is installed)
hold `messages`, a list of `{role, content}` with role system, user or assistant, and optionally `id` and
`dataset`.

Templates (the README shows the token layouts):
  olmo  OLMo's `scripts/prepare_tulu_data.py`: EOS, then per message `<|{role}|>\n` (encoded alone) and the
        stripped content; a non-assistant's content is encoded together with its trailing `\n`; an
        assistant's content is followed by the EOS id and `\n` (encoded alone). Trained: the assistant's
        content and its EOS.
  tulu  open-instruct's "tulu" chat template: per message `<|{role}|>\n` + content (not stripped) + `\n`;
        an assistant's content is followed by EOS and `\n` (no `\n` after the last message). The text between
        two EOS tokens is encoded as one string. Trained, as in open-instruct's
        `sft_tulu_tokenize_and_truncate_v1`: all but each non-assistant message together with the `\n` before
        it and the `<|assistant|>\n` after it, i.e. the assistant replies and their EOS; a mask boundary inside
        a string falls after as many tokens as the text before it encodes to.
Both insert EOS by id. Conversations are truncated on the right to the sequence length; those left with no
trained token are dropped and counted by reason.

Destination layout:
  input_ids.npy       headerless little-endian uint16/uint32: instances of `seq_len` tokens back to back
  label_mask.npy      headerless bool (one byte per token) aligned with input_ids.npy; True = trained
  input_ids.csv.gz    headerless `start,end,id,src,loc` per example (as `tokenize` writes), file order
  metadata.jsonl      one JSON object per example, file order: id, dataset, src, row, tokens,
                      trained_tokens, full_tokens, truncated, instance, start, end
  doc_boundaries.npy  headerless little-endian uint64 (start, end) pairs per example, file order
  manifest.json       format "olmo-data.chat"; written last, so its presence means the directory is complete

Without `pack` each example is one instance, right-padded with the pad id (mask False), as OLMo does. With
`pack`, examples are placed in input order into the first of the last `pack_window` open instances with room
(first fit); a new instance is opened when none has room; instances are written in the order they were opened.
An example is never split (one longer than `seq_len` was already truncated to it); instance tails are padded.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import json
import logging
import multiprocessing as mp
import os
import re
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from olmo_data import __version__
from olmo_data.documents import file_format, numbered_lines, parquet_batches
from olmo_data.errors import DataError
from olmo_data.io import (
    atomic_path,
    expand_patterns,
    file_size,
    gzip_text_writer,
    is_remote,
    open_file,
    parquet_file,
    remove_stale_temporaries,
    write_json_atomic,
)
from olmo_data.manifest import DTYPES, MANIFEST_NAME, MANIFEST_VERSION, read_manifest, smallest_dtype
from olmo_data.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
TEMPLATES = ("olmo", "tulu")
FORMAT = "olmo-data.chat"
CHUNK_CONVERSATIONS = 512  # conversations per encode call / per task sent to a worker process
DEFAULT_PACK_WINDOW = 16
DROP_NO_ASSISTANT = "no_assistant_message"
DROP_TRUNCATED = "no_trained_token_after_truncation"

INPUT_IDS = "input_ids.npy"
LABEL_MASK = "label_mask.npy"
DOC_METADATA = "input_ids.csv.gz"
EXAMPLES = "metadata.jsonl"
BOUNDARIES = "doc_boundaries.npy"
OUTPUT_FILES = (INPUT_IDS, LABEL_MASK, DOC_METADATA, EXAMPLES, BOUNDARIES)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

Segment = tuple[str | int, int]  # (text to encode, or a token id; how much of it is untrained: see render)


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
class Conversation:
    messages: list[tuple[str, str]]
    id: str
    dataset: str
    source: str
    row: int


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


# ------------------------------------------------------------------------------------------------------------
# Templates


def render(messages: Sequence[tuple[str, str]], template: str, eos: int) -> list[Segment]:
    """The conversation as segments `(piece, untrained)`: a text to encode as one string, whose first `untrained`
    characters are not trained and the rest are; or a token id, trained when `untrained` is 0."""
    if template == "olmo":
        return _render_olmo(messages, eos)
    if template == "tulu":
        return _render_tulu(messages, eos)
    raise DataError(f"unknown chat template {template!r}; expected one of {', '.join(TEMPLATES)}")


def _render_olmo(messages: Sequence[tuple[str, str]], eos: int) -> list[Segment]:
    segments: list[Segment] = [(eos, 1)]
    for role, content in messages:
        header = f"<|{role}|>\n"
        segments.append((header, len(header)))
        if role == "assistant":
            segments += [(content.strip(), 0), (eos, 0), ("\n", 1)]
        else:
            text = content.strip() + "\n"
            segments.append((text, len(text)))
    return segments


def _render_tulu(messages: Sequence[tuple[str, str]], eos: int) -> list[Segment]:
    # open-instruct's labels: each non-assistant message is untrained from the end of what precedes it (so with
    # the "\n" after a previous assistant's EOS) to its end plus the "<|assistant|>\n" that follows it; all
    # else is trained. Between two EOS tokens that is an untrained part, then a trained part.
    pieces: list[tuple[str | int, bool]] = []
    for i, (role, content) in enumerate(messages):
        if role != "assistant":
            pieces.append((f"<|{role}|>\n{content}\n", False))
            continue
        pieces += [("<|assistant|>\n", i == 0 or messages[i - 1][0] == "assistant"), (content, True), (eos, True)]
        if i < len(messages) - 1:
            pieces.append(("\n", messages[i + 1][0] == "assistant"))
    segments: list[Segment] = []
    text, untrained = "", 0
    for piece, trained in pieces:
        if isinstance(piece, int):
            segments += [(text, untrained), (piece, 0)] if text else [(piece, 0)]
            text, untrained = "", 0
            continue
        if not trained:
            assert untrained == len(text), "an untrained part after a trained one between two EOS tokens"
            untrained += len(piece)
        text += piece
    return segments + [(text, untrained)] if text else segments


def encode_conversations(
    tok: Tokenizer,
    conversations: Sequence[Sequence[tuple[str, str]]],
    *,
    template: str,
    eos_token_id: int,
    seq_len: int | None = None,
) -> list[tuple[list[int], list[bool], int]]:
    """(ids, label mask, untruncated length) per conversation, with one batch encode call for all their text.

    A text segment trained from character k on is encoded whole; its first len(encode(text[:k])) tokens are
    untrained, which is how open-instruct places mask boundaries (by the token count of the rendered prefix).
    """
    rendered = [render(messages, template, eos_token_id) for messages in conversations]
    index: dict[str, int] = {}
    for segments in rendered:
        for piece, untrained in segments:
            if isinstance(piece, str):
                index.setdefault(piece, len(index))
                if 0 < untrained < len(piece):
                    index.setdefault(piece[:untrained], len(index))
    encoded = tok.encode_batch(list(index))
    out = []
    for segments in rendered:
        ids: list[int] = []
        mask: list[bool] = []
        for piece, untrained in segments:
            if isinstance(piece, int):
                ids.append(piece)
                mask.append(untrained == 0)
                continue
            part = encoded[index[piece]]
            if untrained >= len(piece) or untrained == 0:
                n = len(part) if untrained else 0
            else:
                n = min(len(encoded[index[piece[:untrained]]]), len(part))
            ids += part
            mask += [False] * n + [True] * (len(part) - n)
        full = len(ids)
        if seq_len is not None:
            ids, mask = ids[:seq_len], mask[:seq_len]
        out.append((ids, mask, full))
    return out


# ------------------------------------------------------------------------------------------------------------
# Reading rows (main process) and parsing them (worker processes)

BAD_ROW_HINT = " (use --skip-bad-documents to count and skip such rows)"


@dataclass
class _Task:
    """A chunk of raw rows of one input: JSON lines as bytes, parquet and hub rows as dicts."""

    source: str
    jsonl: bool
    rows: list[tuple[int, Any]]  # (1-based line or row, payload)


@dataclass
class _Chunk:
    """What a worker made of a `_Task`: the good conversations' records and tokens, and the bad rows."""

    records: list[dict[str, Any]]
    has_assistant: list[bool]
    ids: np.ndarray  # uint32, the truncated conversations back to back
    mask: np.ndarray  # bool, aligned with ids
    lengths: list[int]
    full_lengths: list[int]
    bad: list[str]


def _check_row(obj: Any) -> str | list[tuple[str, str]]:
    """The messages of a row, or what is wrong with it."""
    if not isinstance(obj, dict):
        return f"expected a JSON object with 'messages', found {type(obj).__name__}"
    if "messages" not in obj:
        return "field 'messages' is missing"
    messages = obj["messages"]
    if not isinstance(messages, (list, tuple)):
        return f"field 'messages' is a {type(messages).__name__}, not a list of {{role, content}}"
    if not messages:
        return "field 'messages' is empty"
    out = []
    for k, msg in enumerate(messages, start=1):
        if not isinstance(msg, dict):
            return f"message {k} is a {type(msg).__name__}, not an object with 'role' and 'content'"
        for key in ("role", "content"):
            if key not in msg:
                return f"message {k} has no {key!r}"
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            return f"message {k} has role {role!r}; expected one of {', '.join(ROLES)}"
        if not isinstance(content, str):
            what = "null" if content is None else f"a {type(content).__name__}"
            return f"message {k} ({role}): 'content' is {what}, not a string"
        try:  # a JSON "\ud800" escape decodes to a str that is not UTF-8; backends would differ on it
            content.encode("utf-8")
        except UnicodeEncodeError:
            return f"message {k} ({role}): 'content' holds a lone surrogate escape (invalid UTF-8)"
        out.append((role, content))
    return out


def parse_rows(task: _Task, skip_bad_rows: bool) -> tuple[list[Conversation], list[str]]:
    """The conversations of a chunk of rows, and the messages of its bad rows (raised unless skipped)."""
    conversations, bad = [], []
    for row, payload in task.rows:
        where = f"{task.source}:{row}" if task.jsonl else f"{task.source}: row {row}"
        obj = payload
        checked: str | list[tuple[str, str]]
        try:
            if task.jsonl:
                obj = json.loads(payload)
            checked = _check_row(obj)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            checked = f"malformed JSON ({getattr(e, 'msg', e)})"
        if isinstance(checked, str):
            if not skip_bad_rows:
                raise DataError(f"{where}: {checked}{BAD_ROW_HINT}")
            bad.append(f"{where}: {checked}")
            continue
        cid, dataset = obj.get("id"), obj.get("dataset")
        conversations.append(
            Conversation(
                messages=checked,
                id=str(cid) if cid is not None else f"{os.path.basename(task.source)}:{row}",
                dataset="" if dataset is None else str(dataset),
                source=task.source,
                row=row,
            )
        )
    return conversations, bad


def is_hub_dataset(spec: str) -> bool:
    """Whether an input names a Hugging Face dataset (`org/name` that is not a local path)."""
    return (
        not is_remote(spec)
        and not any(c in spec for c in "*?[")
        and not os.path.exists(os.path.expanduser(spec))
        and _HUB_ID.match(spec) is not None
    )


def _tasks(paths: Sequence[str], split: str, size: int) -> Iterator[_Task]:
    """Chunks of `size` raw rows, input after input, in order. Parsing is left to the workers."""
    for path in paths:
        if is_hub_dataset(path):
            source, jsonl, rows = f"hf:{path}:{split}", False, _hub_rows(path, split)
        elif file_format(path) == "jsonl":
            source, jsonl, rows = path, True, _jsonl_rows(path)
        else:
            source, jsonl, rows = path, False, _parquet_rows(path)
        while chunk := list(itertools.islice(rows, size)):
            yield _Task(source, jsonl, chunk)


def _jsonl_rows(path: str) -> Iterator[tuple[int, bytes]]:
    with open_file(path, "rb") as f:
        for line, raw in numbered_lines(f, path):
            if raw.strip():
                yield line, raw


def _parquet_rows(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    with parquet_file(path) as pf:
        names = pf.schema_arrow.names
        if "messages" not in names:
            raise DataError(f"{path}: no column 'messages' (columns: {', '.join(names)}); expected Tulu-format rows")
        columns = [c for c in ("messages", "id", "dataset") if c in names]
        row = 0
        for batch in parquet_batches(pf, path, 1024, columns):
            for obj in batch.to_pylist():
                row += 1
                yield row, obj


def _hub_rows(name: str, split: str) -> Iterator[tuple[int, Any]]:
    try:
        import datasets  # optional: only where the user installed it
    except ImportError:
        raise DataError(
            f"{name}: no such file; it looks like a Hugging Face dataset id, but the `datasets` library is "
            "not installed. Install it (pip install datasets), or download the dataset's parquet/jsonl files "
            "and give their paths"
        ) from None
    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as e:
        raise DataError(
            f"{name}: could not load split {split!r} from the Hugging Face hub ({type(e).__name__}: {e})"
        ) from e
    yield from enumerate(rows, start=1)


# ------------------------------------------------------------------------------------------------------------
# Parsing and tokenizing chunks (in worker processes when processes > 1)

_worker: dict[str, Any] = {}


def _init_worker(options: ChatOptions, eos: int, tok: Tokenizer | None = None) -> None:
    if tok is None:  # a worker process: N processes on N cores, so no thread pools inside each
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ["RAYON_NUM_THREADS"] = "1"
        tok = load_tokenizer(options.tokenizer, options.backend)  # type: ignore[arg-type]
    _worker.update(tok=tok, options=options, eos=eos)


def _process(task: _Task) -> _Chunk:
    options: ChatOptions = _worker["options"]
    conversations, bad = parse_rows(task, options.skip_bad_rows)
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
    tasks: Iterator[_Task], options: ChatOptions, eos: int, tok: Tokenizer, processes: int
) -> Iterator[_Chunk]:
    """Processed chunks in input order; at most 2 x processes chunks in flight, so memory stays bounded."""
    if processes == 1:
        _init_worker(options, eos, tok)
        yield from map(_process, tasks)
        return
    ctx = mp.get_context("spawn")  # no fork: tokenizer thread pools do not survive fork
    with ctx.Pool(processes, initializer=_init_worker, initargs=(options, eos)) as pool:
        pending: deque[Any] = deque()
        for task in tasks:
            pending.append(pool.apply_async(_process, (task,)))
            if len(pending) >= 2 * processes:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ------------------------------------------------------------------------------------------------------------
# Writing instances


@dataclass
class _Instance:
    index: int
    fill: int = 0
    ids: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)


class _InstanceWriter:
    """Places examples into instances (one each, or packed first fit) and streams full instances out."""

    def __init__(self, tmp: dict[str, Path], options: ChatOptions, dtype: str, pad: int) -> None:
        self.L, self.dtype, self.pad = options.seq_len, np.dtype(DTYPES[dtype]).newbyteorder("<"), pad
        self.pack, self.window = options.pack, options.pack_window
        self.ids_f: IO[bytes] = open(tmp[INPUT_IDS], "wb")  # noqa: SIM115 - closed in close()
        self.mask_f: IO[bytes] = open(tmp[LABEL_MASK], "wb")  # noqa: SIM115
        self.bounds_f: IO[bytes] = open(tmp[BOUNDARIES], "wb")  # noqa: SIM115
        self.examples_f: IO[str] = open(tmp[EXAMPLES], "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        self.csv_f: io.TextIOWrapper = gzip_text_writer(tmp[DOC_METADATA])
        self.csv = csv.writer(self.csv_f, lineterminator="\n")
        self.open: deque[_Instance] = deque()
        self.instances = 0
        self.examples = 0
        self.trained = 0
        self.padding = 0

    def add(self, ids: np.ndarray, mask: np.ndarray, record: dict[str, Any]) -> None:
        n = len(ids)
        target = None
        if self.pack:
            target = next((inst for inst in self.open if self.L - inst.fill >= n), None)
        if target is None:
            target = _Instance(self.instances)
            self.instances += 1
            self.open.append(target)
        start = target.index * self.L + target.fill
        record.update(instance=target.index, start=start, end=start + n)
        target.ids.append(ids)
        target.masks.append(mask)
        target.records.append(record)
        target.fill += n
        while self.open and (not self.pack or len(self.open) > self.window or self.open[0].fill == self.L):
            self._write(self.open.popleft())

    def _write(self, inst: _Instance) -> None:
        pad = self.L - inst.fill
        ids = np.concatenate([*inst.ids, np.full(pad, self.pad, dtype=np.uint32)]).astype(self.dtype)
        mask = np.concatenate([*inst.masks, np.zeros(pad, dtype=np.bool_)])
        self.ids_f.write(ids.tobytes())
        self.mask_f.write(mask.tobytes())
        self.padding += pad
        self.trained += int(mask.sum())
        for r in inst.records:
            self.csv.writerow((r["start"], r["end"], r["id"], r["src"], r["row"]))
            self.examples_f.write(json.dumps(r, ensure_ascii=False) + "\n")
            self.bounds_f.write(np.array([r["start"], r["end"]], dtype="<u8").tobytes())
        self.examples += len(inst.records)

    def close(self) -> None:
        while self.open:
            self._write(self.open.popleft())
        for f in (self.ids_f, self.mask_f, self.bounds_f, self.examples_f, self.csv_f):
            f.close()

    def abort(self) -> None:
        for f in (self.ids_f, self.mask_f, self.bounds_f, self.examples_f, self.csv_f):
            with contextlib.suppress(Exception):
                f.close()


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
    chunks: Iterator[_Chunk], writer: _InstanceWriter, counts: _Counts, seq_len: int, progress: bool | None
) -> None:
    """Drop what has nothing to train, record the rest and hand it to the writer, in input order."""
    from tqdm import tqdm

    with tqdm(desc="prepare-tulu", unit=" conv", disable=None if progress is None else not progress) as bar:
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


def _resolve_ids(options: ChatOptions, tok: Tokenizer) -> tuple[int, int, str]:
    """(eos, pad, dtype). Pad defaults to the tokenizer's pad token, else EOS: padding sits after the last
    real token of an instance and is never trained, so under causal attention its value changes nothing."""
    eos = options.eos_token_id if options.eos_token_id is not None else tok.eos_token_id
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
    return eos, pad, smallest_dtype(max(tok.vocab_size, eos + 1, pad + 1))


def _check_options(options: ChatOptions, processes: int) -> None:
    if options.template not in TEMPLATES:
        raise DataError(f"unknown template {options.template!r}; expected one of {', '.join(TEMPLATES)}")
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
    """Tokenize conversations into `destination` (layout in the module docstring) and return the summary.

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
    tok = load_tokenizer(options.tokenizer, options.backend)  # type: ignore[arg-type]
    eos, pad, dtype = _resolve_ids(options, tok)
    identity = {k: v for k, v in tok.identity().items() if k != "backend"}
    run_key = hashlib.sha256(
        json.dumps([_recorded_options(options), identity, eos, pad, dtype, recorded_inputs], sort_keys=True).encode()
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
    chunks = _processed(_tasks(paths, options.split, CHUNK_CONVERSATIONS), options, eos, tok, processes)
    try:
        with contextlib.ExitStack() as stack:
            tmp = {name: stack.enter_context(atomic_path(dest / name)) for name in OUTPUT_FILES}
            writer = _InstanceWriter(tmp, options, dtype, pad)
            try:
                _place_all(chunks, writer, counts, options.seq_len, progress)
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
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                dest.rmdir()
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


def read_doc_boundaries(directory: str) -> np.ndarray:
    """The (start, end) token offsets of each example of a chat directory: shape (examples, 2), file order."""
    path = os.path.join(directory, BOUNDARIES)
    if not os.path.exists(path):
        raise DataError(f"{path}: not found; is {directory} a directory written by `olmo-data prepare-tulu`?")
    return np.memmap(path, dtype="<u8", mode="r").reshape(-1, 2)
