"""quicktok, the third BPE engine (`olmo_data.tokenizer.quicktok_engine`): used for cl100k's split regex only (cl100k
and OLMo 2/3's dolma2), where its ids equal `tokenizers'`, text by text and in its batch call; GPT-2 and GPT-NeoX-20B
keep riptoken; `--backend quicktok` elsewhere is refused, naming why.

The first tests run without quicktok (what decides where it may run, the files written for it, the batch path's
BOS/EOS rule); the rest need it installed (the `fast` extra) and are skipped, saying so, where it is not.
"""

from __future__ import annotations

import random
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.errors import DataError
from olmo_data.tokenize import workers
from olmo_data.tokenize.workers import TokenIdTooLarge, _encode
from olmo_data.tokenizer import Tokenizer, load_tokenizer
from olmo_data.tokenizer.engines import available, refusal
from olmo_data.tokenizer.quicktok_engine import CL100K_POSSESSIVE_PATTERN, MAX_ID, _vocab_bytes, with_fillers
from olmo_data.tokenizer.tiktoken_plan import CL100K_PATTERN, GPT2_PATTERN, Plan
from tests.conftest import shared_tokenizer
from tests.helpers import docs, write_jsonl

NEEDS_QUICKTOK = pytest.mark.skipif(not available("quicktok"), reason="quicktok (the fast extra) not installed")
TEXTS = [
    "",
    " ",
    "hello world",
    "text<|endoftext|>more <|endoftext|><|endoftext|> end <|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>c",
    "<|endoftext|>",
    "<|endoftext|<|endoftext|>|> <|ENDOFTEXT|> <|pad|> <|endofprompt|>",
    b"caf\xe9 \xff\xfe bad \xc3( utf-8 \xe2\x82".decode("utf-8", errors="replace"),
    "=" * 500 + " " + "=" * 10_000,
    " " * 5000 + "\n" * 3000 + "a" * 10_000 + "ab" * 2000,
    "\r\n" * 700 + "\t" * 600 + "é" * 3000 + "日本" * 2000 + "\U0001f600" * 500,
    "It's I'M we'll YOU'RE they've he'D 's 'T 'Ll",
    "1234567890" * 300 + " 3.14159 ٣٤٥ ⅷ ½",
    "Cafe\u0301 naïve \u00a0\u3000\u2028 \u1680\ufdd0  b \x00\x01\x7f \ufeff\u200b",
    "def f(x):\n    if x:  # note\n        return {'a': [1, 2.5e-3, None]}\n\treturn x<<2\n",
]
_ALPHABET = "aZ 0\n\t\r.,'é日\u00a0\u2028\U0001f600-_=\u0301ß<|>"
RANDOM = [
    "".join(random.Random(i).choice(_ALPHABET) for _ in range(random.Random(-i).randint(0, 80))) for i in range(300)
]


# Without quicktok


def _plan(pat_str: str, top: int = 255) -> Plan:
    ranks = {bytes([b]): b for b in range(256)}
    if top > 255:
        ranks[b"ab"] = top
    return Plan(pat_str=pat_str, ranks=ranks)


def test_quicktok_runs_cl100ks_regex_only_and_ids_below_2_18() -> None:
    assert refusal("quicktok", _plan(CL100K_PATTERN)) is None
    assert refusal("quicktok", _plan(CL100K_POSSESSIVE_PATTERN)) is None
    assert refusal("quicktok", _plan(GPT2_PATTERN)) == "quicktok runs cl100k's split regex only"
    assert refusal("quicktok", _plan(CL100K_PATTERN, top=MAX_ID)) is None
    assert "below 2**18" in str(refusal("quicktok", _plan(CL100K_PATTERN, top=MAX_ID + 1)))
    assert refusal("riptoken", _plan(GPT2_PATTERN)) is None  # the others are left to their self-check


def test_the_possessive_cl100k_regex_splits_as_the_tokenizer_json_one() -> None:
    """The two spellings of cl100k's regex (tiktoken's, the tokenizer.json's) cut the same pieces."""
    regex = pytest.importorskip("regex", reason="the regex module (a tiktoken dependency) is not installed")
    ours, theirs = regex.compile(CL100K_PATTERN), regex.compile(CL100K_POSSESSIVE_PATTERN)
    for text in [*TEXTS, *RANDOM]:
        pieces = [[m.group() for m in r.finditer(text)] for r in (ours, theirs)]  # (ours has a group: not findall)
        assert pieces[0] == pieces[1] and "".join(pieces[0]) == text, repr(text[:60])


def test_the_vocab_file_holds_every_rank_in_order() -> None:
    ranks = {b"b": 1, b"a": 0, b"\xff\x00": 7, b"abc": 3}
    data = _vocab_bytes(ranks)
    (count,), pos, got = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<H", data, pos)
        token = data[pos + 2 : pos + 2 + n]
        (got[token],) = struct.unpack_from("<I", data, pos + 2 + n)
        pos += 2 + n + 4
    assert pos == len(data) and got == ranks and list(got.values()) == [0, 1, 3, 7]


def test_ids_without_a_token_get_fillers_bpe_never_makes() -> None:
    ranks = {bytes([b]): b for b in range(256)} | {b"\xf8\x00": 256, b"ab": 300, b"abc": 305}
    dense = with_fillers(ranks)
    fillers = {t: i for t, i in dense.items() if t not in ranks}
    assert sorted(dense.values()) == list(range(306)) and dense.items() >= ranks.items()
    assert sorted(fillers.values()) == [*range(257, 300), *range(301, 305)]
    for token in fillers:  # neither cut of a filler is a pair of tokens: no merge makes it
        assert len(token) == 3 and token[0] == 0xF8 and token[:2] not in dense and token[1:] not in dense
    assert with_fillers(ranks | dense) == dense and with_fillers({b"a": 0}) == {b"a": 0}


class _Lists:
    """A batch encoder without a batch call (the path every other engine takes)."""

    def __init__(self, ids: list[list[int]]) -> None:
        self.ids = ids

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [list(i) for i in self.ids]


class _Flat(_Lists):
    def flat(self, texts: list[str]) -> tuple[Any, Any]:
        offsets = np.cumsum([0, *map(len, self.ids)])
        return np.array([t for i in self.ids for t in i], dtype=np.uint32), offsets


def _tok(encoder: Any) -> Tokenizer:
    return Tokenizer("t", "0" * 64, 70_000, "test", None, None, None, None, _encode_batch=encoder)


@pytest.fixture(params=["slices", "mask"])
def fill(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the batch path fills its output: a slice copy a text (long texts), or one mask (short ones)."""
    monkeypatch.setattr(workers, "SLICES_FROM", 0 if request.param == "slices" else 10**9)
    return str(request.param)


@pytest.mark.parametrize("typecode", ["I", "H"])
@pytest.mark.parametrize(("eos", "bos"), [(9, None), (9, 5), (9, 9), (None, 5), (None, None), (0, 0)])
def test_the_batch_path_adds_bos_and_eos_as_the_list_path_does(
    eos: int | None, bos: int | None, typecode: str, fill: str
) -> None:
    rng = random.Random(0)
    ids = [[], [9], [5], [5, 9], [9, 5], [0], [1, 2, 3]]
    ids += [[rng.choice([0, 5, 9, 60_000]) for _ in range(rng.randint(0, 6))] for _ in range(200)]
    texts = ["x"] * len(ids)
    flat, lengths = _encode(_tok(_Flat(ids)), texts, eos, bos, typecode)
    expected, expected_lengths = _encode(_tok(_Lists(ids)), texts, eos, bos, typecode)
    assert flat.dtype == np.dtype(typecode) and flat.tolist() == expected.tolist() and lengths == expected_lengths


@pytest.mark.parametrize(("eos", "bos"), [(9, None), (70_000, None), (None, 70_000), (70_000, 70_000)])
def test_an_empty_batch_gives_an_empty_array_as_the_list_path_does(eos: int | None, bos: int | None, fill: str) -> None:
    """Whatever its BOS and EOS (even ones too large for the dtype: no text takes them)."""
    for encoder in (_Flat([]), _Lists([])):
        flat, lengths = _encode(_tok(encoder), [], eos, bos, "H")
        assert flat.tolist() == [] and lengths == []
    assert _encode(_tok(_Flat([])), [], eos, bos, "H")[0].dtype == np.uint16


def test_offsets_that_do_not_cover_the_ids_are_refused(fill: str) -> None:
    """Never a silent drop of ids: the fill copies what the offsets cover, so they must cover every id."""
    from olmo_data.tokenize.workers import _with_bos_eos

    tokens = np.array([1, 2, 3], dtype=np.uint32)
    for offsets in ([0, 2], [1, 3], [0, 1, 4]):
        with pytest.raises(ValueError, match="offsets cover ids"):
            _with_bos_eos(tokens, np.array(offsets, dtype=np.int64), 9, None, "H")


def test_the_batch_path_checks_the_dtype_as_the_list_path_does(fill: str) -> None:
    ids = [[1, 2], [3, 65_535], [4, 70_000, 5], [80_000]]
    for encoder in (_Flat(ids), _Lists(ids)):
        with pytest.raises(TokenIdTooLarge) as e:
            _encode(_tok(encoder), ["x"] * 4, 9, None, "H")
        assert (e.value.doc, e.value.token) == (2, 70_000)
    flat, _ = _encode(_tok(_Flat(ids[:2])), ["x"] * 2, 9, None, "H")
    assert flat.dtype == np.uint16 and flat.tolist() == [1, 2, 9, 3, 65_535, 9]
    for eos, bos, where in [(70_000, None, 0), (None, 70_000, 0), (9, 70_000, 0)]:  # an added id that does not fit
        for encoder in (_Flat([[1, 2], [3]]), _Lists([[1, 2], [3]])):
            with pytest.raises(TokenIdTooLarge) as e:
                _encode(_tok(encoder), ["x"] * 2, eos, bos, "H")
            assert (e.value.doc, e.value.token) == (where, 70_000)
    for encoder in (_Flat([[1, 2], [70_000]]), _Lists([[1, 2], [70_000]])):  # the EOS fits, the text's id not
        with pytest.raises(TokenIdTooLarge) as e:
            _encode(_tok(encoder), ["x"] * 2, 9, None, "H")
        assert (e.value.doc, e.value.token) == (1, 70_000)


def test_cli_names_quicktok() -> None:
    result = CliRunner().invoke(main, ["tokenize", "-d", "x", "-t", "y", "--backend", "bpe"])
    assert result.exit_code == 2 and "'auto', 'quicktok', 'fastokens', 'riptoken', 'tiktoken', 'hf'" in result.output


# With quicktok


@NEEDS_QUICKTOK
def test_our_regex_and_files_are_what_quicktok_knows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its cl100k scanner is keyed by the pattern we name, and the rank file we write is byte for byte the one it
    ships for cl100k; a folder missing a file is completed, and an unwritable cache costs only a temporary folder."""
    import dataclasses

    import quicktok
    from quicktok import _import_core

    from olmo_data.tokenizer.quicktok_engine import ENCODING, QuicktokPieces, write_encoding
    from olmo_data.tokenizer.tiktoken_backend import load_tiktoken_file

    assert _import_core.CL100K_PAT_POSSESSIVE == CL100K_POSSESSIVE_PATTERN
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    plan = load_tiktoken_file(shared_tokenizer("cl100k_base.tiktoken"), engine="tiktoken")._encode_batch.plan
    folder = Path(write_encoding(plan))
    shipped = Path(quicktok.__file__).parent / "data" / "cl100k.vocab"
    assert (folder / f"{ENCODING}.vocab").read_bytes() == shipped.read_bytes()
    (folder / "uniclass.bin").unlink()
    assert write_encoding(plan) == str(folder) and (folder / "uniclass.bin").is_file()  # the same folder, completed
    vocab = folder / f"{ENCODING}.vocab"
    damaged = bytearray(vocab.read_bytes())
    damaged[100] ^= 1  # a flipped bit in a token: the folder is written again before quicktok reads it
    vocab.write_bytes(bytes(damaged))
    assert write_encoding(plan) == str(folder) and vocab.read_bytes() == shipped.read_bytes()
    other = dataclasses.replace(plan, ranks={**plan.ranks, b"not a token yet": len(plan.ranks)})
    assert Path(write_encoding(other)) != folder  # other ranks, another folder
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "file"))  # (a file: no folder can be made in it)
    assert QuicktokPieces(plan)("hello world") == [15339, 1917]
    assert not list(Path(tempfile.gettempdir()).glob("olmo-data-quicktok-*"))  # the temporary folder is gone


@NEEDS_QUICKTOK
@pytest.mark.parametrize("name", ["cl100k_base.json", "dolma2"])
def test_ids_equal_tokenizers_text_by_text_and_in_a_batch(name: str, dolma2: str, demo_corpus: list[str]) -> None:
    from olmo_data.documents import read_documents

    spec = dolma2 if name == "dolma2" else shared_tokenizer(name)
    tok, hf = load_tokenizer(spec, "auto"), load_tokenizer(spec, "hf")
    assert tok.backend == "quicktok"
    texts = [*TEXTS, *RANDOM, *(d.text for d in read_documents(demo_corpus[0]))]
    expected = [e.ids for e in hf.hf.encode_batch_fast(texts, add_special_tokens=False)]
    assert expected[3].count(100257) == 3 and expected[0] == []  # added tokens in the text, an empty text
    got = tok.encode_batch(texts)
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert a == b, f"document {i} differs: {texts[i][:60]!r}"
    tokens, offsets = tok.encode_flat(texts)  # type: ignore[misc]
    assert tokens.dtype == np.uint32 and len(offsets) == len(texts) + 1
    assert tokens.tolist() == [t for ids in expected for t in ids] and np.diff(offsets).tolist() == list(map(len, got))
    plain = [t for t in texts if "<|" not in t]
    tokens, offsets = tok.encode_flat(plain)  # type: ignore[misc]  # (one engine call)
    assert tokens.tolist() == [t for ids in tok.encode_batch(plain) for t in ids]
    tok.set_num_threads(2)  # the engine's own threads (tokenize gives a worker more once inputs run out)
    threaded, same_offsets = tok.encode_flat(texts)  # type: ignore[misc]
    assert threaded.tolist() == [t for ids in expected for t in ids] and np.diff(same_offsets).tolist() == list(
        map(len, got)
    )


@NEEDS_QUICKTOK
def test_a_lone_surrogate_is_encoded_as_tiktoken_does() -> None:
    """`tokenizers` refuses a str holding one; tiktoken encodes it as U+FFFD, and so does quicktok (which refuses it
    too), text by text and in a batch."""
    tok = load_tokenizer(shared_tokenizer("cl100k_base.json"), "quicktok")
    tiktoken = load_tokenizer(shared_tokenizer("cl100k_base.json"), "tiktoken")
    for text in ("x\ud800y", "\udfff", "a \ud83d\ude00 \ud800\udc00b \udc00"):  # (a pair of them is one character)
        replaced = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        assert replaced.count("\ufffd") == 1
        assert tok.encode(text) == tiktoken.encode(text) == tiktoken.encode(replaced)
        tokens, _ = tok.encode_flat(["ok", text])  # type: ignore[misc]
        assert tokens.tolist() == tiktoken.encode("ok") + tiktoken.encode(text)


@NEEDS_QUICKTOK
@pytest.mark.parametrize("name", ["gpt2.json", "gpt-neox-20b.json"])
def test_gpt2_and_neox_keep_their_engine_and_refuse_quicktok(name: str, tmp_path: Path) -> None:
    spec = shared_tokenizer(name)
    others = [e for e in ("fastokens", "riptoken") if available(e)]  # (GPT-2's regex: the next fastest engine)
    assert load_tokenizer(spec, "auto").backend == (others[0] if others else "tiktoken")
    with pytest.raises(DataError, match=rf"{name}: the quicktok backend cannot .*quicktok runs cl100k's split regex"):
        load_tokenizer(spec, "quicktok")
    data = write_jsonl(tmp_path / "in.jsonl", docs("hello"))
    args = ["tokenize", "-d", data, "-t", spec, "--backend", "quicktok", "--destination", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "quicktok runs cl100k's split regex only" in result.output


@NEEDS_QUICKTOK
def test_auto_takes_quicktok_from_the_cache_and_pickled_copies_encode_alike(
    dolma2: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    first, again = load_tokenizer(dolma2, "auto"), load_tokenizer(dolma2, "auto")
    assert (first.backend, again.backend) == ("quicktok", "quicktok") and first.hf is not None and again.hf is None
    copy = pickle.loads(pickle.dumps(again))
    assert copy.encode_batch(TEXTS) == first.encode_batch(TEXTS) and copy.decode(first.encode(TEXTS[3])) == TEXTS[3]


@NEEDS_QUICKTOK
def test_tokenize_writes_the_same_bytes_on_quicktok_and_tiktoken(
    dolma2: str, demo_corpus: list[str], tmp_path: Path
) -> None:
    bad = [b'{"id": "bad-utf8", "text": "caf\xe9"}\n', b'{"id": "bad-escape", "text": "\\ud800"}\n']
    tricky = write_jsonl(tmp_path / "tricky.jsonl", docs(*[t for t in TEXTS if t.strip()], *RANDOM), raw_lines=bad)
    outputs = []
    for backend in ("quicktok", "tiktoken", "auto"):
        dest = tmp_path / backend
        args = ["tokenize", "-d", demo_corpus[0], "-d", tricky, "-t", dolma2, "--backend", backend]
        result = CliRunner().invoke(main, [*args, "--destination", str(dest), "--no-progress", "--skip-bad-documents"])
        assert result.exit_code == 0, result.output
        assert f"{'quicktok' if backend == 'auto' else backend} backend)" in result.output
        outputs.append({p.name: p.read_bytes() for p in sorted(dest.iterdir()) if p.is_file()})
    assert len(outputs[0]) >= 3 and outputs[0] == outputs[1] == outputs[2]
