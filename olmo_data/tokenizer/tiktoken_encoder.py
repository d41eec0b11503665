"""The batch encoder of an engine-backed `Tokenizer`: added tokens and NFC in Python, the rest in the engine
(quicktok, riptoken or tiktoken, `engines`).

The engines' own special-token matching is not used, because tiktoken's does not prefer the longest token (which
matters for GPT-NeoX-20B's added space runs): added tokens whose `normalized` flag is false are matched in the raw
text, the rest is normalised and then the normalised added tokens are matched in it, both leftmost-longest, as
`tokenizers` does. Where the added tokens are runs of spaces the engine can take itself
(`tiktoken_plan.pair_space_runs`: GPT-NeoX-20B), the whole text goes to the engine in one call; otherwise each piece
between normalised added tokens is one call. On an engine with a batch call (quicktok), `flat` gives a batch's ids
as one array: the texts that need no cutting or normalising (the common case) in one engine call.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from olmo_data.tokenizer.engines import Engine, build_piece_encoder, decode, decode_table
from olmo_data.tokenizer.tiktoken_plan import PAIR, Plan, unpaired

# The tokenize stage runs one process per core, so one thread each; more are for single-process callers.
DEFAULT_NUM_THREADS = 1
# A batch on several threads is cut into this many runs of texts a thread, of about equal characters, which the
# threads take as they come free: documents' sizes vary by orders of magnitude, so halves by count leave a thread idle
CHUNKS_A_THREAD = 4


def balanced_chunks(texts: Sequence[str], n: int) -> list[Sequence[str]]:
    """`texts` cut into at most `n` consecutive runs of about equal characters: each text goes to the run its middle
    character falls in (a text is never cut), so a run is off its share by at most half a text either side."""
    total = sum(map(len, texts))
    chunks: list[Sequence[str]] = []
    start = 0
    current = 0  # the run the texts from `start` on go to
    seen = 0
    for i, text in enumerate(texts):
        run = min(n - 1, int((2 * seen + len(text)) * n // (2 * total))) if total else 0
        seen += len(text)
        if run != current:
            if i > start:
                chunks.append(texts[start:i])
            start, current = i, run
    if start < len(texts):
        chunks.append(texts[start:])
    return chunks


class ThreadPools:
    """The thread pool of this process for a number of threads, made when first asked for: a pool inherited through
    fork has no threads, and one for another count is shut down (its threads are idle: they end now, not at exit)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._key = (-1, 0)  # (pid, threads) the pool was made for

    def get(self, threads: int) -> ThreadPoolExecutor:
        key = (os.getpid(), threads)
        if self._pool is None or self._key != key:
            if self._pool is not None and self._key[0] == key[0]:
                self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(threads)
            self._key = key
        return self._pool


def _alternation(tokens: Sequence[str]) -> re.Pattern[str] | None:
    """A regex matching `tokens` leftmost-longest, as `tokenizers` matches added tokens."""
    if not tokens:
        return None
    lengths = sorted(len(t) for t in tokens)
    one_char_runs = all(t == tokens[0][0] * len(t) for t in tokens)
    if one_char_runs and lengths == [*range(lengths[0], lengths[-1] + 1)]:
        # Runs of one character (GPT-NeoX's space tokens): a bounded greedy repeat matches the same, faster.
        return re.compile(f"{re.escape(tokens[0][0])}{{{lengths[0]},{lengths[-1]}}}")
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t))))


class TiktokenEncoder:
    """The batch encoder of an engine-backed `Tokenizer`: added tokens and NFC here, the rest in the engine.

    Picklable (the engine and the thread pool are made again in each process), so a `Tokenizer` can go to workers.
    """

    def __init__(self, engine: Engine, name: str, plan: Plan, num_threads: int = DEFAULT_NUM_THREADS) -> None:
        self.engine = engine
        self.name = name
        self.plan = plan
        self.num_threads = num_threads
        self._encode_piece: Callable[[str], list[int]] = build_piece_encoder(engine, name, plan)
        self._raw_re = _alternation(list(plan.raw_tokens))
        self._norm_re = _alternation(list(plan.normalized_tokens))
        self._plain: Callable[[str], list[int]] | None = None
        self._decode_table: dict[int, bytes] | None = None
        self._pools = ThreadPools()

    def __reduce__(self) -> tuple[Any, ...]:
        # The plan holds the ranks once; the engine (a second copy) is rebuilt from it, which is quick.
        return (TiktokenEncoder, (self.engine, self.name, self.plan, self.num_threads))

    def decode(self, ids: Sequence[int]) -> str:
        if self._decode_table is None:
            self._decode_table = decode_table(self.plan)
        return decode(self._decode_table, ids)

    def encode(self, text: str) -> list[int]:
        raw = self._raw_re
        if raw is None or raw.search(text) is None:
            return self._encode_normalized(text)
        ids: list[int] = []
        pos = 0
        for m in raw.finditer(text):
            ids += self._encode_normalized(text[pos : m.start()])
            ids.append(self.plan.raw_tokens[m.group()])
            pos = m.end()
        ids += self._encode_normalized(text[pos:])
        return ids

    def _encode_normalized(self, text: str) -> list[int]:
        if self.plan.nfc:
            text = unicodedata.normalize("NFC", text)
        norm = self._norm_re
        if norm is None:
            return self._encode_piece(text)
        encode = self._encode_piece
        if self.plan.space_pairs:
            if PAIR[0] not in text and PAIR[1] not in text:  # (a text holding either is cut here, in Python)
                paired = text.replace("  ", PAIR)
                return encode(paired, text) if self.engine == "riptoken" else encode(paired)  # type: ignore[call-arg]
            encode = self._plain_encoder()
        table = self.plan.normalized_tokens
        ids: list[int] = []
        pos = 0
        for m in norm.finditer(text):
            start = m.start()
            if start > pos:
                ids += encode(text[pos:start])
            ids.append(table[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += encode(text[pos:])
        return ids

    def _whole(self, text: str) -> bool:
        """Whether `text` goes to the engine as it is: no added token in it, nothing for NFC to change, no pairs."""
        plan = self.plan
        return (
            not plan.space_pairs
            and (self._raw_re is None or self._raw_re.search(text) is None)
            and (not plan.nfc or unicodedata.is_normalized("NFC", text))
            and (self._norm_re is None or self._norm_re.search(text) is None)
        )

    def flat(self, texts: Sequence[str]) -> tuple[Any, Any] | None:
        """(tokens, offsets) of `texts` where the engine has a batch call (quicktok), else None: numpy uint32 ids back
        to back, int64 offsets (text i's are tokens[offsets[i]:offsets[i + 1]]), the same ids as `each` gives. Texts
        the engine takes whole go to it in one call (on `num_threads` threads); the others are encoded as `encode`
        does and put in their place."""
        batch = getattr(self._encode_piece, "flat", None)
        if batch is None:
            return None
        import numpy as np

        whole = [self._whole(t) for t in texts]
        given = [t for t, w in zip(texts, whole, strict=True) if w]
        tokens, offsets = batch(given, max(1, self.num_threads)) if given else (np.zeros(0, np.uint32), [0])
        if len(given) == len(texts):
            return tokens, np.asarray(offsets, dtype=np.int64)
        parts = []
        j = 0
        for text, w in zip(texts, whole, strict=True):
            if w:
                parts.append(tokens[offsets[j] : offsets[j + 1]])
                j += 1
            else:
                parts.append(np.asarray(self.encode(text), dtype=np.uint32))
        lengths = np.array([0, *map(len, parts)], dtype=np.int64)
        return np.concatenate(parts), np.cumsum(lengths)

    def _plain_encoder(self) -> Callable[[str], list[int]]:
        """The engine on the plan without space pairs, made on first use (rare: a text holding PAIR's characters)."""
        if self._plain is None:
            self._plain = build_piece_encoder(self.engine, self.name, unpaired(self.plan))
        return self._plain

    def _encode_list(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        return list(self.each(texts))

    def each(self, texts: Sequence[str]) -> Iterator[list[int]]:
        """The ids of each text in turn, each list made when it is asked for (on one thread): a caller that copies
        them out and drops them reuses the same memory for the next text, where a batch's lists (a few MB of int
        objects) are new memory each time (~4% of the tokenize stage's encode time on cl100k)."""
        threads = min(self.num_threads, len(texts))
        if threads <= 1:
            for text in texts:
                yield self.encode(text)
            return
        chunks = balanced_chunks(texts, CHUNKS_A_THREAD * threads)
        for part in self._pools.get(self.num_threads).map(self._encode_list, chunks):
            yield from part
