"""The engine backends (fastokens, riptoken, tiktoken; quicktok has test_quicktok_engine) give the ids of HF
`tokenizers`, document by document, or are not used.

Each real tokenizer is run through every backend on real text (the stdlib demo corpus, cut several ways) and
on strings written to hit the places where they could part: space runs, tabs, newlines, Unicode, NFD text,
emoji, code, special tokens inside the text, and the characters the engines' text stands in for space runs with.
riptoken and fastokens are an optional extra: their cases are skipped where they are not installed.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import pickle
import random
import shutil
import unicodedata
from pathlib import Path

import pytest

from olmo_data.documents import read_documents
from olmo_data.errors import DataError
from olmo_data.tokenizer import Tokenizer, load_tokenizer
from olmo_data.tokenizer.engines import available
from olmo_data.tokenizer.tiktoken_backend import load_tiktoken_file, try_tiktoken
from olmo_data.tokenizer.tiktoken_plan import byte_level_alphabet
from tests.conftest import SHARED_TOKENIZERS, shared_tokenizer

SHARED = ["gpt2.json", "cl100k_base.json", "gpt-neox-20b.json"]
_SHARED_PATHS = {str(SHARED_TOKENIZERS / n) for n in SHARED}
RIPTOKEN = pytest.param(
    "riptoken", marks=pytest.mark.skipif(not available("riptoken"), reason="riptoken (the fast extra) not installed")
)
FASTOKENS = pytest.param(
    "fastokens", marks=pytest.mark.skipif(not available("fastokens"), reason="fastokens (the fast extra) not installed")
)
ENGINES = [FASTOKENS, RIPTOKEN, "tiktoken"]
PLAN_AUTO = "riptoken" if available("riptoken") else "tiktoken"  # what auto picks here among the plan engines
AUTO = "fastokens" if available("fastokens") else PLAN_AUTO  # what auto picks here
# ... for cl100k (quicktok runs its regex only; fastokens refuses the gap in its ids)
AUTO_CL100K = "quicktok" if available("quicktok") else PLAN_AUTO
# fastokens refuses a vocabulary whose ids have a gap: cl100k's has none at 100256
REFUSED = {("cl100k_base.json", "fastokens")}
QUICKTOK = pytest.param(
    "quicktok", marks=pytest.mark.skipif(not available("quicktok"), reason="quicktok (the fast extra) not installed")
)
HERE = [e for e in ("riptoken", "tiktoken") if available(e)]  # the plan engines installed here


@pytest.fixture
def without_fastokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """fastokens as if not installed: what auto does on the plan engines alone."""
    _without(monkeypatch, "fastokens")


def _without(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    import olmo_data.tokenizer.engines as engines

    real = engines.available
    monkeypatch.setattr(engines, "available", lambda e: e not in missing and real(e))
    for module in ("tiktoken_backend", "tiktoken_cache"):
        monkeypatch.setattr(f"olmo_data.tokenizer.{module}.available", engines.available)


MIXED_RUNS = [
    "".join(map(chr, range(33, 127))) * 7,
    "https://example.com/" + "/".join(f"seg{i}-{i * 7919 % 10007}_x" for i in range(80)) + "?q=" + "a1%2F" * 60,
    "data:image/png;base64," + base64.b64encode(random.Random(2).randbytes(1500)).decode(),
    repr(random.Random(3).randbytes(700)),
    "var;a=1;" + "".join(f"f{i}=(x)=>x*{i}+g(x,{i}*2.5e-3);" for i in range(60)),  # minified: no whitespace
]
TRICKY = [
    "",
    " ",
    "  ",
    "\n",
    "a" + " " * 25 + "b",  # 24-space token + a single space that stays with "b" (GPT-NeoX)
    "x" + " " * 48 + "y" + " " * 49 + "z" + " " * 50,
    "".join(" " * n + str(n) for n in range(70)),
    "\t\tindented\twith\ttabs\t \t \n\t\n",
    "line\r\nwindows\r\n\r\n  \r\n\n\n\n   \n",
    "trailing spaces   ",
    "   leading spaces",
    "It's, I'm, we'll, you're, they've, he'd; IT'S WE'LL YOU'RE I'D 'S 'T",
    "3.14159 1,000,000 12345678901234567890 0x1F 1e-9 ٣٤٥ ⅷ ½",
    "naïve café résumé Ünïcödé — “quotes” ‘single’ … 日本語のテキスト 中文 한국어 Русский",
    "العربية עברית हिन्दी ไทย ქართული Ελληνικά",
    unicodedata.normalize("NFD", "café résumé naïve Ångström Ελληνικά Tiếng Việt ḱṷṓn"),
    "e\u0301 a\u0308 o\u0302\u0323 n\u0303 \u1100\u1161\u11a8 Å Ω ﬁ ①",  # composable, and compatibility-only
    "👍🏽 👨‍👩‍👧‍👦 🇺🇸🇫🇷 ❤️ 😀😀😀 ☃ 🧪",
    "\x00\x01\x1b[31mred\x1b[0m\x7f \ufeffbom zero\u200bwidth\u200d \u00a0nbsp\u2003em\u3000ideo",
    "def f(x):\n    if x:  # comment\n        return {'a': [1, 2.5e-3, None]}\n\treturn x<<2\n",
    '<div class="x">y</div> https://example.com/a?b=c&d=e#f `code` **bold** $x^2$ \\frac{a}{b}',
    "<|endoftext|>",
    "text<|endoftext|>more text <|endoftext|><|endoftext|>\n<|endoftext|> end",
    "<|endoftext|<|endoftext|>|> <|endoftext <|ENDOFTEXT|>",
    "pad <|padding|> and <|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>c<|endofprompt|>",
    "spaces before    <|endoftext|>    and after",
    "a" * 2000,
    "ab" * 500 + " " + "😀" * 100,
    "\n \n  \n   \t \t  " * 300 + " " * 1000 + "\n" * 1000,
    # pieces of 500 bytes and more (riptoken 0.2 changes algorithm there: these go to tiktoken)
    "q" * 498 + " " + "r" * 499 + " " + "s" * 500 + "\n" + "t" * 2000 + " " * 600 + "\n" * 700 + "!" * 300 + "\n" * 300,
    "日本" * 150 + " " + "\u3000" * 200 + "\u00a0" * 300 + "é" * 260,
    # runs of one class around that size (riptoken's guard: `engines.may_hold_long_one_class_piece`) ...
    *(f"a {c * n}\n{c * n} b" for c in "x7!\n " for n in (494, 495, 496, 497, 499, 500, 501)),
    "!" * 490 + "\n" * 12 + "x" + "?" * 480 + "\r\n" * 12 + " " + ":" * 470 + "\n" * 40,
    # ... and long runs of mixed classes, which split into short pieces (these stay on riptoken)
    *MIXED_RUNS,
    # the characters a pair of spaces becomes for the engine (U+1680 U+FDD0), in the text itself
    "a\u1680\ufdd0  b \u1680  c\ufdd0\ufdd0 d  \u1680\u1680\n\n  e",
    "x\n\n    y\n \n    z\t\t  w\r\n\r\n        v \n\n\n  \n    \n" + " " * 25 + "\n\n" + " " * 49 + "u" + " " * 47,
    "".join(random.Random(0).choice(" \n\t\r\u00a0\u3000ab1.'é") for _ in range(20000)),
    "".join(
        random.Random(1).choice(["  ", " ", "\n", "x", "<|endoftext|>", "e\u0301", "'s", "1234"]) for _ in range(5000)
    ),
]


def _texts(corpus: list[str]) -> list[str]:
    """About 1,200 documents: whole modules, paragraphs of some, NFD versions, and the tricky strings."""
    docs = [doc.text for path in corpus for doc in read_documents(path)]
    paragraphs = [p for d in docs[:40] for p in d.split("\n\n")][:1000]
    nfd = [unicodedata.normalize("NFD", d) for d in docs[:10]]
    return docs + paragraphs + nfd + TRICKY


@pytest.fixture(scope="module")
def texts(demo_corpus: list[str]) -> list[str]:
    return _texts(demo_corpus)


@functools.cache
def _shared(name: str, backend: str) -> Tokenizer:
    """Each shared tokenizer loaded once per backend for the module (cl100k takes seconds here)."""
    return load_tokenizer(shared_tokenizer(name), backend)  # type: ignore[arg-type]


def _reference(path: str, texts: list[str]) -> tuple[Tokenizer, list[list[int]]]:
    hf = load_tokenizer(path, "hf") if path not in _SHARED_PATHS else _shared(Path(path).name, "hf")
    assert hf.backend == "hf"
    return hf, [list(e.ids) for e in hf.hf.encode_batch_fast(texts, add_special_tokens=False)]


def _assert_same(texts: list[str], expected: list[list[int]], got: list[list[int]]) -> None:
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert b == a, f"document {i} differs: {texts[i][:80]!r}"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", SHARED)
def test_shared_tokenizers_identical_ids(name: str, engine: str, texts: list[str]) -> None:
    if (name, engine) in REFUSED:
        with pytest.raises(DataError, match=f"{name}: the fastokens backend cannot .*id 100256 has no token"):
            load_tokenizer(shared_tokenizer(name), "fastokens")
        return
    path = shared_tokenizer(name)
    hf, expected = _reference(path, texts)
    fast = _shared(name, engine)
    assert fast.backend == engine
    assert (fast.name, fast.sha256, fast.vocab_size) == (hf.name, hf.sha256, hf.vocab_size)
    assert (fast.eos_token_id, fast.bos_token_id, fast.pad_token_id) == (
        hf.eos_token_id,
        hf.bos_token_id,
        hf.pad_token_id,
    )
    assert fast.identity() == {**hf.identity(), "backend": engine}
    _assert_same(texts, expected, fast.encode_batch(texts))
    # Pickled for workers it drops the HF tokenizer; ids and decoding stay the same.
    copy = pickle.loads(pickle.dumps(fast))
    assert copy.hf is None and copy.identity() == fast.identity()
    _assert_same(TRICKY, expected[-len(TRICKY) :], copy.encode_batch(TRICKY))
    for ids in expected[-len(TRICKY) :]:
        assert copy.decode(ids) == hf.decode(ids) and copy.decode(ids[:-3]) == hf.decode(ids[:-3])


def test_auto_picks_the_fastest_installed_engine() -> None:
    for name in SHARED:
        assert _shared(name, "auto").backend == (AUTO_CL100K if "cl100k" in name else AUTO), name


@pytest.mark.parametrize("engine", ENGINES)
def test_shared_special_tokens_in_text_become_their_ids(engine: str) -> None:
    """Pinned against the tokenizers' own special ids (../shared/README.md), not against our output."""
    cases = {"gpt2.json": 50256, "cl100k_base.json": 100257, "gpt-neox-20b.json": 0}
    for name, eos in cases.items():
        if (name, engine) in REFUSED:
            continue
        tok = _shared(name, engine)
        ids = tok.encode("a<|endoftext|>b")
        assert ids.count(eos) == 1 and ids[0] != eos and ids[-1] != eos, name
        assert tok.encode("<|endoftext|>") == [eos]


@pytest.mark.parametrize("engine", ENGINES)
def test_neox_space_runs_use_added_tokens(engine: str) -> None:
    """GPT-NeoX-20B's added tokens 50254-50276 are runs of 24..2 spaces, matched longest first."""
    tok, hf = _shared("gpt-neox-20b.json", engine), _shared("gpt-neox-20b.json", "hf")
    ids = tok.encode("a" + " " * 50 + "b")
    assert ids[1:4] == [50254, 50254, 50276]  # 24 + 24 + 2 spaces
    assert len(ids) == 5 and tok.decode(ids) == "a" + " " * 50 + "b"
    assert ids == hf.encode("a" + " " * 50 + "b")
    ids = tok.encode("a" + " " * 25 + "b")  # 24 spaces, then " b": a lone space stays with the next word
    assert ids[1] == 50254 and len(ids) == 3 and ids == hf.encode("a" + " " * 25 + "b")
    # whitespace before a run is one piece, as at a text's end: "\n\n" then 4 spaces, not "\n", "\n", 4 spaces
    for text in ("x\n\n    y", "x \n\t\t  y", "\r\n\r\n" + " " * 26 + "z", "\u3000\u3000   w", "\n" + " " * 48):
        assert tok.encode(text) == hf.encode(text), repr(text)
    assert tok.encode("x\n\n    y")[1] == hf.encode("\n\n")[0]
    # each length alone, odd and even, at either end and between words
    for n in range(1, 75):
        for text in (" " * n, "a" + " " * n, " " * n + "b", "a" + " " * n + "b", "\n" + " " * n + "\n"):
            assert tok.encode(text) == hf.encode(text), repr(text)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lone_surrogate_is_encoded_as_tiktoken_does(engine: str) -> None:
    """No reader of this project lets one through (documents and chat rows refuse them, naming the line); a library
    caller's str may still hold one: `tokenizers` refuses it, and both engines replace it, with the same ids."""
    tok = _shared("gpt2.json", engine)
    assert tok.encode("a\ud800b") == _shared("gpt2.json", "hf").encode("a\ufffdb")
    with pytest.raises(TypeError):
        _shared("gpt2.json", "hf").encode("a\ud800b")


@pytest.mark.parametrize("engine", ENGINES)
def test_demo_tokenizer_identical_ids(demo_tokenizer: str, texts: list[str], engine: str) -> None:
    hf, expected = _reference(demo_tokenizer, texts)
    fast = load_tokenizer(demo_tokenizer, engine)  # type: ignore[arg-type]
    assert fast.backend == engine
    assert (fast.eos_token_id, fast.pad_token_id, fast.vocab_size) == (0, 1, hf.vocab_size)
    _assert_same(texts, expected, fast.encode_batch(texts))


@pytest.mark.parametrize("engine", ENGINES)
def test_threads_and_pickling_keep_ids(demo_tokenizer: str, texts: list[str], engine: str) -> None:
    fast = load_tokenizer(demo_tokenizer, engine)  # type: ignore[arg-type]
    one = fast.encode_batch(texts)
    fast.set_num_threads(3)
    assert fast.encode_batch(texts) == one
    copy = pickle.loads(pickle.dumps(fast))
    assert copy.backend == engine and copy.encode_batch(texts) == one


@pytest.mark.parametrize("engine", [*ENGINES, "hf"])
def test_encode_each_gives_encode_batch_ids_on_any_threads(demo_tokenizer: str, texts: list[str], engine: str) -> None:
    tok = load_tokenizer(demo_tokenizer, engine)  # type: ignore[arg-type]
    one = tok.encode_batch(texts)
    for threads in (1, 3, 2, 1):  # (the encoder's thread pool is made again when the count changes)
        tok.set_num_threads(threads)
        assert list(tok.encode_each(texts)) == one
        assert list(tok.encode_each(texts[:1])) == one[:1] and list(tok.encode_each([])) == []


def test_a_batch_on_threads_is_cut_into_runs_of_about_equal_characters() -> None:
    from olmo_data.tokenizer.tiktoken_encoder import balanced_chunks

    rng = random.Random(0)
    for _ in range(200):
        texts = ["x" * int(rng.paretovariate(1.2) * rng.choice([1, 10, 100])) for _ in range(rng.randint(0, 60))]
        n = rng.randint(1, 9)
        chunks = balanced_chunks(texts, n)
        assert [t for c in chunks for t in c] == texts and len(chunks) <= n
        assert all(chunks)
        if texts:  # each run is off its share by at most a text
            total, longest = sum(map(len, texts)), max(map(len, texts))
            assert all(sum(map(len, c)) <= total / n + longest for c in chunks)
    # halves by count would give one thread both long documents and the other nothing to speak of
    assert [len(c) for c in balanced_chunks(["a" * 1000, "c" * 1000, *["b"] * 10], 2)] == [1, 11]


def test_backend_values(demo_tokenizer: str) -> None:
    assert load_tokenizer(demo_tokenizer, "hf").backend == "hf"
    assert load_tokenizer(demo_tokenizer, "auto").backend == AUTO
    assert load_tokenizer(demo_tokenizer, "tiktoken").backend == "tiktoken"
    with pytest.raises(
        DataError,
        match="unknown tokenizer backend 'fast'; expected auto, quicktok, fastokens, riptoken, tiktoken or hf",
    ):
        load_tokenizer(demo_tokenizer, "fast")  # type: ignore[arg-type]


def test_without_riptoken_auto_uses_tiktoken_and_riptoken_is_refused(
    demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """riptoken, fastokens and quicktok are an optional extra: where they are missing, auto runs on tiktoken, and
    asking for one says how to install it."""
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    _without(monkeypatch, "riptoken", "quicktok", "fastokens")
    assert load_tokenizer(demo_tokenizer, "auto").backend == "tiktoken"
    assert load_tokenizer(demo_tokenizer, "auto").backend == "tiktoken"  # from the cache
    with pytest.raises(DataError, match=r"the riptoken backend cannot .*riptoken is not installed .*olmo-data\[fast\]"):
        load_tokenizer(demo_tokenizer, "riptoken")
    ranks = shared_tokenizer("cl100k_base.tiktoken")
    assert load_tokenizer(ranks, "auto").backend == "tiktoken"
    with pytest.raises(DataError, match=r"cl100k_base.tiktoken: --backend riptoken, but riptoken is not installed"):
        load_tokenizer(ranks, "riptoken")
    with pytest.raises(
        DataError, match=r"quicktok is not installed \(pip install 'olmo-data\[fast\]' \(quicktok-v1\)\)"
    ):
        load_tokenizer(shared_tokenizer("cl100k_base.json"), "quicktok")
    with pytest.raises(
        DataError, match=r"fastokens is not installed \(pip install 'olmo-data\[fast\]' \(fastokens\)\)"
    ):
        load_tokenizer(demo_tokenizer, "fastokens")


# Tokenizers that tiktoken cannot reproduce: auto falls back, strict says why.


def _edited(demo_tokenizer: str, tmp_path: Path, edit: str) -> str:
    data = json.loads(Path(demo_tokenizer).read_text())
    if edit == "lowercase":
        data["normalizer"] = {"type": "Lowercase"}
    elif edit == "prefix space":
        data["pre_tokenizer"]["add_prefix_space"] = True
    elif edit == "lstrip":
        data["added_tokens"][0]["lstrip"] = True
    elif edit == "whitespace":
        data["pre_tokenizer"] = {"type": "Whitespace"}
    elif edit == "merge order":
        data["model"]["merges"] = data["model"]["merges"][::-1]
    path = tmp_path / f"{edit.replace(' ', '-')}.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("lowercase", "its normaliser Lowercase is not supported"),
        ("prefix space", "its ByteLevel pre-tokenizer adds a prefix space"),
        ("lstrip", r"its added token '<\|endoftext\|>' has lstrip set"),
        ("whitespace", "its pre-tokenizer is Whitespace, not ByteLevel"),
        ("merge order", r"merge 1 \(.+\) gives id \d+, lower than an earlier merge's id \d+"),
    ],
)
def test_unsupported_structure_falls_back(demo_tokenizer: str, tmp_path: Path, edit: str, reason: str) -> None:
    path = _edited(demo_tokenizer, tmp_path, edit)
    assert load_tokenizer(path, "auto").backend == "hf"
    for engine in HERE:
        with pytest.raises(
            DataError, match=f"the {engine} backend cannot reproduce this tokenizer: {reason}.*use --back"
        ):
            load_tokenizer(path, engine)  # type: ignore[arg-type]


def _rank_order_trap(tmp_path: Path) -> str:
    """A byte-level BPE whose structure passes but whose ids differ: merges `r e`, `e t`, `r et` (no `re t`).

    `tokenizers` encodes "return" as re|t|u|r|n (no merge joins re and t); tiktoken merges any adjacent pair
    whose concatenation is in the vocabulary, so it makes ret|u|r|n. Only the self-check can see this.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in byte_level_alphabet().items()}  # a byte's id is its value
    vocab.update({"re": 256, "et": 257, "ret": 258})
    merges = [("r", "e"), ("e", "t"), ("r", "et")]
    tok = HFTokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path = tmp_path / "trap.json"
    tok.save(str(path))
    return str(path)


@pytest.mark.skipif(not available("fastokens"), reason="fastokens (the fast extra) not installed")
def test_fastokens_runs_merges_where_rank_order_differs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """fastokens runs the tokenizer.json's merges, not ranks: where rank order and merge order part (the plan
    engines' self-check differs, below), its ids are `tokenizers'`, and auto takes it without a warning."""
    path = _rank_order_trap(tmp_path)
    with caplog.at_level(logging.WARNING, logger="olmo_data.tokenizer.tiktoken_backend"):
        tok = load_tokenizer(path, "auto")
    assert tok.backend == "fastokens" and not caplog.records
    assert tok.encode("return") == load_tokenizer(path, "hf").encode("return") == [256, *map(ord, "turn")]


def test_self_check_difference_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, without_fastokens: None
) -> None:
    path = _rank_order_trap(tmp_path)
    assert load_tokenizer(path, "hf").encode("return") == [256, ord("t"), ord("u"), ord("r"), ord("n")]
    with caplog.at_level(logging.WARNING, logger="olmo_data.tokenizer.tiktoken_backend"):
        tok = load_tokenizer(path, "auto")
    assert tok.backend == "hf"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert message.startswith("trap.json: ") and message.endswith("; using the hf backend")
    assert "tiktoken self-check differs from tokenizers on probe 'code'" in message
    assert ("riptoken self-check differs from tokenizers on probe 'code'" in message) == available("riptoken")
    for engine in HERE:
        with pytest.raises(
            DataError, match=f"{engine} and tokenizers give different ids on the self-check probe 'code'"
        ):
            load_tokenizer(path, engine)  # type: ignore[arg-type]


def test_tiktoken_crash_falls_back(
    demo_tokenizer: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, without_fastokens: None
) -> None:
    """A split regex that matches the empty string makes tiktoken panic (and riptoken give ids past the vocabulary):
    a fallback, not a crash. (fastokens, set aside here, gives `tokenizers'` ids on it: test_fastokens_engine.)"""
    data = json.loads(Path(demo_tokenizer).read_text())
    data["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\p{L}*|."}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }
    path = tmp_path / "empty-match.json"
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="olmo_data.tokenizer.tiktoken_backend"):
        assert load_tokenizer(str(path), "auto").backend == "hf"
    assert "tiktoken failed: PanicException" in caplog.text
    with pytest.raises(DataError, match="empty-match.json: .* self-check probe .*tiktoken failed: PanicException"):
        load_tokenizer(str(path), "tiktoken")
    if available("riptoken"):
        assert "riptoken self-check differs from tokenizers on probe 'contractions'" in caplog.text
        with pytest.raises(DataError, match="empty-match.json: riptoken and tokenizers give different ids on the"):
            load_tokenizer(str(path), "riptoken")


@pytest.mark.parametrize("backend", ["auto", "riptoken", "tiktoken", "hf"])
def test_two_tokens_on_one_id_are_named_on_every_backend(demo_tokenizer: str, tmp_path: Path, backend: str) -> None:
    """tiktoken panicked from Rust on it (a pyo3 traceback naming neither file nor id); `tokenizers` loaded it
    silently, and decoded the id as either token."""
    data = json.loads(Path(demo_tokenizer).read_text())
    vocab = data["model"]["vocab"]
    a, b = (t for t, i in vocab.items() if i in (300, 301))
    vocab[a] = vocab[b] = 301
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"dup\.json: tokens {min(a, b)!r} and {max(a, b)!r} both have id 301"):
        load_tokenizer(str(path), backend)  # type: ignore[arg-type]


def test_try_tiktoken_auto_returns_none_when_unsupported(demo_tokenizer: str, tmp_path: Path) -> None:
    tok = load_tokenizer(_edited(demo_tokenizer, tmp_path, "lowercase"), "hf")
    assert try_tiktoken(tok, strict=False) is None


# .tiktoken ranks files


@pytest.mark.parametrize("engine", ["auto", *ENGINES, QUICKTOK])
def test_tiktoken_file_matches_hf_cl100k(texts: list[str], engine: str) -> None:
    ranks = shared_tokenizer("cl100k_base.tiktoken")
    if engine == "fastokens":  # (it runs a tokenizer.json, which a ranks file is not)
        with pytest.raises(DataError, match="a .tiktoken ranks file runs on the quicktok, riptoken or tiktoken"):
            load_tokenizer(ranks, engine)
        return
    tok = load_tokenizer(ranks, engine)  # type: ignore[arg-type]
    assert tok.backend == (AUTO_CL100K if engine == "auto" else engine) and tok.hf is None
    assert tok.name == "cl100k_base.tiktoken"
    sidecar = json.loads(Path(ranks + ".json").read_text())
    identity = Path(ranks).read_bytes() + json.dumps(sidecar, sort_keys=True).encode()
    assert tok.sha256 == hashlib.sha256(identity).hexdigest()
    assert (tok.vocab_size, tok.eos_token_id, tok.pad_token_id) == (100277, 100257, None)
    # `<|pad|>` exists only in the HF file, so it stays out of the texts compared here.
    sample = [t for t in texts if "<|pad|>" not in t]
    _, expected = _reference(shared_tokenizer("cl100k_base.json"), sample)
    _assert_same(sample, expected, tok.encode_batch(sample))
    for text in TRICKY:
        assert tok.decode(tok.encode(text)) == text


def test_tiktoken_file_without_sidecar(tmp_path: Path) -> None:
    ranks = tmp_path / "mini.tiktoken"
    shutil.copy(shared_tokenizer("cl100k_base.tiktoken"), ranks)
    with pytest.raises(DataError, match=r"mini.tiktoken: a .tiktoken ranks file needs a sidecar .*\.tiktoken\.json"):
        load_tokenizer(str(ranks))
    with pytest.raises(DataError, match="runs on the quicktok, riptoken or tiktoken backend only"):
        load_tokenizer(str(ranks), "hf")


def _tiny_ranks(tmp_path: Path, lines: list[str], sidecar: object) -> str:
    path = tmp_path / "tiny.tiktoken"
    path.write_text("\n".join(lines) + "\n")
    if sidecar is not None:
        Path(str(path) + ".json").write_text(sidecar if isinstance(sidecar, str) else json.dumps(sidecar))
    return str(path)


def test_tiktoken_file_bad_input(tmp_path: Path) -> None:
    import base64

    good = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    side = {"pat_str": r"\S+|\s+", "special_tokens": {"<|endoftext|>": 256}}
    with pytest.raises(DataError, match=r"tiny.tiktoken:3: expected 'BASE64_TOKEN RANK'"):
        load_tiktoken_file(_tiny_ranks(tmp_path, [*good[:2], "AAA= x", *good[3:]], side))
    with pytest.raises(DataError, match="tiny.tiktoken.json: not valid JSON"):
        load_tiktoken_file(_tiny_ranks(tmp_path, good, "{pat_str"))
    with pytest.raises(DataError, match="tiny.tiktoken.json: expected an object with a string 'pat_str'"):
        load_tiktoken_file(_tiny_ranks(tmp_path, good, {"special_tokens": {}}))
    with pytest.raises(DataError, match="'special_tokens' must map token strings to integer ids"):
        load_tiktoken_file(_tiny_ranks(tmp_path, good, {"pat_str": "x", "special_tokens": ["<|endoftext|>"]}))
    with pytest.raises(DataError, match="missing.tiktoken: tiktoken ranks file not found"):
        load_tiktoken_file(str(tmp_path / "missing.tiktoken"))
    with pytest.raises(DataError, match=r"tiny.tiktoken:98: rank 96 is given to two tokens \(line 97 too\)"):
        load_tiktoken_file(_tiny_ranks(tmp_path, [*good[:97], f"{good[97].split()[0]} 96", *good[98:]], side))
    with pytest.raises(DataError, match="tiny.tiktoken: byte 0x61 has no rank; every single byte needs one"):
        load_tiktoken_file(_tiny_ranks(tmp_path, good[:97] + good[98:], side))
    with pytest.raises(DataError, match="tiny.tiktoken.json: tiktoken fails .* must not match the empty string"):
        load_tiktoken_file(_tiny_ranks(tmp_path, good, {**side, "pat_str": r"\p{L}*|."}))
    tok = load_tiktoken_file(_tiny_ranks(tmp_path, good, side))
    assert (tok.vocab_size, tok.eos_token_id, tok.backend) == (257, 256, PLAN_AUTO)
    assert tok.encode("ab <|endoftext|>") == [97, 98, 32, 256]


def test_checked_plan_cache_gives_the_same_ids_without_loading_hf(
    demo_corpus: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without_fastokens: None
) -> None:
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    path = shared_tokenizer("gpt-neox-20b.json")
    first = load_tokenizer(path)
    assert first.backend == PLAN_AUTO and first.hf is not None
    cached_files = list((tmp_path / "cache" / "tiktoken").glob("*.plan"))
    assert [f.name for f in cached_files] == [f"{first.sha256}.{PLAN_AUTO}.plan"]
    second = load_tokenizer(path)
    assert second.backend == PLAN_AUTO and second.hf is None  # neither the HF load nor the self-check ran
    assert (second.vocab_size, second.eos_token_id, second.pad_token_id) == (50277, 0, 1)
    texts = [d.text for d in read_documents(demo_corpus[0])][:40] + ["a  b   c\t\t\n\n x", "Cafe\u0301 <|endoftext|>"]
    reference = [e.ids for e in first.hf.encode_batch(texts, add_special_tokens=False)]
    assert second.encode_batch(texts) == reference
    assert second.decode(reference[-1]) == first.decode(reference[-1])
    # a damaged cache file is ignored and rewritten: foreign, truncated, or one byte of its ranks changed
    entry = cached_files[0].read_bytes()
    flipped = bytearray(entry)
    flipped[entry.index(b"\n", entry.index(b"\n") + 1) + 100] ^= 1  # a byte of the tokens, after the JSON line
    for damaged in (b"not a plan", entry[:-1], bytes(flipped)):
        cached_files[0].write_bytes(damaged)
        third = load_tokenizer(path)
        assert third.hf is not None and third.encode_batch(texts) == reference
        assert cached_files[0].read_bytes() == entry  # written again, the same bytes
        assert load_tokenizer(path).hf is None
    # --backend hf never uses the cache
    assert load_tokenizer(path, "hf").backend == "hf"


def test_cache_entries_per_engine_and_what_auto_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each engine has its own entry; auto takes an entry only where it would have chosen that engine itself (an
    entry that `--backend tiktoken` made, while riptoken is installed, is not auto's choice)."""
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    path = shared_tokenizer("gpt2.json")
    assert load_tokenizer(path, "tiktoken").hf is not None
    assert load_tokenizer(path, "tiktoken").hf is None  # its own entry
    auto = load_tokenizer(path, "auto")
    assert auto.backend == AUTO and (auto.hf is None) == (AUTO == "tiktoken")
    assert load_tokenizer(path, "auto").hf is None
    names = sorted(f.name for f in (tmp_path / "cache" / "tiktoken").glob("*.plan"))
    assert names == sorted({f"{auto.sha256}.tiktoken.plan", f"{auto.sha256}.{AUTO}.plan"})


def test_the_cache_key_reads_installed_versions_as_importlib_metadata_does() -> None:
    from importlib.metadata import version

    from olmo_data.tokenizer.tiktoken_cache import installed_version

    for package in ("tokenizers", "tiktoken", "numpy", *(["riptoken"] if available("riptoken") else [])):
        assert installed_version(package) == version(package)
    assert installed_version("no_such_package_here") == "absent"


def test_riptokens_guard_keeps_every_long_piece_and_lets_mixed_runs_through() -> None:
    """Every piece of 500 bytes or more (where riptoken 0.2 is inexact) that the split regexes make, with the
    `regex` module splitting (tiktoken's dependency) is seen by the guard, on random texts of long runs of one
    class and of mixed classes; and runs of mixed classes, however long, are not (they stay on riptoken)."""
    import regex

    from olmo_data.tokenizer.engines import (
        ONE_CLASS_PATTERNS,
        may_hold_long_one_class_piece,
        may_hold_long_piece,
    )
    from olmo_data.tokenizer.tiktoken_plan import PAIR, pair_space_runs

    neox = pair_space_runs(_shared("gpt-neox-20b.json", "tiktoken")._encode_batch.plan)
    patterns = [(regex.compile(p), False) for p in ONE_CLASS_PATTERNS] + [(regex.compile(neox.pat_str), True)]
    alphabet = ["a", "Z", "é", "日", "7", "٣", "!", "'", "\\", "😀", " ", "\n", "\r", "\t", "\u3000", "\x00", "\u0301"]
    rng = random.Random(44)
    long_texts = 0
    for _ in range(1500):
        parts = []
        for _ in range(rng.randrange(1, 5)):
            if rng.random() < 0.5:  # a run of one character class
                parts.append(rng.choice(alphabet) * rng.randrange(100, 620))
            else:  # mixed
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 900))))
        text = "".join(parts)
        guard = may_hold_long_piece(text) and may_hold_long_one_class_piece(text)
        for pattern, paired in patterns:
            pieces = pattern.findall(text.replace("  ", PAIR) if paired else text)
            longest = max((len(p.encode("utf-8", "surrogatepass")) for p in pieces), default=0)
            if longest >= 500:
                long_texts += 1
                assert guard, (pattern.pattern[:40], text[:80])
    assert long_texts > 300  # (the texts do test the guard)
    for text in MIXED_RUNS:
        assert may_hold_long_piece(text) and not may_hold_long_one_class_piece(text), text[:60]


@pytest.mark.skipif(not available("riptoken"), reason="riptoken (the fast extra) not installed")
@pytest.mark.parametrize("name", SHARED)
def test_mixed_runs_stay_on_riptoken(name: str) -> None:
    """The long mixed runs of TRICKY (whose ids test_shared_tokenizers_identical_ids compares) are encoded by
    riptoken itself: the exact fallback is not even made for them; a long run of one class makes it."""
    tok = load_tokenizer(shared_tokenizer(name), "riptoken")
    pieces = tok._encode_batch._encode_piece
    tok.encode_batch(MIXED_RUNS)
    assert pieces._exact is None
    tok.encode_batch(["x" + "y" * 600])
    assert pieces._exact is not None


@pytest.mark.parametrize("backend", ["hf", "auto", *ENGINES])
def test_a_files_truncation_and_padding_are_ignored_with_a_warning(
    demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, backend: str
) -> None:
    """A tokenizer.json saved with truncation and padding set (a `transformers` call saves them): `tokenizers`
    applied both to every text it encoded, so each document was cut at max_length and padded with the pad id, in
    silence. Every backend now encodes whole texts, unpadded, and says the settings are ignored, from the cache too."""
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    data = json.loads(Path(demo_tokenizer).read_text())
    data["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = {
        "strategy": {"Fixed": 16},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 1,
        "pad_type_id": 0,
        "pad_token": "<|padding|>",
    }
    path = tmp_path / "saved-with-truncation.json"
    path.write_text(json.dumps(data))
    text = "def f(x):\n    return [x, x + 1, x * 2]  # a line of code longer than eight tokens\n"
    whole = load_tokenizer(demo_tokenizer, "hf").encode(text)
    assert len(whole) > 16
    for _ in range(2):  # the second load from the cache entry, where the engines' self-check passed
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            tok = load_tokenizer(str(path), backend)  # type: ignore[arg-type]
            assert tok.encode(text) == whole and tok.encode_batch([text, "a"])[1] == tok.encode("a") != []
        assert "sets truncation (max_length 8) and padding; ignored: olmo-data encodes whole texts" in caplog.text
