"""tiktoken backend: the same ids as HF `tokenizers` for byte-level BPE vocabularies, several times faster.

Why this can be exact: a byte-level BPE tokenizer is (1) optional Unicode normalisation, (2) splitting out
the added tokens that appear in the text, (3) a split regex, (4) BPE over bytes. tiktoken does (3) and (4) in
Rust; it ranks merges by token id where `tokenizers` ranks them by their place in the merge list, which agree
when the merge results' ids grow with the merge order (true of GPT-2, cl100k and GPT-NeoX-20B, and of every
vocabulary the HF trainer makes). (1) and (2) we do here in Python, the way `tokenizers` does them: added
tokens whose `normalized` flag is false are matched in the raw text, the rest is normalised and then the
normalised added tokens are matched in it, both leftmost-longest. tiktoken's own special-token matching is
not used, because it does not prefer the longest token (which matters for GPT-NeoX-20B's added space runs).

We only build the equivalent when the tokenizer.json has nothing we cannot reproduce (see `_plan_from_json`),
and even then a start-up self-check compares both backends on probe strings; any difference falls back to
`tokenizers` (`auto`) or is an error (`--backend tiktoken`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from olmo_data.errors import DataError

if TYPE_CHECKING:
    import tiktoken

    from olmo_data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# The split regex of the HF ByteLevel pre-tokenizer (use_regex=True), which is GPT-2's.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Bytes that occur in valid UTF-8; each needs a one-byte token or tiktoken cannot encode every text.
UTF8_BYTES = [*range(0x00, 0xC0), *range(0xC2, 0xF5)]

# The tokenize stage runs one process per core, so one thread each; more are for single-process callers.
DEFAULT_NUM_THREADS = 1


class Unsupported(Exception):
    """The tokenizer has something tiktoken cannot reproduce exactly; the message says what."""


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map that byte-level BPE vocabularies are written in.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) move to 256 + n in order.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@dataclass
class Plan:
    """What a tokenizer.json reduces to for tiktoken: ranks, split regex, normalisation and added tokens."""

    pat_str: str
    ranks: dict[bytes, int]
    nfc: bool = False
    raw_tokens: dict[str, int] = field(default_factory=dict)  # added tokens matched before normalisation
    normalized_tokens: dict[str, int] = field(default_factory=dict)  # matched in the normalised text


def _pattern_of(pre: dict[str, Any] | None) -> str:
    """The split regex of a byte-level pre-tokenizer, or Unsupported."""
    if pre is None:
        raise Unsupported("it has no pre-tokenizer (not byte-level BPE)")
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space"):
            raise Unsupported("its ByteLevel pre-tokenizer adds a prefix space")
        if not pre.get("use_regex", True):
            raise Unsupported("its ByteLevel pre-tokenizer does not split (use_regex false)")
        return GPT2_PATTERN
    if kind == "Sequence":
        steps = pre.get("pretokenizers") or []
        if len(steps) == 1:
            return _pattern_of(steps[0])
        if len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel":
            split, level = steps
            pattern = split.get("pattern") or {}
            if "Regex" not in pattern:
                raise Unsupported("its Split pre-tokenizer splits on a string, not a regex")
            if split.get("behavior") != "Isolated" or split.get("invert"):
                raise Unsupported(f"its Split pre-tokenizer has behavior {split.get('behavior')!r}, not Isolated")
            if level.get("add_prefix_space") or level.get("use_regex", True):
                raise Unsupported("its ByteLevel step after Split adds a prefix space or splits again")
            return str(pattern["Regex"])
        raise Unsupported(f"its pre-tokenizer sequence {[s.get('type') for s in steps]} is not Split + ByteLevel")
    raise Unsupported(f"its pre-tokenizer is {kind}, not ByteLevel")


def _uses_nfc(norm: dict[str, Any] | None) -> bool:
    if norm is None:
        return False
    kind = norm.get("type")
    if kind == "NFC":
        return True
    if kind == "Sequence":
        return any([_uses_nfc(n) for n in norm.get("normalizers") or []])
    raise Unsupported(f"its normaliser {kind} is not supported (only none or NFC)")


def _plan_from_json(data: dict[str, Any]) -> Plan:
    """Check a tokenizer.json structure for exact tiktoken equivalence and extract what tiktoken needs."""
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise Unsupported(f"its model is {model.get('type')}, not BPE")
    if model.get("dropout"):
        raise Unsupported("its BPE model uses dropout")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise Unsupported("its BPE model uses a subword prefix or word suffix")
    if model.get("byte_fallback"):
        raise Unsupported("its BPE model uses byte fallback (not byte-level)")
    pat_str = _pattern_of(data.get("pre_tokenizer"))
    nfc = _uses_nfc(data.get("normalizer"))

    plan = Plan(pat_str=pat_str, ranks={}, nfc=nfc)
    added_ids = set()
    for added in data.get("added_tokens") or []:
        content, tid = added["content"], int(added["id"])
        for flag in ("lstrip", "rstrip", "single_word"):
            if added.get(flag):
                raise Unsupported(f"its added token {content!r} has {flag} set")
        if added.get("normalized", not added.get("special", False)):
            plan.normalized_tokens[unicodedata.normalize("NFC", content) if nfc else content] = tid
        else:
            plan.raw_tokens[content] = tid
        added_ids.add(tid)

    alphabet = byte_level_alphabet()
    to_latin1 = str.maketrans({ch: chr(b) for b, ch in alphabet.items()})  # then .encode("latin-1") = bytes
    foreign = re.compile(f"[^{re.escape(''.join(alphabet.values()))}]")
    vocab: dict[str, int] = model.get("vocab") or {}
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges") or []]
    # Without ignore_merges, `tokenizers` only ever produces single bytes and merge results; a vocabulary
    # entry that no merge makes is unreachable there, so it must be unreachable for tiktoken too.
    reachable = None if model.get("ignore_merges") else {a + b for a, b in merges}
    for token, tid in vocab.items():
        if tid in added_ids or foreign.search(token):
            continue
        if reachable is not None and len(token) > 1 and token not in reachable:
            continue
        plan.ranks[token.translate(to_latin1).encode("latin-1")] = int(tid)
    for b in UTF8_BYTES:
        if bytes([b]) not in plan.ranks:
            raise Unsupported(f"byte 0x{b:02x} has no token of its own")
    last = -1
    for n, (left, right) in enumerate(merges):
        merged = vocab.get(left + right)
        if merged is None or merged in added_ids:
            raise Unsupported(f"merge {n} ({left} {right}) gives a token that is not in the BPE vocabulary")
        if merged < last:
            raise Unsupported(f"merge {n} ({left} {right}) gives id {merged}, lower than an earlier merge's id {last}")
        last = merged
    return plan


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


# GPT-2's whitespace alternatives, rewritten never to take two spaces in a row (see `fold_space_runs`).
_WS_NO_SPACE_RUN = r"(?:[^\S ]| (?! ))+"


def fold_space_runs(plan: Plan) -> Plan:
    """Let tiktoken's regex split out added space-run tokens (GPT-NeoX-20B's 2..24 spaces) instead of Python.

    Exact for GPT-2's split regex only: there, whitespace is taken by the two last alternatives and as one
    leading space by the others. With ` {2,K}` tried first and the whitespace alternatives kept off runs of
    two spaces, the text splits exactly where `tokenizers` splits out the added tokens (leftmost-longest), and
    no other piece holds two spaces in a row, so the base vocabulary's space-run entries are unreachable, as
    they are in `tokenizers`; the runs' bytes get the added ids instead. The equivalence tests check it on
    real text; it is about 1.5x faster than splitting in Python on code (full of indentation). Others: as is.
    """
    runs = plan.normalized_tokens
    lengths = sorted(len(t) for t in runs)
    if (
        plan.pat_str != GPT2_PATTERN
        or not runs
        or any(set(t) != {" "} for t in runs)
        or lengths != [*range(2, lengths[-1] + 1)]
    ):
        return plan
    tail = r"\s+(?!\S)|\s+"
    pat_str = f" {{2,{lengths[-1]}}}|" + GPT2_PATTERN.replace(tail, f"{_WS_NO_SPACE_RUN}(?!\\S)|{_WS_NO_SPACE_RUN}")
    ranks = {b: i for b, i in plan.ranks.items() if b"  " not in b}
    ranks.update({t.encode(): i for t, i in runs.items()})
    return Plan(pat_str=pat_str, ranks=ranks, nfc=plan.nfc, raw_tokens=plan.raw_tokens)


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


def _probes(plan: Plan) -> list[tuple[str, str]]:
    """(label, text) pairs where a wrong split regex, normalisation or added-token rule would show."""
    added = sorted({*plan.raw_tokens, *plan.normalized_tokens}, key=lambda t: (-len(t), t))[:40]
    specials = "".join(f"x{t}y {t}{t}\n{t} " for t in added)
    spaces = "".join(f"a{' ' * n}b\n{' ' * n}c{' ' * n}\n" for n in range(1, 60))
    probes = [
        ("contractions", "It's I'm we'll you're they've he'd IT'S WE'LL YOU'RE I'D 's 't 're 'S 'T"),
        ("numbers", "1 12 123 1234 12345 3.14159 1,000,000 0x1F 2024-01-02 ٣٤٥ ⅷ ½ 10^9"),
        (
            "whitespace",
            "a  b   c    d\t\te\n\nf \n g\r\n h      \n\n\n    i \u00a0j\u2003k\u3000l\x0bm\x0c  ",
        ),
        ("space runs", spaces),
        ("leading and trailing space", "   start and end   "),
        ("code", "def f(x):\n    if x:  # note\n        return {'a': [1, 2.5e-3, None]}\n\treturn x<<2\n"),
        ("markup", '<div class="x">y</div> https://example.com/a?b=c&d=e#f `code` **bold** $x^2$'),
        ("unicode", "naïve café Ünïcödé — “quotes” … 日本語のテキスト 中文 한국어 Русский العربية עברית ไทย"),
        (
            "NFD",
            unicodedata.normalize("NFD", "café résumé naïve Ångström Ελληνικά ḱṷṓn") + " a\u0301 o\u0308",
        ),
        ("emoji", "👍🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️ 😀😀😀 ☃ \U0001f9ea"),
        ("controls", "\x00\x01\x1b[31m red\x7f \ufeffbom \u200bzw\u200d"),
        ("special tokens in text", specials or "no added tokens"),
        ("long word", "a" * 300 + " " + "ab" * 200 + " " + "😀" * 50),
        ("empty", ""),
    ]
    # A sample of the vocabulary itself, one token a line: where rank order and merge order disagree, the
    # pieces that show it are mostly vocabulary entries.
    tokens = [t for t, _ in sorted(plan.ranks.items(), key=lambda kv: kv[1]) if len(t) > 1]
    words = []
    for t in tokens[:: max(1, len(tokens) // 5000)]:
        try:
            words.append(t.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    probes.append(("vocabulary sample", "\n".join(words)))
    return probes


def _rebuild_encoder(name: str, plan: Plan, num_threads: int) -> TiktokenEncoder:
    return TiktokenEncoder(build_encoding(name, plan), plan, num_threads)


def _tiktoken_failure(e: BaseException) -> bool:
    # A split regex that can match the empty string makes tiktoken panic, and pyo3's PanicException is a
    # BaseException; we turn it into a fallback (or a DataError) like any other failure.
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def self_check(encoder: Callable[[Sequence[str]], list[list[int]]], hf: Any, plan: Plan) -> str | None:
    """The label of the first probe where `encoder` and `tokenizers` differ, or None when all agree."""
    probes = _probes(plan)
    theirs = hf.encode_batch_fast([t for _, t in probes], add_special_tokens=False)
    for (label, text), expected in zip(probes, theirs, strict=True):
        try:
            ours = encoder([text])[0]
        except BaseException as e:
            if not _tiktoken_failure(e):
                raise
            return f"{label} (tiktoken failed: {type(e).__name__}: {e})"
        if ours != expected.ids:
            return label
    return None


def build_encoding(name: str, plan: Plan) -> tiktoken.Encoding:
    import tiktoken

    # tiktoken keeps special tokens for decoding only here: `TiktokenEncoder` matches them itself.
    specials = {**plan.raw_tokens, **plan.normalized_tokens}
    return tiktoken.Encoding(name, pat_str=plan.pat_str, mergeable_ranks=plan.ranks, special_tokens=specials)


def try_tiktoken(
    tok: Tokenizer, strict: bool = False, num_threads: int = DEFAULT_NUM_THREADS, json_text: str | None = None
) -> Tokenizer | None:
    """A tiktoken-backed copy of the HF tokenizer `tok`, or None (auto) / DataError (strict) if not exact.

    `json_text` is the tokenizer.json the HF tokenizer was loaded from, when the caller has it: serialising the HF
    tokenizer again costs a noticeable part of start-up for large vocabularies.
    """
    from olmo_data.tokenizer import Tokenizer

    def refuse(reason: str) -> None:
        if strict:
            raise DataError(
                f"{tok.name}: the tiktoken backend cannot reproduce this tokenizer: {reason}; "
                "use --backend hf (or auto, which falls back by itself)"
            )
        log.debug("%s: not using tiktoken: %s", tok.name, reason)

    try:
        import tiktoken  # noqa: F401
    except ImportError:
        refuse("tiktoken is not installed")
        return None
    try:
        plan = _plan_from_json(json.loads(json_text if json_text is not None else tok.hf.to_str()))
        fast = fold_space_runs(plan)
        encoder = TiktokenEncoder(build_encoding(tok.name, fast), fast, num_threads)
    except Unsupported as e:
        refuse(str(e))
        return None
    except (ValueError, KeyError, TypeError) as e:  # a regex or vocabulary tiktoken rejects
        refuse(f"tiktoken rejected it ({type(e).__name__}: {e})")
        return None
    differs = self_check(encoder, tok.hf, plan)
    if differs is not None:
        if strict:
            raise DataError(
                f"{tok.name}: tiktoken and tokenizers give different ids on the self-check probe "
                f"{differs!r}; use --backend hf or auto"
            )
        log.warning(
            "%s: tiktoken self-check differs from tokenizers on probe %r; using the hf backend",
            tok.name,
            differs,
        )
        return None
    checked = Tokenizer(
        name=tok.name,
        sha256=tok.sha256,
        vocab_size=tok.vocab_size,
        backend="tiktoken",
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
        hf=tok.hf,
        _encode_batch=encoder,
    )
    if json_text is not None:  # loaded from a file: later loads of the same bytes can skip the work above
        save_checked(checked, fast)
    return checked


def _read_ranks(path: str, data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError("expected two fields")
            ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
        except ValueError as e:
            raise DataError(f"{path}:{n}: expected 'BASE64_TOKEN RANK' ({e})") from None
    if not ranks:
        raise DataError(f"{path}: no ranks in file; expected lines 'BASE64_TOKEN RANK'")
    return ranks


def load_tiktoken_file(path: str, num_threads: int = DEFAULT_NUM_THREADS) -> Tokenizer:
    """A `.tiktoken` ranks file plus its `<path>.json` sidecar (`pat_str`, `special_tokens`) as a Tokenizer.

    The ranks file alone does not say how text is split or which special tokens exist: a sidecar is required.
    Special tokens found in the text become their ids, as `tokenizers` does with a tokenizer.json.
    """
    from olmo_data.tokenizer import BOS_CANDIDATES, EOS_CANDIDATES, PAD_CANDIDATES, Tokenizer

    sidecar = path + ".json"
    if not os.path.isfile(path):
        raise DataError(f"{path}: tiktoken ranks file not found")
    if not os.path.isfile(sidecar):
        raise DataError(
            f"{path}: a .tiktoken ranks file needs a sidecar {sidecar} holding the split regex and the "
            'special tokens, e.g. {"pat_str": "...", "special_tokens": {"<|endoftext|>": 100257}}'
        )
    with open(path, "rb") as f:
        data = f.read()
    ranks = _read_ranks(path, data)
    missing = [b for b in UTF8_BYTES if bytes([b]) not in ranks]
    if missing:
        raise DataError(f"{path}: byte 0x{missing[0]:02x} has no rank; every single byte needs one")
    try:
        with open(sidecar, encoding="utf-8") as side:
            meta = json.load(side)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{sidecar}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("pat_str"), str):
        raise DataError(f"{sidecar}: expected an object with a string 'pat_str' (the split regex)")
    specials = meta.get("special_tokens", {})
    if not isinstance(specials, dict) or not all(isinstance(v, int) for v in specials.values()):
        raise DataError(f"{sidecar}: 'special_tokens' must map token strings to integer ids")
    plan = Plan(pat_str=meta["pat_str"], ranks=ranks, raw_tokens=dict(specials))
    name = os.path.basename(path)
    try:
        enc = build_encoding(name, plan)
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{sidecar}: tiktoken rejected ranks or pat_str ({type(e).__name__}: {e})") from None
    encoder = TiktokenEncoder(enc, plan, num_threads)
    try:
        encoder(["Hello,  world! It's 2024.\n\tcafé 😀"])
    except BaseException as e:
        if not _tiktoken_failure(e):
            raise
        raise DataError(
            f"{sidecar}: tiktoken fails on a test string with this pat_str ({type(e).__name__}: {e}); "
            "the pattern must not match the empty string"
        ) from None

    def find(candidates: Sequence[str]) -> int | None:
        return next((specials[c] for c in candidates if c in specials), None)

    return Tokenizer(
        name=name,
        # the identity covers the split regex and special tokens too: changing either changes the ids
        sha256=hashlib.sha256(data + json.dumps(meta, sort_keys=True).encode()).hexdigest(),
        vocab_size=enc.max_token_value + 1,
        backend="tiktoken",
        eos_token_id=find(EOS_CANDIDATES),
        bos_token_id=find(BOS_CANDIDATES),
        pad_token_id=find(PAD_CANDIDATES),
        hf=None,
        _encode_batch=encoder,
        _decode=encoder.decode,
    )


__all__ = ["TiktokenEncoder", "Unsupported", "load_tiktoken_file", "try_tiktoken"]


# ----------------------------------------------------------------------------------------------------------------
# A cache of checked tiktoken plans. Building the plan from a large tokenizer.json and loading the HF tokenizer
# for the self-check take most of a second (cl100k); both are deterministic given the file's bytes and the
# library versions, so once a plan has passed the self-check it is stored under the file's SHA-256 and later
# loads skip both. The cache holds plain numpy arrays and JSON (no pickle): a damaged or foreign file is ignored.

CACHE_FORMAT = 1


def _cache_file(sha256: str) -> str:
    from olmo_data.io import default_cache_dir

    return os.path.join(default_cache_dir(), "tiktoken", f"{sha256}.npz")


def _cache_versions() -> dict[str, str]:
    import tiktoken
    import tokenizers

    from olmo_data import __version__

    with open(__file__, "rb") as f:  # a change to this module's code invalidates every cached plan
        code = hashlib.sha256(f.read()).hexdigest()
    return {
        "format": str(CACHE_FORMAT),
        "code": code,
        "olmo_data": __version__,
        "tiktoken": tiktoken.__version__,
        "tokenizers": tokenizers.__version__,
    }


def save_checked(tok: Tokenizer, plan: Plan) -> None:
    """Store a self-checked plan (and the tokenizer's identity and special ids) for `load_checked`."""
    import numpy as np

    from olmo_data.io import atomic_path

    items = sorted(plan.ranks.items(), key=lambda kv: kv[1])
    meta = {
        "versions": _cache_versions(),
        "name": tok.name,
        "sha256": tok.sha256,
        "vocab_size": tok.vocab_size,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
        "pad_token_id": tok.pad_token_id,
        "pat_str": plan.pat_str,
        "nfc": plan.nfc,
        "raw_tokens": plan.raw_tokens,
        "normalized_tokens": plan.normalized_tokens,
    }
    path = _cache_file(tok.sha256)
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                blob=np.frombuffer(b"".join(k for k, _ in items), dtype=np.uint8),
                lengths=np.array([len(k) for k, _ in items], dtype=np.int64),
                ids=np.array([v for _, v in items], dtype=np.int64),
            )
    except OSError as e:  # a read-only home or a full disk only costs speed
        log.debug("could not cache the tiktoken plan at %s: %s", path, e)


def load_checked(sha256: str, name: str, num_threads: int = DEFAULT_NUM_THREADS) -> Tokenizer | None:
    """The tiktoken-backed tokenizer stored by `save_checked` for this file hash (named `name`), or None."""
    import numpy as np

    from olmo_data.tokenizer import Tokenizer

    path = _cache_file(sha256)
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes())
            blob, lengths, ids = z["blob"].tobytes(), z["lengths"].tolist(), z["ids"].tolist()
        if meta.get("versions") != _cache_versions() or meta.get("sha256") != sha256:
            return None
        ends = itertools.accumulate(lengths)
        starts = itertools.chain([0], itertools.accumulate(lengths))
        ranks = {blob[a:b]: i for a, b, i in zip(starts, ends, ids, strict=False)}
        plan = Plan(
            pat_str=meta["pat_str"],
            ranks=ranks,
            nfc=bool(meta["nfc"]),
            raw_tokens={k: int(v) for k, v in meta["raw_tokens"].items()},
            normalized_tokens={k: int(v) for k, v in meta["normalized_tokens"].items()},
        )
        encoder = TiktokenEncoder(build_encoding(name, plan), plan, num_threads)
    except Exception as e:  # damaged, truncated or foreign: rebuild from the tokenizer.json
        log.debug("ignoring the tiktoken cache %s: %s", path, e)
        return None
    return Tokenizer(
        name=name,
        sha256=sha256,
        vocab_size=int(meta["vocab_size"]),
        backend="tiktoken",
        eos_token_id=meta["eos_token_id"],
        bos_token_id=meta["bos_token_id"],
        pad_token_id=meta["pad_token_id"],
        hf=None,
        _encode_batch=encoder,
        _decode=encoder.decode,
    )
