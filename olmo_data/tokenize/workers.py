"""Tokenizing input files in worker processes: one input into its parts (`tokenize_input`), and the pool that runs
them with a progress bar fed by the workers (`run_tasks`). Each input is tokenized on its own, so the output does
not depend on how many processes there are."""

from __future__ import annotations

import array
import contextlib
import os
import queue
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any

from olmo_data.display import Silent, bar_disabled
from olmo_data.errors import DataError
from olmo_data.interrupts import quiet_worker
from olmo_data.tokenize.options import TYPECODES, InputResult, ResolvedOptions, dtype_max
from olmo_data.tokenize.parts import PartWriter
from olmo_data.tokenize.reading import Batch, InputReader, close_all, prefetched, read_ahead
from olmo_data.tokenizer import Tokenizer

_worker: dict[str, Any] = {}


class Stopped(Exception):
    """The run is ending (another input failed, or it was interrupted): this input stops where it is."""


def _init_worker(
    resolved: ResolvedOptions,
    tok: Tokenizer,
    progress: Any,
    threads: int,
    stop: Any = None,
    load: Any = None,
    ahead: dict[int, InputReader] | None = None,
) -> None:
    """Per-process state. `tok` comes from the parent (inherited through fork, or pickled cheaply); `stop` is the
    event the parent sets to end the run early (None in the parent's own process); `load`, on an engine, the
    workers' shared count of [inputs not started, inputs being tokenized], from which each batch takes its
    threads (`_threads_now`): `threads` is then the most it takes; `ahead`, by input index, the readers the parent
    read ahead with while the engine loaded (`reading.read_ahead`; through a fork only, in memory)."""
    if stop is not None:  # a worker process
        quiet_worker()
        progress.cancel_join_thread()  # exiting never waits on progress messages nobody reads any more
    if threads == 1 or tok.backend != "hf":  # the engines' threads are the encoder's own, not HF's rayon pool
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # N processes on N cores: no thread pools inside each
        os.environ["RAYON_NUM_THREADS"] = "1"
    tok.set_num_threads(threads)
    _worker.update(resolved=resolved, tok=tok, progress=progress, stop=stop, load=load, cores=threads)
    _worker["ahead"] = ahead if ahead is not None else {}


def _threads_now(load: Any, cores: int) -> int:
    """Threads for the next batch: one while inputs wait to start, as every worker then has an input and every core
    a worker (a second thread each only costs: ~5% more CPU on cl100k, in thread hand-offs); once none wait, the
    cores of the workers that have finished, shared among those still running."""
    pending, running = load[0], load[1]
    return 1 if pending > 0 else max(1, cores // max(1, running))


class TokenIdTooLarge(ValueError):
    """A token id that the run's dtype cannot hold: `doc` is the document's place in its batch."""

    def __init__(self, doc: int, token: int) -> None:
        super().__init__(f"token id {token} of document {doc} of the batch does not fit")
        self.doc, self.token = doc, token


def _encode(
    tok: Tokenizer, texts: list[str], eos: int | None, bos: int | None, typecode: str = "I"
) -> tuple[array.array[int], list[int]]:
    """Encode a batch and add BOS/EOS where not already present; returns (flat tokens in an array of `typecode`,
    `TYPECODES`' for the run's dtype, and lengths). An id the dtype cannot hold raises TokenIdTooLarge.

    Each text's ids are copied into the array as they come and dropped (`encode_each`), so one text's int objects
    are alive at a time, in memory the last one freed."""
    got = tok.encode_flat(texts)  # the engine's batch call, where it has one (quicktok): no lists at all
    if got is not None:
        return _with_bos_eos(got[0], got[1], eos, bos, typecode)
    # `fromlist`: ~8 ns a token, against ~20 for `extend` and ~40 for np.fromiter; and it checks that each id fits
    # the typecode, so the output's dtype costs no pass of its own
    flat = array.array(typecode)
    lengths: list[int] = []
    for doc, ids in enumerate(tok.encode_each(texts)):
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        try:
            flat.fromlist(ids)
        except OverflowError:
            limit = (1 << (8 * flat.itemsize)) - 1
            raise TokenIdTooLarge(doc, next(t for t in ids if not 0 <= t <= limit)) from None
        lengths.append(len(ids))
    return flat, lengths


# Texts this many tokens long on average, or longer, have their ids copied into a batch's output one slice each;
# shorter ones by one boolean mask over the whole output, whose cost is per token where a slice's is per text
# (measured crossing at ~2,000 tokens a text)
SLICES_FROM = 2048


def _with_bos_eos(tokens: Any, offsets: Any, eos: int | None, bos: int | None, typecode: str) -> tuple[Any, list[int]]:
    """`_encode` on a batch's ids as one array (uint32) and offsets: BOS and EOS added by the same rule, in numpy.

    The output is laid out first (each text's size and start), then filled in one pass that also narrows the ids to
    the run's dtype, where `np.insert` after a separate `astype` took ~1.5x as long (GPT-2 on the tokenize
    benchmark's 31 MB: 30 -> 20 ms, against ~0.2 s of encoding; BENCHMARKS.md)."""
    import numpy as np

    n = len(offsets) - 1
    if offsets[0] != 0 or offsets[-1] != len(tokens):  # (every engine's promise; the fill below relies on it)
        raise ValueError(f"an engine's offsets cover ids {offsets[0]}..{offsets[-1]} of {len(tokens)}")
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
    empty = lengths == 0
    add_bos = np.zeros(n, dtype=bool)
    add_eos = np.zeros(n, dtype=bool)
    if bos is not None:
        add_bos = empty | (tokens[np.where(empty, 0, starts)] != bos) if len(tokens) else empty
    if eos is not None:
        last = tokens[np.where(empty, 0, ends - 1)] if len(tokens) else np.zeros(n, dtype=np.uint32)
        # an empty text given BOS ends with it: EOS is added unless it is the same token
        add_eos = np.where(empty, bos is None or bos != eos, last != eos)
    sizes = lengths + add_bos + add_eos
    firsts = np.cumsum(sizes) - sizes  # where each text's output begins
    bos_at, eos_at = firsts[add_bos], (firsts + sizes - 1)[add_eos]
    dtype = np.dtype(typecode)
    limit = (1 << (8 * dtype.itemsize)) - 1
    if typecode != "I":
        fits = (not len(tokens) or int(tokens.max()) <= limit) and not any(
            value is not None and value > limit and used.any() for value, used in ((bos, add_bos), (eos, add_eos))
        )
        if not fits:  # laid out unnarrowed, so that the first id that does not fit names its document
            dtype = np.dtype(np.uint32)
    flat = np.empty(int(sizes.sum()), dtype)
    if len(tokens) >= SLICES_FROM * n:
        into, begin, end = (firsts + add_bos).tolist(), starts.tolist(), ends.tolist()
        for i in range(n):
            flat[into[i] : into[i] + end[i] - begin[i]] = tokens[begin[i] : end[i]]
    else:
        ids_at = np.ones(len(flat), dtype=bool)
        ids_at[bos_at] = False
        ids_at[eos_at] = False
        flat[ids_at] = tokens
    if bos is not None and len(bos_at):  # (an empty index still has numpy check that the value fits)
        flat[bos_at] = bos
    if eos is not None and len(eos_at):
        flat[eos_at] = eos
    if flat.dtype != np.dtype(typecode):
        over = int(np.flatnonzero(flat > limit)[0])
        doc = int(np.searchsorted(firsts + sizes, over, side="right"))
        raise TokenIdTooLarge(doc, int(flat[over]))
    return flat, sizes.tolist()


def _tokenize_input(task: tuple[int, str, int, str]) -> InputResult:
    load = _worker.get("load")
    if load is None:
        return _tokenize_one(task)
    with load.get_lock():
        load[0] -= 1
        load[1] += 1
    try:
        return _tokenize_one(task)
    finally:
        with load.get_lock():
            load[1] -= 1


def _tokenize_one(task: tuple[int, str, int, str]) -> InputResult:
    index, path, size, dest = task
    resolved: ResolvedOptions = _worker["resolved"]
    tok: Tokenizer = _worker["tok"]
    progress = _worker["progress"]
    stop = _worker["stop"]
    load, cores = _worker.get("load"), _worker.get("cores", 1)
    opts = resolved.options
    result = InputResult(index=index, path=path, size=size)
    typecode = TYPECODES[resolved.dtype]
    writer = PartWriter(Path(dest), index, resolved.dtype, opts.max_tokens_per_file)
    # the parent's reader where it read this input ahead (its batches and counts so far), else a new one
    reader = _worker["ahead"].pop(index, None) or InputReader.open(path, opts)
    reported = 0  # input bytes reported to the progress bar so far

    def report(docs_done: int, tokens: int, chars: int, at: int | None, end: bool = False) -> None:
        nonlocal reported
        if progress is None:
            return
        now = size if end else min(at or reported, size)
        progress.put((index, docs_done, tokens, chars, now - reported))
        reported = now

    def flush(batch: Batch) -> None:
        if stop is not None and stop.is_set():  # checked once a batch: cheap, and soon enough to end promptly
            raise Stopped(path)
        docs, texts = batch.docs, batch.texts
        if load is not None:
            tok.set_num_threads(_threads_now(load, cores))
        try:
            flat, lengths = _encode(tok, texts, resolved.eos, resolved.bos, typecode)
        except TokenIdTooLarge as e:
            raise DataError(
                f"{path}:{docs[e.doc].line}: token id {e.token} does not fit {resolved.dtype} "
                f"(max {dtype_max(resolved.dtype)}); use --dtype uint32"
            ) from None
        writer.write(flat, lengths, docs, path)
        result.documents += len(docs)
        result.tokens += len(flat)
        report(len(docs), len(flat), batch.chars, batch.at)

    try:
        stream = prefetched(reader.batches())
        try:
            for batch in stream:
                flush(batch)
        finally:
            stream.close()  # (its reading thread ended and joined)
            reader.close()
        result.skipped_empty = reader.empty[0]
        writer.close_part()
        report(0, 0, 0, None, end=True)  # the whole file is done, whatever the position could tell
    except BaseException:
        writer.abort()
        with contextlib.suppress(OSError):  # the error on its way up is the one to report
            for part in writer.parts:  # parts of an unfinished input are not reusable
                for key in ("path", "metadata"):
                    (Path(dest) / part[key]).unlink(missing_ok=True)
        raise
    result.parts = writer.parts
    if reader.bad is not None:
        result.skipped_bad, result.bad_examples = reader.bad.count, reader.bad.examples
    return result


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed: no terminal
        return False


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
    disable = bar_disabled(show_progress)
    if disable is None and not _stderr_is_terminal():  # (tqdm's own rule for None)
        disable = True
    if disable:  # tqdm's import reads its version through importlib.metadata: ~80 ms of start-up for nothing
        bar: Any = Silent(None, total_bytes)
    else:
        from tqdm import tqdm

        bar = tqdm(desc="tokenize", total=total_bytes, initial=reused_bytes, unit="B", unit_scale=True, leave=True)
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

    ahead: dict[int, InputReader] = {}  # inputs read ahead while the engine loaded (`reading.read_ahead`)
    try:
        if processes == 1 or len(todo) <= 1:
            local_q: queue.SimpleQueue[tuple[int, int, int, int, int]] = queue.SimpleQueue()
            ahead = read_ahead([(t[0], t[1]) for t in todo], resolved.options, tok.loading, width=1)
            _init_worker(resolved, tok, local_q, processes, ahead=ahead)
            for task in todo:
                result = _tokenize_input(task)
                while not local_q.empty():
                    update(local_q.get())
                yield finish(result)
            return
        # (imported here: multiprocessing costs a single-process run ~10-20 ms of start-up)
        from concurrent.futures import ProcessPoolExecutor

        from olmo_data.processes import pool_context

        # inputs are independent: largest first, so the last worker to finish is not stuck with a big file
        todo = sorted(todo, key=lambda t: -t[2])
        # fork where it is safe (olmo_data.processes): workers start at once and inherit the imported modules;
        # each loads its own tokenizer in the initializer, with thread pools off, so nothing threaded crosses it
        ctx = pool_context()
        if tok.backend in ("quicktok", "fastokens") and ctx.get_start_method() == "fork":
            # its batch call gives numpy arrays: numpy imported once here and inherited, rather than by every worker
            # at its first batch, at once (two tiny inputs on two processes: ~0.40 -> ~0.35 s)
            import numpy  # noqa: F401
        workers = min(processes, len(todo))
        if ctx.get_start_method() == "fork":
            # the inputs the workers start on, read here while an engine loads on a thread of its own (fastokens),
            # which is then loaded once, here, and inherited
            ahead = read_ahead([(t[0], t[1]) for t in todo], resolved.options, tok.loading, width=workers)
            tok.ready()
        progress_q, stop = ctx.Queue(), ctx.Event()
        # fewer inputs than processes: encode with threads instead. On an engine (its threads release the GIL), a
        # worker takes one thread while inputs wait to start, and once none do, up to `processes` (`_threads_now`):
        # when the last inputs run alone at the end, their threads keep every core busy
        engine = tok.backend != "hf"
        threads = processes if engine else max(1, processes // workers)
        load = ctx.Array("i", [len(todo), 0]) if engine else None
        pool = ProcessPoolExecutor(
            workers, ctx, initializer=_init_worker, initargs=(resolved, tok, progress_q, threads, stop, load, ahead)
        )
        try:
            running = {pool.submit(_tokenize_input, task) for task in todo}
            # the workers were forked at the first submit, each with its own copy of what was read ahead: the
            # parent's go now, not at the end of the run (a worker forked later would open its input afresh)
            close_all(ahead)
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
        close_all(ahead)  # (the parent's copies: each worker had its own)
        bar.close()
