"""Every engine gives the same token files: fastokens, riptoken, tiktoken and HF `tokenizers`, with any process count.

Covers OLMo 2/3's dolma2 tokenizer too (cl100k's BPE with its own added tokens), built offline from the shared
cl100k tokenizer.json: `<|endoftext|>` 100257, `<|fim_prefix|>` 100258, `<|fim_middle|>` 100259, `<|fim_suffix|>`
100260, `<|endofprompt|>` 100276 and `<|pad|>` 100277, all special; cl100k's reserved tokens 100261-100275 left out
(assumed: dolma2 does not list them, which changes nothing for ids below them).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.documents import read_documents
from olmo_data.errors import DataError
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import load_tokenizer
from olmo_data.tokenizer.engines import available
from tests.conftest import shared_tokenizer
from tests.helpers import docs, write_jsonl

ENGINES = [e for e in ("fastokens", "riptoken", "tiktoken") if available(e)]
# fastokens refuses a vocabulary with a gap in its ids (dolma2's, cl100k's: none at 100256)
GAPLESS = [e for e in ENGINES if e != "fastokens"]
TRICKY = [
    "x\n\n    y  z\t\t  w \n  \n" + " " * 49 + "v",
    "text<|endoftext|>more <|pad|><|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>c<|endofprompt|> end",
    "<|reserved_100261|> is plain text here",
    "a\u1680\ufdd0  b \ufdd0 c",
    "q" * 700 + " " + "\n" * 600 + "日本" * 200,
    "Cafe\u0301 naïve 😀 \u00a0\u3000 ٣٤٥",
]


def test_dolma2_ids_equal_tokenizers_on_every_engine(dolma2: str, demo_corpus: list[str]) -> None:
    hf = load_tokenizer(dolma2, "hf")
    assert (hf.eos_token_id, hf.pad_token_id) == (100257, 100277)
    texts = [d.text for d in read_documents(demo_corpus[0])] + TRICKY
    expected = [e.ids for e in hf.hf.encode_batch_fast(texts, add_special_tokens=False)]
    assert expected[len(texts) - len(TRICKY) + 1].count(100277) == 1
    if "fastokens" in ENGINES:
        with pytest.raises(DataError, match="fastokens needs the vocabulary's ids to be 0..n-1.*id 100256 has no"):
            load_tokenizer(dolma2, "fastokens")
    for engine in GAPLESS:
        tok = load_tokenizer(dolma2, engine)  # type: ignore[arg-type]
        assert (tok.backend, tok.eos_token_id, tok.pad_token_id) == (engine, 100257, 100277)
        got = tok.encode_batch(texts)
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            assert a == b, f"{engine}: document {i} differs: {texts[i][:60]!r}"


def _files(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dest.iterdir()) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt-neox-20b.json", "gpt2.json", "dolma2"])
def test_token_files_are_byte_identical_on_every_backend_and_process_count(
    name: str, dolma2: str, demo_corpus: list[str], tmp_path: Path
) -> None:
    """The manifest and every part file, .npy and .csv.gz: the backend is not recorded in them (it does not
    change a byte); bad documents (invalid UTF-8, a lone surrogate escape) skipped alike."""
    spec = dolma2 if name == "dolma2" else shared_tokenizer(name)
    bad = [b'{"id": "bad-utf8", "text": "caf\xe9"}\n', b'{"id": "bad-escape", "text": "\\ud800"}\n']
    tricky = write_jsonl(tmp_path / "tricky.jsonl", docs(*TRICKY), raw_lines=bad)
    inputs = [*demo_corpus[:2], tricky]
    reference = None
    for backend in ("hf", *(GAPLESS if name == "dolma2" else ENGINES)):
        for processes in (1, 2) if backend != "hf" else (1,):
            dest = tmp_path / f"{backend}-{processes}"
            opts = TokenizeOptions(tokenizer=spec, backend=backend, skip_bad_documents=True)
            summary = tokenize(inputs, dest, opts, processes=processes)
            assert summary.backend == backend and summary.skipped_bad == 2
            files = _files(dest)
            if reference is None:
                reference = files
            assert files.keys() == reference.keys()
            for file, data in files.items():
                assert data == reference[file], f"{backend}, {processes} processes: {file} differs"


def test_cli_backend_option_names_each_engine(demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path) -> None:
    for backend in (*ENGINES, "hf"):
        args = ["tokenize", "-d", demo_corpus[0], "-t", demo_tokenizer, "--backend", backend]
        result = CliRunner().invoke(main, [*args, "--destination", str(tmp_path / backend), "--no-progress"])
        assert result.exit_code == 0, result.output
        assert f"{backend} backend)" in result.output
    result = CliRunner().invoke(main, ["tokenize", "-d", demo_corpus[0], "-t", demo_tokenizer, "--backend", "bpe"])
    choices = "'auto', 'quicktok', 'fastokens', 'riptoken', 'tiktoken', 'hf'"
    assert result.exit_code == 2 and f"'bpe' is not one of {choices}" in result.output


def test_reading_thread_hands_over_errors_and_stops_with_its_caller() -> None:
    """Documents are read in a thread while the batch before is encoded: its errors are raised in the caller, and a
    caller that stops early ends it (the reader's generator closed, its file with it)."""
    import threading

    from olmo_data.errors import DataError as Error
    from olmo_data.tokenize.reading import prefetched

    closed: list[bool] = []

    def failing():  # type: ignore[no-untyped-def]
        try:
            yield 1
            raise Error("in.jsonl:2: not JSON")
        finally:
            closed.append(True)

    got = []
    with pytest.raises(Error, match=r"in\.jsonl:2: not JSON"):
        for item in prefetched(failing()):  # type: ignore[arg-type]
            got.append(item)
    assert got == [1] and closed == [True]

    def endless():  # type: ignore[no-untyped-def]
        try:
            n = 0
            while True:
                n += 1
                yield n
        finally:
            closed.append(True)

    stream = prefetched(endless())  # type: ignore[arg-type]
    assert [next(stream), next(stream)] == [1, 2]
    stream.close()
    assert closed == [True, True]
    assert not [t for t in threading.enumerate() if t.name == "olmo-data-read"]


def test_token_files_are_byte_identical_with_and_without_the_fast_readers(
    demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `fast` extra's readers (msgspec, isal: `olmo_data.documents`) change no byte of the output, bad and
    tricky lines (skipped or read) included."""
    import olmo_data.documents as documents
    from tests.data.test_documents import TRICKY_LINES

    tricky = write_jsonl(tmp_path / "tricky.jsonl.gz", docs(*TRICKY), raw_lines=[b + b"\n" for b in TRICKY_LINES])
    outputs = []
    for fast in (True, False):
        monkeypatch.setattr(documents, "FAST_READING", fast)
        dest = tmp_path / f"fast-{fast}"
        opts = TokenizeOptions(tokenizer=demo_tokenizer, skip_bad_documents=True)
        summary = tokenize([demo_corpus[0], tricky], dest, opts, processes=1)
        assert summary.skipped_bad == 14
        outputs.append(_files(dest))
    assert outputs[0] == outputs[1]
