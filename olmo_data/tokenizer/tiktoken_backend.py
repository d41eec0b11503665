"""The engine backends (quicktok, fastokens, riptoken, tiktoken): the same ids as HF `tokenizers` for byte-level BPE
vocabularies, several times faster.

A tokenizer.json is reduced to a `Plan` (`tiktoken_plan`, which says why this can be exact and refuses what
cannot be reproduced), run by a `TiktokenEncoder` (`tiktoken_encoder`) on an engine (`engines`), and even then a
start-up self-check here compares it with `tokenizers` on probe strings; `auto` takes the fastest installed engine
that passes, else `tokenizers`; `--backend quicktok`, `riptoken` or `tiktoken` insists on that engine (a difference
is an error). A plan that passed is cached (`tiktoken_cache`). A `.tiktoken` ranks file (with its JSON sidecar) loads
here too, with tiktoken as its reference.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import os
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

from olmo_data.errors import DataError
from olmo_data.tokenizer.base import BOS_CANDIDATES, EOS_CANDIDATES, PAD_CANDIDATES, Tokenizer
from olmo_data.tokenizer.engines import ENGINES, INSTALL_HINT, Engine, available, describe, engine_failure, refusal
from olmo_data.tokenizer.fastokens_engine import FastokensEncoder
from olmo_data.tokenizer.fastokens_engine import refusal as fastokens_refusal
from olmo_data.tokenizer.hf import ignored_settings
from olmo_data.tokenizer.tiktoken_cache import save_checked
from olmo_data.tokenizer.tiktoken_encoder import DEFAULT_NUM_THREADS, TiktokenEncoder
from olmo_data.tokenizer.tiktoken_plan import UTF8_BYTES, Plan, Unsupported, pair_space_runs, plan_from_json

log = logging.getLogger(__name__)


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
        (
            "whitespace before added tokens",
            "x\n\n    y\n \n    z\t\t  w\r\n\r\n        v \n\n\n  \n    \n" + " " * 25 + "\n\n" + " " * 49 + "u",
        ),
        ("space pair characters in text", "a\ufdd0  b \u1680  c\u1680\u1680\n\n  d\ufdef\ufdd0 e \u1680\ufdd0  f"),
        # pieces around 500 bytes, where riptoken 0.2 changes merge algorithm (`engines.LONG_PIECE_BYTES`)
        (
            "long pieces",
            " ".join(["a" * 499, "b" * 500, "c" * 501, "日" * 170, "!" * 600, " " * 520 + "\n" * 520]),
        ),
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


def self_check(encoder: Callable[[Sequence[str]], list[list[int]]], reference: Any, plan: Plan) -> str | None:
    """The label of the first probe where `encoder` and the reference differ, or None when all agree.

    `reference` is the HF tokenizer, or (for a `.tiktoken` file, which has none) another encoder."""
    probes = _probes(plan)
    texts = [t for _, t in probes]
    if hasattr(reference, "encode_batch_fast"):
        theirs = [e.ids for e in reference.encode_batch_fast(texts, add_special_tokens=False)]
    else:
        theirs = reference(texts)
    for (label, text), expected in zip(probes, theirs, strict=True):
        try:
            ours = encoder([text])[0]
        except BaseException as e:
            if not engine_failure(e):
                raise
            return f"{label} ({getattr(encoder, 'engine', 'the engine')} failed: {describe(e)})"
        if ours != expected:
            return label
    flat = getattr(encoder, "flat", None)  # the engine's batch call, where it has one: the tokenize stage's path
    got = flat(texts) if flat is not None else None
    if got is not None:
        tokens, offsets = got
        for i, ((label, _), expected) in enumerate(zip(probes, theirs, strict=True)):
            if tokens[offsets[i] : offsets[i + 1]].tolist() != expected:
                return f"{label} (in a batch)"
    return None


def _engine_plan(plan: Plan) -> Plan:
    """The plan an engine runs: added space runs as pairs where that is exact (one engine call a text)."""
    return pair_space_runs(plan)


def _candidates(engine: Engine | None) -> list[Engine]:
    """The engines to try: the one asked for, or (auto) every installed one, fastest first."""
    if engine is not None:
        return [engine]
    return [e for e in ENGINES if available(e)]


def try_tiktoken(
    tok: Tokenizer,
    strict: bool = False,
    num_threads: int = DEFAULT_NUM_THREADS,
    json_text: str | None = None,
    engine: Engine | None = None,
) -> Tokenizer | None:
    """An engine-backed copy of the HF tokenizer `tok` (quicktok, fastokens, riptoken or tiktoken, `engines`), or None
    (auto) / DataError (strict) where no engine reproduces it exactly.

    `engine` None tries each installed engine, fastest first, and takes the first whose self-check passes;
    `engine` given tries that one only (strict: its failure is an error). `json_text` is the tokenizer.json the HF
    tokenizer was loaded from, when the caller has it: serialising the HF tokenizer again costs a noticeable part of
    start-up for large vocabularies.
    """
    label = engine or "tiktoken"

    def refuse(reason: str) -> None:
        if strict:
            raise DataError(
                f"{tok.name}: the {label} backend cannot reproduce this tokenizer: {reason}; "
                "use --backend hf (or auto, which falls back by itself)"
            )
        log.debug("%s: not using %s: %s", tok.name, label, reason)

    if engine is not None and not available(engine):
        refuse(f"{engine} is not installed ({INSTALL_HINT[engine]})")
        return None
    candidates = _candidates(engine)
    if not candidates:
        refuse("no BPE engine is installed (quicktok, fastokens, riptoken or tiktoken)")
        return None
    text = json_text if json_text is not None else tok.hf.to_str()
    data = json.loads(text)
    try:
        plan = plan_from_json(data)
    except Unsupported as e:
        refuse(str(e))
        return None
    fast = _engine_plan(plan)
    failed: list[str] = []
    for name in candidates:
        # (fastokens' rule reads the tokenizer.json, which `engines.refusal` does not have: its module imports the
        # encoder's, which imports `engines`)
        why = fastokens_refusal(data) if name == "fastokens" else refusal(name, fast)
        if why is not None:  # an engine that cannot run this plan at all (quicktok on GPT-2's regex): no warning
            refuse(why)
            log.debug("%s: not using %s: %s", tok.name, name, why)
            continue
        try:
            encoder = _encoder(name, tok.name, fast, text, num_threads)
        except BaseException as e:  # a regex or vocabulary the engine rejects, or panics on (from Rust)
            if not engine_failure(e):
                raise
            if strict:
                refuse(f"{name} rejected it ({describe(e)})")
            failed.append(f"{name} rejected it ({describe(e)})")
            continue
        differs = self_check(encoder, tok.hf, plan)
        if differs is None:
            checked = _engine_tokenizer(tok, name, encoder)
            if json_text is not None:  # loaded from a file: later loads of the same bytes can skip the work above
                ignored = ignored_settings(data.get("truncation"), data.get("padding"))
                save_checked(checked, fast, tried_before=candidates[: candidates.index(name)], ignored=ignored)
            if failed:
                log.warning("%s: %s; using %s", tok.name, "; ".join(failed), name)
            return checked
        if strict:
            raise DataError(
                f"{tok.name}: {name} and tokenizers give different ids on the self-check probe {differs!r}; "
                "use --backend hf or auto"
            )
        failed.append(f"{name} self-check differs from tokenizers on probe {differs!r}")
    if any("self-check" in f for f in failed):
        log.warning("%s: %s; using the hf backend", tok.name, "; ".join(failed))
    else:
        log.debug("%s: not using an engine: %s", tok.name, "; ".join(failed))
    return None


def _encoder(
    engine: Engine, name: str, plan: Plan, json_text: str, num_threads: int
) -> TiktokenEncoder | FastokensEncoder:
    """The batch encoder on `engine`: fastokens is given the tokenizer.json (loaded here, so that a file it refuses
    fails here), the others the engine plan."""
    if engine == "fastokens":
        encoder = FastokensEncoder(name, json_text, num_threads)
        encoder.ready()
        return encoder
    return TiktokenEncoder(engine, name, plan, num_threads)


def _engine_tokenizer(tok: Tokenizer, engine: Engine, encoder: TiktokenEncoder | FastokensEncoder) -> Tokenizer:
    return Tokenizer(
        name=tok.name,
        sha256=tok.sha256,
        vocab_size=tok.vocab_size,
        backend=engine,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
        hf=tok.hf,
        _encode_batch=encoder,
    )


def _read_ranks(path: str, data: bytes) -> dict[bytes, int]:
    """The ranks of a `.tiktoken` file, refusing a rank given to two tokens by line (tiktoken panics on it)."""
    ranks: dict[bytes, int] = {}
    lines: dict[int, int] = {}  # rank -> the line that gave it
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError("expected two fields")
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except ValueError as e:
            raise DataError(f"{path}:{n}: expected 'BASE64_TOKEN RANK' ({e})") from None
        if rank in lines:
            raise DataError(
                f"{path}:{n}: rank {rank} is given to two tokens (line {lines[rank]} too); each rank must name one "
                "token"
            )
        ranks[token], lines[rank] = rank, n
    if not ranks:
        raise DataError(f"{path}: no ranks in file; expected lines 'BASE64_TOKEN RANK'")
    return ranks


def load_tiktoken_file(path: str, num_threads: int = DEFAULT_NUM_THREADS, engine: Engine | None = None) -> Tokenizer:
    """A `.tiktoken` ranks file plus its `<path>.json` sidecar (`pat_str`, `special_tokens`) as a Tokenizer.

    The ranks file alone does not say how text is split or which special tokens exist: a sidecar is required.
    Special tokens found in the text become their ids, as `tokenizers` does with a tokenizer.json. tiktoken is the
    reference here (there is no HF tokenizer to check against); quicktok or riptoken, the fastest installed (`engine`
    None) or the one asked for, is used when its ids equal tiktoken's on the self-check probes.
    """
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
        encoder = TiktokenEncoder("tiktoken", name, plan, num_threads)
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{sidecar}: tiktoken rejected ranks or pat_str ({describe(e)})") from None
    try:
        encoder(["Hello,  world! It's 2024.\n\tcafé 😀"])
    except BaseException as e:
        if not engine_failure(e):
            raise
        raise DataError(
            f"{sidecar}: tiktoken fails on a test string with this pat_str ({describe(e)}); "
            "the pattern must not match the empty string"
        ) from None
    chosen: Engine = "tiktoken"
    if engine == "fastokens":
        raise DataError(f"{path}: fastokens runs a tokenizer.json, not a .tiktoken ranks file; use auto or tiktoken")
    if engine is None:  # auto: the fastest installed plan engine whose ids equal tiktoken's
        faster_ones = [e for e in ENGINES if e not in ("tiktoken", "fastokens") and available(e)]
    else:
        faster_ones = [] if engine == "tiktoken" else [engine]
    for candidate in faster_ones:
        faster = _faster_like(candidate, encoder, name, plan, num_threads, strict=engine is not None, where=path)
        if faster is not None:
            encoder, chosen = faster, candidate
            break

    def find(candidates: Sequence[str]) -> int | None:
        return next((specials[c] for c in candidates if c in specials), None)

    return Tokenizer(
        name=name,
        # the identity covers the split regex and special tokens too: changing either changes the ids
        sha256=hashlib.sha256(data + json.dumps(meta, sort_keys=True).encode()).hexdigest(),
        vocab_size=1 + max(itertools.chain(ranks.values(), specials.values())),
        backend=chosen,
        eos_token_id=find(EOS_CANDIDATES),
        bos_token_id=find(BOS_CANDIDATES),
        pad_token_id=find(PAD_CANDIDATES),
        hf=None,
        _encode_batch=encoder,
        _decode=encoder.decode,
    )


def _faster_like(
    engine: Engine, reference: TiktokenEncoder, name: str, plan: Plan, num_threads: int, strict: bool, where: str
) -> TiktokenEncoder | None:
    """`engine` (quicktok or riptoken) on a `.tiktoken` file's plan, where its ids equal tiktoken's on the probes
    (else None, or DataError when `strict`: the engine was asked for by name)."""
    if not available(engine):
        raise DataError(f"{where}: --backend {engine}, but {engine} is not installed ({INSTALL_HINT[engine]})")
    why = refusal(engine, plan)
    if why is not None:
        if strict:
            raise DataError(f"{where}: the {engine} backend cannot run this tokenizer: {why}; use auto or tiktoken")
        log.debug("%s: not using %s: %s", name, engine, why)
        return None
    try:
        encoder = TiktokenEncoder(engine, name, plan, num_threads)
        differs = self_check(encoder, reference, plan)
    except BaseException as e:
        if not engine_failure(e):
            raise
        differs = f"{engine} failed: {describe(e)}"
    if differs is None:
        return encoder
    if strict:
        raise DataError(f"{where}: {engine} and tiktoken give different ids on the self-check probe {differs!r}")
    log.warning("%s: %s self-check differs from tiktoken on probe %r; using tiktoken", name, engine, differs)
    return None
