"""The BPE engines: quicktok, fastokens and riptoken (optional, the `fast` extra) and tiktoken (a dependency).

The plan engines take the same things, a byte-level rank table and a split regex, and give the ids of rank-ordered
BPE over the regex's pieces; they differ only in speed and in the regexes they run. quicktok (`quicktok_engine`)
runs cl100k's regex only, about 1.9x riptoken's rate text by text on code and 3.3x with its batch call. riptoken
recognises GPT-2's and cl100k's split regexes and runs them without the backtracking regex engine tiktoken uses for
their lookahead: about 1.8x tiktoken's rate on GPT-2 and cl100k, 2x on GPT-NeoX-20B with its space pairs
(`tiktoken_plan.pair_space_runs`), one thread, on code. Which engine a tokenizer gets is decided by the self-check
(`tiktoken_backend`), never assumed: an engine is used only where its ids equalled `tokenizers'` at start-up.
fastokens (`fastokens_engine`) is the one engine not given a `Plan`: it runs the tokenizer.json itself, about 1.8x
riptoken's rate on GPT-NeoX-20B and 2-3x on GPT-2.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any, Literal

from olmo_data.tokenizer.tiktoken_plan import CL100K_PATTERN, GPT2_PATTERN, Plan, unpaired, without_lone_surrogates

Engine = Literal["quicktok", "fastokens", "riptoken", "tiktoken"]
# the order `auto` tries them in: the fastest first
ENGINES: tuple[Engine, ...] = ("quicktok", "fastokens", "riptoken", "tiktoken")
INSTALL_HINT = {
    "quicktok": "pip install 'olmo-data[fast]' (quicktok-v1)",
    "fastokens": "pip install 'olmo-data[fast]' (fastokens)",
    "riptoken": "pip install 'olmo-data[fast]' (riptoken)",
    "tiktoken": "pip install tiktoken",
}
# the distribution an engine is installed from, where its name differs from the module's
DISTRIBUTIONS = {"quicktok": "quicktok_v1"}


def available(engine: Engine) -> bool:
    """Whether `engine` can be imported here (without importing it: start-up time)."""
    return importlib.util.find_spec(engine) is not None


def version(engine: Engine) -> str:
    """The installed version of `engine` (what a cached plan checked on it is valid for)."""
    module = importlib.import_module(engine)
    return str(getattr(module, "__version__", "?"))


def refusal(engine: Engine, plan: Plan) -> str | None:
    """Why `engine` cannot run `plan` at all, known without trying it (quicktok's few split regexes), or None."""
    if engine == "quicktok":
        from olmo_data.tokenizer.quicktok_engine import refusal as quicktok_refusal

        return quicktok_refusal(plan)
    return None


def build_piece_encoder(engine: Engine, name: str, plan: Plan) -> Callable[[str], list[int]]:
    """The function that encodes one text (already cut at added tokens and normalised) on `engine`.

    Added tokens are matched by the encoder (`tiktoken_encoder`), not by the engine (tiktoken does not prefer the
    longest); they are registered with the engine only so that tiktoken's `encode` may run without the GIL.
    Raises what the engine raises on a regex or rank table it refuses (ValueError and the like, or pyo3's
    PanicException, a BaseException). quicktok's encoder also has `flat`, its batch call (`quicktok_engine`).
    """
    if engine == "fastokens":
        raise ValueError("fastokens runs a whole tokenizer.json, not a plan (fastokens_engine.FastokensEncoder)")
    if engine == "quicktok":
        from olmo_data.tokenizer.quicktok_engine import QuicktokPieces

        return QuicktokPieces(plan)
    if engine == "riptoken":
        import riptoken

        core = riptoken.CoreBPE(plan.ranks, {}, plan.pat_str)
        exact = functools.partial(build_piece_encoder, "tiktoken", name, plan)
        # GPT-NeoX's paired regex is GPT-2's with the pairs in front (`pair_space_runs` pairs no other); its guard
        # looks at the text before pairing, where GPT-2's pieces are
        one_class = plan.pat_str in ONE_CLASS_PATTERNS or plan.space_pairs
        return _RiptokenPieces(core.encode_ordinary, exact, one_class)
    import tiktoken

    specials = {**plan.raw_tokens, **plan.normalized_tokens}
    enc = tiktoken.Encoding(name, pat_str=plan.pat_str, mergeable_ranks=plan.ranks, special_tokens=specials)
    if enc.special_tokens_set:
        # `encode_ordinary` holds the GIL; `encode` with nothing allowed gives the same ids and lets threads run
        # in parallel (it needs a special token registered, or it scans every position)
        return functools.partial(enc.encode, allowed_special=frozenset(), disallowed_special=())
    return enc.encode_ordinary


class _RiptokenPieces:
    """riptoken's `encode_ordinary` where it is exact: texts that may hold a piece of 500 bytes or more go to
    tiktoken (made on first need), since riptoken 0.2 encodes such pieces with another merge algorithm whose ids
    differ from rank-ordered BPE's (from exactly 500 bytes on, on every vocabulary tried). Texts with a run of 248
    bytes without whitespace, or of whitespace, are looked at; for GPT-2's, cl100k's and GPT-NeoX's regexes
    (`ONE_CLASS_PATTERNS`) only those with a run of one class of 496 bytes go (a line of 500 "=", not a URL, a base64
    blob or a minified line, which split into short pieces): so the fallback is rarely even made."""

    def __init__(
        self, encode: Callable[[str], list[int]], exact: Callable[[], Callable[[str], list[int]]], one_class: bool
    ) -> None:
        self._encode = encode
        self._make_exact = exact
        self._exact: Callable[[str], list[int]] | None = None
        self._one_class = one_class  # the regex is one of ONE_CLASS_PATTERNS: the finer look applies

    def __call__(self, text: str, unpaired: str | None = None) -> list[int]:
        """`unpaired`: the text before its pairs of spaces became PAIR (`tiktoken_plan.pair_space_runs`), cheaper to
        look at for long pieces (ASCII, where the paired text is not) and as telling: a piece of the paired text
        holds no stand-in character (those pieces are short) and so is a piece of the text before."""
        seen = text if unpaired is None else unpaired
        if (
            len(text) >= _SHORTEST_LONG
            and may_hold_long_piece(seen)
            and (not self._one_class or may_hold_long_one_class_piece(seen))
        ):
            if self._exact is None:
                self._exact = self._make_exact()
            return self._exact(text)
        try:
            return self._encode(text)  # releases the GIL
        except UnicodeEncodeError:  # a lone surrogate
            return self._encode(without_lone_surrogates(text))


# riptoken 0.2 is exact on pieces shorter than this (UTF-8 bytes); the extra pins riptoken<0.3
LONG_PIECE_BYTES = 500
# A piece of the split regexes run here (GPT-2's, cl100k's, the paired GPT-NeoX one) is at most one leading
# character, then a run without whitespace or a run of whitespace, then (cl100k's punctuation) a run of newlines:
# one of its runs has at least (500 - 4) / 2 bytes.
_RUN_BYTES = (LONG_PIECE_BYTES - 4) // 2
_SHORTEST_LONG = _RUN_BYTES // 4  # characters: no text shorter can hold such a run (4 bytes a character at most)
_ASCII_SPACE = {9, 10, 11, 12, 13, 32}  # what the engines' regex `\s` matches in ASCII
# UTF-8 bytes as b" " (whitespace) or b"x": exact for ASCII (other bytes count as not whitespace, which makes runs
# without whitespace longer, never shorter) ...
_NOT_SPACE_RUNS = bytes(32 if b in _ASCII_SPACE else 120 for b in range(256))
# ... and, for runs of whitespace, every byte that may belong to a whitespace character (U+0085, U+00A0, U+1680,
# U+2000..U+205F, U+3000: lead bytes C2, E1, E2, E3 and continuation bytes) as whitespace: runs only longer
_SPACE_RUNS = bytes(
    32 if b in _ASCII_SPACE or b in (0xC2, 0xE1, 0xE2, 0xE3) or 0x80 <= b < 0xC0 else 120 for b in range(256)
)


def may_hold_long_piece(text: str) -> bool:
    """Whether `text` has a run of whitespace, or of anything else, of `_RUN_BYTES` UTF-8 bytes or more (about a
    nanosecond a character: a translation and two substring searches in C; short texts are never looked at)."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) < _RUN_BYTES:
        return False
    classes = data.translate(_NOT_SPACE_RUNS)
    if b"x" * _RUN_BYTES in classes:
        return True
    if text.isascii():
        return b" " * _RUN_BYTES in classes
    return b" " * _RUN_BYTES in data.translate(_SPACE_RUNS)


# The split regexes whose every piece is at most a 4-byte lead, then a run of one class: letters, digits,
# whitespace, or other characters (those last followed by newlines, in cl100k's), as each alternative of theirs
# reads. For them, a piece of 500 bytes needs a run of one class of 496 bytes or more; a long run of mixed
# classes (a URL, a base64 blob, an escaped byte string, a minified line) splits into short pieces.
ONE_CLASS_PATTERNS = (GPT2_PATTERN, CL100K_PATTERN)
_ONE_CLASS_RUN = LONG_PIECE_BYTES - 4


def _one_class_table(members: bytes) -> bytes:
    """UTF-8 bytes as b"x" where they may belong to a run of the class `members` (ASCII bytes), else b" ". Bytes of
    non-ASCII characters, and the ASCII controls other than whitespace, may belong to any class: runs measured so
    are only ever longer than the regex's, whatever its Unicode tables say of a character."""
    wild = {*range(0x80, 0x100), *range(0x00, 0x09), *range(0x0E, 0x20), 0x7F}
    return bytes(120 if b in members or b in wild else 32 for b in range(256))


_ASCII_LETTERS = bytes(range(65, 91)) + bytes(range(97, 123))
_ASCII_DIGITS = bytes(range(48, 58))
_ASCII_OTHER = bytes(b for b in range(0x21, 0x7F) if b not in _ASCII_LETTERS + _ASCII_DIGITS)
_ONE_CLASS_TABLES = tuple(
    _one_class_table(members)
    for members in (_ASCII_LETTERS, _ASCII_DIGITS, bytes(sorted(_ASCII_SPACE)), _ASCII_OTHER + b"\r\n")
)


def may_hold_long_one_class_piece(text: str) -> bool:
    """Whether `text` has a run of one class (`ONE_CLASS_PATTERNS`) of `_ONE_CLASS_RUN` UTF-8 bytes or more: the
    finer look, for texts `may_hold_long_piece` keeps (four translations and searches in C)."""
    data = text.encode("utf-8", "surrogatepass")
    run = b"x" * _ONE_CLASS_RUN
    return any(run in data.translate(table) for table in _ONE_CLASS_TABLES)


def engine_failure(e: BaseException) -> bool:
    """Whether `e` is an engine refusing or failing on its input: any Exception, or pyo3's PanicException (a
    BaseException, raised from Rust on a split regex that can match the empty string)."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def decode_table(plan: Plan) -> dict[int, bytes]:
    """Every id's bytes: the ranks (less the space pairs, which stand for added tokens) and the added tokens."""
    table: dict[int, bytes] = {i: b for b, i in unpaired(plan).ranks.items()}
    for token, tid in (*plan.normalized_tokens.items(), *plan.raw_tokens.items()):
        table[tid] = token.encode("utf-8")
    return table


def decode(table: dict[int, bytes], ids: Any) -> str:
    """Ids to text as tiktoken decodes them (invalid UTF-8 replaced); an unknown id is a KeyError, as there."""
    return b"".join([table[int(i)] for i in ids]).decode("utf-8", errors="replace")
