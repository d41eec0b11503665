"""fastokens (optional, the `fast` extra) as an engine: the one module that imports it.

fastokens (PyPI, Apache-2.0, Rust with PCRE2's JIT for the split regex) runs a whole tokenizer.json itself: its
added tokens, its normaliser (GPT-NeoX-20B's NFC), its split regex and byte-level BPE. So unlike the plan engines
(`engines`) it is not given a `Plan`: it is given the tokenizer.json's text, and our encoder's added-token and NFC
handling is not used. That is how it has to run GPT-NeoX-20B, whose added runs of spaces our plans turn into pairs
(`tiktoken_plan.pair_space_runs`): fastokens' other way in (`from_tiktoken`) turns ranks back into merges and refuses
the pairs' whole-piece ranks. On GPT-2's regex it encodes at about 1.8x riptoken's rate on GPT-NeoX-20B and 2-3x on
GPT-2 (BENCHMARKS.md), and its batch call gives ids as one buffer (no Python lists). Like every engine it is used
only where the start-up self-check gives `tokenizers'` ids (`tiktoken_backend`), never assumed.

Its ids are 0..n-1 with none missing, or it refuses the file (cl100k's and dolma2's vocabularies have a gap at
100256: quicktok or riptoken run those). It loads in ~0.17 s (GPT-NeoX-20B), without the GIL, so the load runs on a
thread of its own from the moment the encoder is made, beside whatever the caller does next (`ready`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from olmo_data.tokenizer.tiktoken_encoder import CHUNKS_A_THREAD, DEFAULT_NUM_THREADS, ThreadPools, balanced_chunks
from olmo_data.tokenizer.tiktoken_plan import without_lone_surrogates

# fastokens' own worker threads for BPE: none. The tokenize stage runs a process per core and forks its workers
# from a parent that has loaded the engine (a fork copies no threads); our own threads (`num_threads`) are used
# where a caller asks for more.
THREAD_SETTINGS = {"FASTOKENS_BPE_THREADS": "1", "RAYON_NUM_THREADS": "1"}


def refusal(tokenizer_json: Mapping[str, Any]) -> str | None:
    """Why fastokens cannot run this tokenizer.json (already parsed), or None when it may (the self-check decides)."""
    vocab = tokenizer_json.get("model", {}).get("vocab")
    if not isinstance(vocab, dict):
        return "fastokens runs BPE vocabularies only"
    ids = set(vocab.values())
    if len(ids) != len(vocab) or ids != set(range(len(vocab))):
        missing = min(set(range(max(ids, default=0) + 1)) - ids, default=None)
        where = f" (id {missing} has no token)" if missing is not None else ""
        return f"fastokens needs the vocabulary's ids to be 0..n-1, each given once{where}"
    return None


class FastokensEncoder:
    """The batch encoder of a fastokens-backed `Tokenizer` (texts as they are: fastokens matches added tokens and
    normalises itself). Picklable as its tokenizer.json's text: each process loads the engine again."""

    engine = "fastokens"

    def __init__(self, name: str, json_text: str, num_threads: int = DEFAULT_NUM_THREADS) -> None:
        self.name = name
        self.json_text = json_text
        self.num_threads = num_threads
        self._tokenizer: Any = None
        self._error: BaseException | None = None
        self._pools = ThreadPools()
        for key, value in THREAD_SETTINGS.items():  # (read by fastokens when it loads)
            os.environ[key] = value
        import fastokens

        # not a daemon: an exiting interpreter waits for it, where a daemon thread still inside the load when the
        # interpreter finalises is unwound through Rust's panic guard on its way back to the GIL, and the process
        # aborts ("FATAL: exception not rethrown"; seen when a command stopped by a signal exited at once)
        self._loading: threading.Thread | None = threading.Thread(
            target=self._load, args=(fastokens.Tokenizer,), name="fastokens-load"
        )
        self._loading.start()

    def _load(self, tokenizer_class: Any) -> None:
        try:
            tokenizer = tokenizer_class.from_json_str(self.json_text)
            tokenizer.no_truncation()  # whole texts, unpadded, whatever the file says (`hf.ignored_settings`)
            tokenizer.no_padding()
            tokenizer.encode_batch_flat(["warm up"])  # its first call sets up (~20 ms); here, not in each worker
            self._tokenizer = tokenizer
        except BaseException as e:  # (raised in the caller's thread by `ready`)
            self._error = e

    def ready(self) -> None:
        """Wait for the engine to have loaded; raises what loading it raised (ValueError on a file it refuses). Called
        before every use, and by the tokenize stage before it forks its workers (a fork copies no threads). In a
        process forked while the load was under way (the thread did not come along) it loads here instead."""
        if self._loading is not None:
            import numpy  # noqa: F401  (`flat` needs it: imported while the engine loads, not after)

            self._loading.join()
            self._loading = None
        if self._tokenizer is None and self._error is None:
            import fastokens

            self._load(fastokens.Tokenizer)
        if self._error is not None:
            raise self._error

    def loading(self) -> bool:
        """Whether the loading thread is still at work (without waiting for it)."""
        return self._loading is not None and self._loading.is_alive()

    def __reduce__(self) -> tuple[Any, ...]:
        return (FastokensEncoder, (self.name, self.json_text, self.num_threads))

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text as `tokenizers` decodes them (its decoder, invalid UTF-8 replaced)."""
        self.ready()
        return str(self._tokenizer.decode(list(map(int, ids)), skip_special_tokens=False))

    def _flat_one_call(self, texts: Sequence[str]) -> tuple[Any, Any]:
        import numpy as np

        texts = list(texts)
        try:
            ids, offsets = self._tokenizer.encode_batch_flat(texts)
        except UnicodeEncodeError:  # a lone surrogate: as the other engines encode it (U+FFFD)
            ids, offsets = self._tokenizer.encode_batch_flat([without_lone_surrogates(t) for t in texts])
        return np.frombuffer(ids, dtype=np.uint32), np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)

    def flat(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """(tokens, offsets) of `texts`: numpy uint32 ids back to back, int64 offsets (text i's ids are
        tokens[offsets[i]:offsets[i + 1]]); on `num_threads` threads (fastokens' batch call releases the GIL)."""
        self.ready()
        threads = min(self.num_threads, len(texts))
        if threads <= 1:
            return self._flat_one_call(texts)
        import numpy as np

        chunks = balanced_chunks(texts, CHUNKS_A_THREAD * threads)
        parts = list(self._pools.get(self.num_threads).map(self._flat_one_call, chunks))
        ends = np.cumsum([0] + [len(tokens) for tokens, _ in parts[:-1]])
        offsets = np.concatenate([[0]] + [off[1:] + end for (_, off), end in zip(parts, ends, strict=True)])
        return np.concatenate([tokens for tokens, _ in parts]), offsets

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        tokens, offsets = self.flat(texts)
        ids = tokens.tolist()
        bounds = offsets.tolist()
        return [ids[bounds[i] : bounds[i + 1]] for i in range(len(texts))]

    def each(self, texts: Sequence[str]) -> Iterator[list[int]]:
        """The ids of each text in turn (one batch call, cut into lists as they are asked for)."""
        tokens, offsets = self.flat(texts)
        bounds = offsets.tolist()
        for i in range(len(texts)):
            yield tokens[bounds[i] : bounds[i + 1]].tolist()
