"""quicktok (optional, the `fast` extra: PyPI `quicktok-v1`, import name `quicktok`) as a BPE engine: the one module
that imports it.

quicktok runs no general regex: it has hand-written scanners for a few split grammars, of ours only cl100k's (so
cl100k and OLMo 2/3's dolma2 tokenizer, which is cl100k's BPE with its own added tokens; GPT-2 and GPT-NeoX-20B
keep riptoken). On code it encodes at about 1.9x riptoken's rate text by text, and 3.3x with its batch call, which
returns the ids of many texts as one numpy array (no Python lists). Like the other engines it is used only where
the start-up self-check gives `tokenizers'` ids (`tiktoken_backend`), never assumed.

It loads an encoding from files in a folder (`write_encoding`), not from a rank table in memory. The added tokens
are matched by our encoder (`tiktoken_encoder`), as for the other engines, so the engine is given none.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import json
import os
import struct
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from olmo_data.io import atomic_path, default_cache_dir
from olmo_data.tokenizer.tiktoken_plan import CL100K_PATTERN, Plan, without_lone_surrogates

# tiktoken's own cl100k_base pattern (possessive quantifiers; the same pieces as the tokenizer.json form
# `CL100K_PATTERN`: a possessive quantifier here never gives up a character the rest could match), which is the
# string quicktok keys its cl100k scanner by
CL100K_POSSESSIVE_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|"""
    r"""\s+"""
)
# our split regexes quicktok has a scanner for, as the name its `.enc` file gives the scanner
SCANNERS = {CL100K_PATTERN: "cl100k", CL100K_POSSESSIVE_PATTERN: "cl100k"}
# the character class table a scanner reads, in quicktok's `data` folder
_TABLES = {"cl100k": ("uniclass.bin", "uniclass.bin.meta")}
MAX_ID = (1 << 18) - 1  # quicktok's ids are 18 bits
ENCODING = "olmo"  # the encoding's name in its folder (every folder holds one)
FORMAT = 1  # of the files written here: a change to `_files` changes it
DIGESTS = "sha256.json"  # in each folder, written last: its files' SHA-256s, checked before each load


class QuicktokRefuses(ValueError):
    """A plan quicktok cannot run (its split regex, or ids past 18 bits): raised before the engine is touched."""


def refusal(plan: Plan) -> str | None:
    """Why quicktok cannot run `plan`, or None when it may (the self-check still decides)."""
    if plan.pat_str not in SCANNERS:
        return "quicktok runs cl100k's split regex only"
    top = max(plan.ranks.values(), default=0)
    if top > MAX_ID:
        return f"quicktok's ids are below 2**18, and this vocabulary has id {top}"
    return None


def with_fillers(ranks: dict[bytes, int]) -> dict[bytes, int]:
    """`ranks` with every id below the largest given a token, as quicktok requires (ids 0..n-1), where some have
    none (dolma2's: 100256-100260, its added tokens' ids, which our encoder gives itself).

    A filler is 3 bytes, 0xF8 (never in UTF-8) and two more, chosen so that neither of its two cuts into a
    2-byte and a 1-byte part is a pair of tokens: rank-ordered BPE makes a token only by merging two adjacent tokens,
    so a filler is never made and changes no id (and the self-check still decides)."""
    missing = sorted(set(range(max(ranks.values(), default=-1) + 1)).difference(ranks.values()))
    if not missing:
        return ranks
    candidates = (bytes((0xF8, a, b)) for a, b in itertools.product(range(256), repeat=2))
    fillers = itertools.islice((f for f in candidates if f[:2] not in ranks and f[1:] not in ranks), len(missing))
    extra = dict(zip(fillers, missing, strict=False))
    if len(extra) < len(missing):
        raise QuicktokRefuses(f"quicktok needs ids 0..n-1, and {len(missing)} ids of this vocabulary have no token")
    return {**ranks, **extra}


def _vocab_bytes(ranks: dict[bytes, int]) -> bytes:
    """The `.vocab` file: a u32 count, then each token in rank order as a u16 length, its bytes and its u32 rank
    (all little-endian)."""
    tokens = sorted(ranks, key=ranks.__getitem__)
    layout = "<I" + "".join(f"H{len(t)}sI" for t in tokens)
    return struct.pack(layout, len(tokens), *[v for t in tokens for v in (len(t), t, ranks[t])])


def _tables(scanner: str) -> dict[str, bytes]:
    """The class table `scanner` reads, from the installed quicktok's `data` folder."""
    import quicktok

    data = os.path.join(os.path.dirname(quicktok.__file__), "data")
    tables = {}
    for table in _TABLES[scanner]:
        with open(os.path.join(data, table), "rb") as f:
            tables[table] = f.read()
    return tables


def _files(plan: Plan) -> dict[str, bytes]:
    """The files of `plan`'s encoding: its ranks, no special tokens (a u32 count of 0), the scanner, and the
    scanner's class table."""
    scanner = SCANNERS[plan.pat_str]
    return {
        f"{ENCODING}.vocab": _vocab_bytes(with_fillers(plan.ranks)),
        f"{ENCODING}.special": struct.pack("<I", 0),
        f"{ENCODING}.enc": f"scanner={scanner}\n".encode(),
        **_tables(scanner),
    }


def _folder_key(plan: Plan) -> str:
    """What determines the files (the ranks as given, the scanner, its tables, this module's format), hashed without
    making the 1.2 MB `.vocab` (~40 ms): the token lengths, tokens and ids in the dict's own order. The same ranks in
    another order only make another folder."""
    tokens = list(plan.ranks)
    digest = hashlib.sha256(f"{FORMAT} {SCANNERS[plan.pat_str]} {len(tokens)}\n".encode())
    digest.update(array.array("I", map(len, tokens)).tobytes())
    digest.update(b"".join(tokens))
    digest.update(array.array("I", plan.ranks.values()).tobytes())
    for name, data in sorted(_tables(SCANNERS[plan.pat_str]).items()):
        digest.update(f"{name} {len(data)}\n".encode() + data)
    return digest.hexdigest()[:32]


def write_encoding(plan: Plan) -> str:
    """The folder holding `plan`'s encoding as quicktok reads it, written if missing.

    In the cache dir (`default_cache_dir()/quicktok/<_folder_key>`), not a temporary folder, because the engine is
    built again at every start-up and in every worker that gets the tokenizer pickled (`TiktokenEncoder` is pickled
    as its plan): one write of ~1.2 MB per vocabulary and class table, then each start-up only checks that the files
    are there. Each file is written atomically (`atomic_path`), so a folder holds complete files or none of a name,
    and two processes writing the same folder write the same bytes. Where the cache cannot be written, a temporary
    folder (removed by the caller once the engine is loaded: quicktok reads the files into memory).
    """
    folder = os.path.join(default_cache_dir(), "quicktok", _folder_key(plan))
    if _intact(folder):
        return folder
    files = _files(plan)
    try:
        for name, data in files.items():
            with atomic_path(os.path.join(folder, name)) as tmp:
                tmp.write_bytes(data)
        with atomic_path(os.path.join(folder, DIGESTS)) as tmp:  # (last: a folder without it is written again)
            tmp.write_text(json.dumps({name: hashlib.sha256(data).hexdigest() for name, data in files.items()}))
        return folder
    except OSError:  # a read-only home or a full disk
        folder = tempfile.mkdtemp(prefix="olmo-data-quicktok-")
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        return folder


def _intact(folder: str) -> bool:
    """Whether `folder` holds every file its `DIGESTS` names, with those SHA-256s (~2 ms for cl100k's 1.2 MB): a
    damaged or missing file means the folder is written again, never that quicktok loads other ranks than the
    plan's (a cached plan skips the self-check, so nothing later would notice)."""
    try:
        with open(os.path.join(folder, DIGESTS)) as f:
            digests = json.load(f)
        names = {f"{ENCODING}.vocab", f"{ENCODING}.special", f"{ENCODING}.enc"}
        if not isinstance(digests, dict) or not names <= digests.keys():
            return False
        for name, want in digests.items():
            with open(os.path.join(folder, name), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != want:
                    return False
    except (OSError, ValueError):
        return False
    return True


def _load(plan: Plan) -> Any:
    import quicktok

    reason = refusal(plan)
    if reason is not None:
        raise QuicktokRefuses(reason)
    folder = write_encoding(plan)
    try:
        return quicktok.Tokenizer(ENCODING, folder)
    finally:
        if os.path.basename(folder).startswith("olmo-data-quicktok-"):  # the temporary fallback
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


class QuicktokPieces:
    """quicktok's `encode_ordinary` on one text (already cut at added tokens and normalised), and its batch call.

    Holds the GIL while it encodes (measured: two threads are no faster than one), so threads go to `flat`."""

    def __init__(self, plan: Plan) -> None:
        self._tokenizer = _load(plan)
        self._encode: Callable[[str], list[int]] = self._tokenizer.encode_ordinary

    def __call__(self, text: str) -> list[int]:
        try:
            return self._encode(text)
        except TypeError:
            if not isinstance(text, str):
                raise
            return self._encode(without_lone_surrogates(text))

    def flat(self, texts: Sequence[str], threads: int = 1) -> tuple[Any, Any]:
        """(tokens, offsets) of `texts`, each encoded whole: numpy uint32 ids back to back, and int64 offsets (text
        i's ids are tokens[offsets[i]:offsets[i + 1]])."""
        texts = list(texts)
        try:
            return self._tokenizer.encode_batch(texts, threads)
        except TypeError:
            return self._tokenizer.encode_batch([without_lone_surrogates(t) for t in texts], threads)
