"""fastokens as an engine (`olmo_data.tokenizer.fastokens_engine`): the ids of HF `tokenizers` on any text, whole
tokenizer.json (added tokens, NFC, merges), on any threads, pickled, from the cache; refused where it cannot run.

The shared tokenizers' cases run where ../shared is present (GPT-2 and GPT-NeoX-20B: cl100k is refused, its ids have
a gap); the demo tokenizer's everywhere fastokens is installed.
"""

from __future__ import annotations

import json
import pickle
import random
import threading
from pathlib import Path

import pytest

from olmo_data.errors import DataError
from olmo_data.tokenizer import load_tokenizer
from olmo_data.tokenizer.engines import available
from olmo_data.tokenizer.fastokens_engine import FastokensEncoder, refusal
from tests.conftest import shared_tokenizer

pytestmark = pytest.mark.skipif(not available("fastokens"), reason="fastokens (the fast extra) not installed")

# what the random strings are made of: where split regexes, added tokens, NFC and byte-level BPE could part
PIECES = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u00a0",
    "\u3000",
    "\u1680",
    "\ufdd0",
    "\u0301",
    "e\u0301",
    "é",
    "日本語",
    "😀",
    "👨‍👩‍👧",
    "'s",
    "'LL",
    "123456",
    "٣٤",
    "<|endoftext|>",
    "<|padding|>",
    "<|endoftext",
    "def f(x):",
    "return",
    "!!",
    "...",
    "https://x.org/a?b=c",
    "\x00",
    "\ufeff",
]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        parts = [rng.choice(PIECES) if rng.random() < 0.6 else "word" * rng.randint(1, 3) for _ in range(40)]
        if rng.random() < 0.1:  # a long run of one character
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(" a\n!日") * rng.randint(200, 1200))
        texts.append("".join(parts))
    return texts


def _specs(demo_tokenizer: str) -> list[str]:
    found = [demo_tokenizer]
    for name in ("gpt2.json", "gpt-neox-20b.json"):
        try:
            found.append(shared_tokenizer(name))
        except pytest.skip.Exception:  # (../shared absent: the demo tokenizer alone)
            pass
    return found


def test_ids_equal_tokenizers_on_random_strings_documents_and_batches(
    demo_tokenizer: str, demo_corpus: list[str]
) -> None:
    from olmo_data.documents import read_documents

    texts = random_texts(400) + [d.text for d in read_documents(demo_corpus[0])][:60] + ["", " ", "a"]
    for spec in _specs(demo_tokenizer):
        hf = load_tokenizer(spec, "hf").hf
        expected = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
        tok = load_tokenizer(spec, "fastokens")
        assert tok.backend == "fastokens"
        for threads in (1, 3, 2):
            tok.set_num_threads(threads)
            got = tok.encode_batch(texts)
            bad = [i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b]
            assert not bad, f"{spec}, {threads} threads: text {bad[0]} differs: {texts[bad[0]][:80]!r}"
            assert list(tok.encode_each(texts)) == expected
            tokens, offsets = tok.encode_flat(texts)  # type: ignore[misc]
            assert str(tokens.dtype) == "uint32" and str(offsets.dtype) == "int64"
            assert [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(texts))] == expected
        assert tok.encode_batch([]) == [] and tok.encode_flat([])[1].tolist() == [0]  # type: ignore[index]


def test_decode_pickling_and_lone_surrogates(demo_tokenizer: str) -> None:
    rng = random.Random(1)
    for spec in _specs(demo_tokenizer):
        hf = load_tokenizer(spec, "hf")
        tok = load_tokenizer(spec, "fastokens")
        copy = pickle.loads(pickle.dumps(tok))  # (as a spawned worker gets it: the HF tokenizer left behind)
        assert copy.hf is None and copy.backend == "fastokens"
        for _ in range(300):  # any ids, partial UTF-8 sequences included: replaced as `tokenizers` does
            ids = [rng.randrange(hf.vocab_size) for _ in range(rng.randint(1, 6))]
            assert copy.decode(ids) == hf.decode(ids), ids
        texts = random_texts(50, seed=2)
        assert copy.encode_batch(texts) == hf.encode_batch(texts)
        # a lone surrogate (no reader lets one through): U+FFFD, as the other engines give
        assert tok.encode("a\ud800b") == hf.encode("a\ufffdb")
        assert tok.encode_batch(["x", "a\udc00"]) == [hf.encode("x"), hf.encode("a\ufffd")]


def test_refused_where_it_cannot_run(demo_tokenizer: str, tmp_path: Path) -> None:
    data = json.loads(Path(demo_tokenizer).read_text())
    assert refusal(data) is None
    vocab = data["model"]["vocab"]
    top = max(vocab, key=vocab.__getitem__)
    vocab[top] = vocab[top] + 5  # a gap: fastokens would not load it
    want = f"fastokens needs the vocabulary's ids to be 0..n-1, each given once (id {len(vocab) - 1} has no token)"
    assert refusal(data) == want
    path = tmp_path / "gap.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"gap.json: the fastokens backend cannot reproduce .*0..n-1"):
        load_tokenizer(str(path), "fastokens")
    assert load_tokenizer(str(path), "auto").backend != "fastokens"  # auto takes the next engine, without a word
    assert refusal({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}) == "fastokens runs BPE vocabularies only"


def test_a_file_it_fails_to_load_raises_in_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    encoder = FastokensEncoder("broken.json", '{"model": {"type": "BPE"')
    with pytest.raises(ValueError):
        encoder.ready()
    with pytest.raises(ValueError):
        encoder(["a"])


def test_its_loading_thread_is_gone_once_ready(demo_tokenizer: str) -> None:
    """The tokenize stage forks its workers after `ready`: no thread of the engine's may be left then."""
    encoder = FastokensEncoder("demo", Path(demo_tokenizer).read_text())
    encoder.ready()
    assert not [t for t in threading.enumerate() if t.name == "fastokens-load"]
    assert encoder(["hello world"]) == [load_tokenizer(demo_tokenizer, "hf").encode("hello world")]


def test_loading_says_whether_the_load_is_under_way_without_waiting_for_it(demo_tokenizer: str) -> None:
    """The tokenize stage reads ahead for as long as `loading()` is true, so it must not block, and must turn false
    once the load is done (the demo tokenizer loads in milliseconds: a load held back stands in for a slow one)."""
    release = threading.Event()

    class HeldBack:
        @staticmethod
        def from_json_str(text: str) -> object:
            release.wait(10)
            raise ValueError("held back, then refused")

    encoder = FastokensEncoder("demo", Path(demo_tokenizer).read_text())
    encoder.ready()
    assert not encoder.loading()
    held = FastokensEncoder("demo", Path(demo_tokenizer).read_text())
    held.ready()
    held._loading = threading.Thread(target=held._load, args=(HeldBack,))
    held._loading.start()
    assert held.loading() and held.loading()  # (at once, twice: nothing waited for)
    release.set()
    held._loading.join()
    assert not held.loading()


def test_cache_entry_skips_hf_and_is_rewritten_when_damaged(
    demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    first = load_tokenizer(demo_tokenizer, "fastokens")
    assert first.hf is not None  # checked against `tokenizers` at this first load
    [entry] = (tmp_path / "cache" / "tiktoken").glob("*.fastokens.plan")
    second = load_tokenizer(demo_tokenizer, "fastokens")
    assert second.hf is None and second.backend == "fastokens"  # neither the HF load nor the self-check ran
    assert (second.vocab_size, second.eos_token_id, second.pad_token_id) == (first.vocab_size, 0, 1)
    texts = random_texts(40, seed=3)
    assert second.encode_batch(texts) == [e.ids for e in first.hf.encode_batch_fast(texts, add_special_tokens=False)]
    assert load_tokenizer(demo_tokenizer, "auto").backend == "fastokens"  # (its entry: the engines auto tried first)
    assert load_tokenizer(demo_tokenizer, "auto").hf is None
    good = entry.read_bytes()
    for damaged in (b"not an entry", good[:-1], good.replace(b'"fastokens"', b'"riptoken"')):
        entry.write_bytes(damaged)
        assert load_tokenizer(demo_tokenizer, "auto").hf is not None
        assert entry.read_bytes() == good  # written again, the same bytes


_INHERITED: dict[str, FastokensEncoder] = {}  # what a forked child finds in its copy of this module


def _encode_inherited(texts: list[str]) -> list[list[int]]:
    return _INHERITED["encoder"](texts)


def test_a_process_forked_while_it_loads_loads_it_itself(demo_tokenizer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork copies no threads: a child forked before the load thread finished would find no engine, so `ready`
    loads it there (the tokenize stage waits for `ready` before it forks; other callers may not)."""
    import multiprocessing as mp
    import time

    import fastokens

    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    real = fastokens.Tokenizer

    class Slow:  # the load, made slow enough to fork in the middle of it
        @staticmethod
        def from_json_str(text: str) -> object:
            time.sleep(0.5)
            return real.from_json_str(text)

    monkeypatch.setattr(fastokens, "Tokenizer", Slow)
    _INHERITED["encoder"] = FastokensEncoder("demo", Path(demo_tokenizer).read_text())
    try:
        assert [t for t in threading.enumerate() if t.name == "fastokens-load"]  # still loading
        with mp.get_context("fork").Pool(1) as pool:
            got = pool.apply(_encode_inherited, (["hello world"],))
    finally:
        _INHERITED["encoder"].ready()
        del _INHERITED["encoder"]
    assert got == [load_tokenizer(demo_tokenizer, "hf").encode("hello world")]
