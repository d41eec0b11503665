"""What a tokenizer.json reduces to for tiktoken (a `Plan`), or why it cannot (`Unsupported`).

Why this can be exact: a byte-level BPE tokenizer is (1) optional Unicode normalisation, (2) splitting out
the added tokens that appear in the text, (3) a split regex, (4) BPE over bytes. tiktoken does (3) and (4) in
Rust; it ranks merges by token id where `tokenizers` ranks them by their place in the merge list, which agree
when the merge results' ids grow with the merge order (true of GPT-2, cl100k and GPT-NeoX-20B, and of every
vocabulary the HF trainer makes). (1) and (2) the encoder (`tiktoken_encoder`) does in Python, the way
`tokenizers` does them. `plan_from_json` accepts only a tokenizer.json with nothing we cannot reproduce.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

# The split regex of the HF ByteLevel pre-tokenizer (use_regex=True), which is GPT-2's.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# cl100k's, as its tokenizer.json (and OLMo 2/3's dolma2) writes it: the engines' guard knows its pieces (`engines`)
CL100K_PATTERN = (
    r"""('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)|[^\r\n\p{L}\p{N}]?\p{L}+|"""
    r"""\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Bytes that occur in valid UTF-8; each needs a one-byte token or tiktoken cannot encode every text.
UTF8_BYTES = [*range(0x00, 0xC0), *range(0xC2, 0xF5)]


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
    # the added tokens are runs of spaces, which the engine sees as pairs (`pair_space_runs`)
    space_pairs: bool = False


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


def plan_from_json(data: dict[str, Any]) -> Plan:
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


# The two characters a pair of spaces becomes in the text the engine sees (`pair_space_runs`): whitespace that
# ends a run of whitespace where a text's end would (see there), then a noncharacter (neither letter, number nor
# whitespace) that no real text should hold; a text that holds either is encoded the slow way.
PAIR = "\u1680\ufdd0"


def pair_space_runs(plan: Plan) -> Plan:
    """Let the engine encode a whole text in one call although it holds added space-run tokens (GPT-NeoX-20B's
    runs of 2..24 spaces: every indented line of code has one), instead of one call per piece between them.

    `tokenizers` cuts the text at each run (leftmost-longest: 24 spaces while 24 are left, then the rest, a lone
    last space staying with what follows) and pre-tokenises the pieces between on their own. Here each pair of
    spaces becomes PAIR (one `str.replace`), so a run of n spaces is n // 2 PAIRs and, when n is odd, one space.
    Alternatives put first in the split regex take 12 PAIRs (24 spaces), else 1..11 PAIRs and an odd space, as
    one piece whose whole-piece rank is the added token's id: the same chunks as leftmost-longest matching. The
    noncharacter is taken out of the punctuation class, so nothing else takes it; GPT-2's regex has no lookbehind,
    so what follows a run splits as a text's start does. What precedes it splits as a text's end does because the
    pair starts with whitespace: `\\s+(?!\\S)` over whitespace before a run stops before that character, as at a
    text's end it takes all (before a non-space character it would leave the last whitespace character out).
    The regex is otherwise GPT-2's, so engines that recognise it (riptoken) keep their fast path, which an earlier
    rewrite of the whitespace alternatives (a lookahead per space) lost. Exact for GPT-2's split regex and space
    runs of 2..K with K even only (others: as is, the encoder cutting at added tokens in Python); the tests compare
    every document of the corpora with `tokenizers`.
    """
    runs = plan.normalized_tokens
    lengths = sorted(len(t) for t in runs)
    if (
        plan.pat_str != GPT2_PATTERN
        or not runs
        or any(set(t) != {" "} for t in runs)
        or lengths != [*range(2, lengths[-1] + 1)]
        or lengths[-1] % 2
        or any(ch.encode() in token for token in plan.ranks for ch in PAIR)
    ):
        return plan
    half = lengths[-1] // 2
    mark = PAIR[1]
    punctuation = r"[^\s\p{L}\p{N}]"
    pat_str = f"(?:{PAIR}){{{half}}}|(?:{PAIR}){{1,{half - 1}}} ?|" + GPT2_PATTERN.replace(
        punctuation, punctuation[:-1] + mark + "]"
    )
    ranks = dict(plan.ranks)
    for j in range(1, half + 1):
        ranks[(PAIR * j).encode()] = runs[" " * (2 * j)]
        if j < half:
            ranks[(PAIR * j + " ").encode()] = runs[" " * (2 * j + 1)]
    return Plan(
        pat_str=pat_str,
        ranks=ranks,
        nfc=plan.nfc,
        raw_tokens=plan.raw_tokens,
        normalized_tokens=runs,
        space_pairs=True,
    )


def unpaired(plan: Plan) -> Plan:
    """The plan `pair_space_runs` was given: for the rare text that holds a character of PAIR itself, which is
    then cut at the added tokens in Python and encoded piece by piece with GPT-2's own regex."""
    if not plan.space_pairs:
        return plan
    mark = PAIR[1].encode()
    return Plan(
        pat_str=GPT2_PATTERN,
        ranks={b: i for b, i in plan.ranks.items() if mark not in b},
        nfc=plan.nfc,
        raw_tokens=plan.raw_tokens,
        normalized_tokens=plan.normalized_tokens,
    )


def without_lone_surrogates(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD, which is what tiktoken encodes for one: an engine that refuses
    such a str (riptoken: UnicodeEncodeError, quicktok: TypeError) is given this, so every engine gives the same ids
    on any str (no reader of this project lets one through)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
