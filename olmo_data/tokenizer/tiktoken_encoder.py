"""The batch encoder of a tiktoken-backed `Tokenizer`: added tokens and NFC in Python, the rest in tiktoken.

tiktoken's own special-token matching is not used, because it does not prefer the longest token (which matters
for GPT-NeoX-20B's added space runs): added tokens whose `normalized` flag is false are matched in the raw text,
the rest is normalised and then the normalised added tokens are matched in it, both leftmost-longest, as
`tokenizers` does.
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from olmo_data.tokenizer.tiktoken_plan import Plan

if TYPE_CHECKING:
    import tiktoken

# The tokenize stage runs one process per core, so one thread each; more are for single-process callers.
DEFAULT_NUM_THREADS = 1


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
    """The batch encoder of a tiktoken-backed `Tokenizer`: added tokens and NFC here, the rest in tiktoken.

    Picklable (the thread pool is made on first use in each process), so a `Tokenizer` can go to workers.
    """

    def __init__(self, enc: tiktoken.Encoding, plan: Plan, num_threads: int = DEFAULT_NUM_THREADS) -> None:
        self.enc = enc
        self.plan = plan
        self.num_threads = num_threads
        self._raw_re = _alternation(list(plan.raw_tokens))
        # tiktoken's `encode_ordinary` holds the GIL; `encode` with nothing allowed gives the same ids and
        # lets threads run in parallel (it needs a special token registered, or it scans every position).
        self._encode_piece: Callable[[str], list[int]] = enc.encode_ordinary
        if enc.special_tokens_set:
            self._encode_piece = functools.partial(enc.encode, allowed_special=frozenset(), disallowed_special=())
        self._norm_re = _alternation(list(plan.normalized_tokens))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_key = (-1, 0)  # (pid, threads) the pool was made for

    def __reduce__(self) -> tuple[Any, ...]:
        # The plan holds the ranks once; the Encoding (a second copy) is rebuilt from it, which is quick.
        return (_rebuild_encoder, (self.enc.name, self.plan, self.num_threads))

    def decode(self, ids: Sequence[int]) -> str:
        return self.enc.decode(ids)

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
        encode = self._encode_piece
        if norm is None:
            return encode(text)
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

    def _encode_list(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        threads = min(self.num_threads, len(texts))
        if threads <= 1:
            return self._encode_list(texts)
        if self._pool is None or self._pool_key != (os.getpid(), threads):
            self._pool = ThreadPoolExecutor(threads)  # a pool inherited through fork has no threads
            self._pool_key = (os.getpid(), threads)
        step = -(-len(texts) // threads)
        chunks = [texts[i : i + step] for i in range(0, len(texts), step)]
        out: list[list[int]] = []
        for part in self._pool.map(self._encode_list, chunks):
            out += part
        return out


def _rebuild_encoder(name: str, plan: Plan, num_threads: int) -> TiktokenEncoder:
    return TiktokenEncoder(build_encoding(name, plan), plan, num_threads)


def build_encoding(name: str, plan: Plan) -> tiktoken.Encoding:
    import tiktoken

    # tiktoken keeps special tokens for decoding only here: `TiktokenEncoder` matches them itself.
    specials = {**plan.raw_tokens, **plan.normalized_tokens}
    return tiktoken.Encoding(name, pat_str=plan.pat_str, mergeable_ranks=plan.ranks, special_tokens=specials)
