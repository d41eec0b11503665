"""Tokenizing input files in worker processes: one input into its parts (`tokenize_input`), and the pool that runs
them with a progress bar fed by the workers (`run_tasks`). Each input is tokenized on its own, so the output does
not depend on how many processes there are."""

from __future__ import annotations

import array
import contextlib
import os
import queue
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.dataset import DTYPES
from olmo_data.display import bar_disabled
from olmo_data.documents import BadDocuments, Document, ReadPosition, read_documents
from olmo_data.errors import DataError
from olmo_data.interrupts import quiet_worker
from olmo_data.processes import pool_context
from olmo_data.tokenize.options import InputResult, ResolvedOptions
from olmo_data.tokenize.parts import PartWriter
from olmo_data.tokenizer import Tokenizer

assert array.array("I").itemsize == 4, "uint32 token buffers need a 4-byte C unsigned int"

BATCH_DOCUMENTS = 512  # documents per encode call: large enough to amortise call overhead
BATCH_CHARS = 1024 * 1024  # ... but bounded in size: memory stays small and the progress bar moves

_worker: dict[str, Any] = {}


class Stopped(Exception):
    """The run is ending (another input failed, or it was interrupted): this input stops where it is."""


def _init_worker(resolved: ResolvedOptions, tok: Tokenizer, progress: Any, threads: int, stop: Any = None) -> None:
    """Per-process state. `tok` comes from the parent (inherited through fork, or pickled cheaply); `stop` is the
    event the parent sets to end the run early (None in the parent's own process)."""
    if stop is not None:  # a worker process
        quiet_worker()
        progress.cancel_join_thread()  # exiting never waits on progress messages nobody reads any more
    if threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # N processes on N cores: no thread pools inside each
        os.environ["RAYON_NUM_THREADS"] = "1"
    tok.set_num_threads(threads)
    _worker.update(resolved=resolved, tok=tok, progress=progress, stop=stop)


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
    resolved: ResolvedOptions = _worker["resolved"]
    tok: Tokenizer = _worker["tok"]
    progress = _worker["progress"]
    stop = _worker["stop"]
    opts = resolved.options
    result = InputResult(index=index, path=path, size=size)
    bad = BadDocuments() if opts.skip_bad_documents else None
    limit = int(np.iinfo(DTYPES[resolved.dtype]).max)
    writer = PartWriter(Path(dest), index, resolved.dtype, opts.max_tokens_per_file)
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
        if stop is not None and stop.is_set():  # checked once a batch: cheap, and soon enough to end promptly
            raise Stopped(path)
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
        with contextlib.suppress(OSError):  # the error on its way up is the one to report
            for part in writer.parts:  # parts of an unfinished input are not reusable
                for key in ("path", "metadata"):
                    (Path(dest) / part[key]).unlink(missing_ok=True)
        raise
    result.parts = writer.parts
    if bad is not None:
        result.skipped_bad, result.bad_examples = bad.count, bad.examples
    return result


def run_tasks(
    todo: list[tuple[int, str, int, str]],
    resolved: ResolvedOptions,
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
        disable=bar_disabled(show_progress),
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
        # fork where it is safe (olmo_data.processes): workers start at once and inherit the imported modules;
        # each loads its own tokenizer in the initializer, with thread pools off, so nothing threaded crosses it
        ctx = pool_context()
        progress_q, stop = ctx.Queue(), ctx.Event()
        workers = min(processes, len(todo))
        threads = max(1, processes // workers)  # fewer inputs than processes: encode with threads instead
        pool = ProcessPoolExecutor(
            workers, ctx, initializer=_init_worker, initargs=(resolved, tok, progress_q, threads, stop)
        )
        try:
            running = {pool.submit(_tokenize_input, task) for task in todo}
            while running:
                done, running = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                while True:
                    try:
                        update(progress_q.get_nowait())
                    except queue.Empty:
                        break
                for future in done:
                    yield finish(future.result())  # a failed input raises its error here
        except BaseException:  # a failed input, an interrupt, or the caller closing this generator
            # Workers are asked to stop and waited for, never killed: one killed while it sends a result would hold
            # the result queue's lock, and a pool's terminate can hang on it. Each stops within a batch and removes
            # its own temporaries; inputs not started are dropped.
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    finally:
        bar.close()
