"""Chat preparation: template layouts token for token, label masks, truncation, packing, determinism,
bad rows."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from olmo_data import chat
from olmo_data.chat import ChatOptions, encode_conversations, prepare_chat, read_doc_boundaries
from olmo_data.errors import DataError
from olmo_data.tokenizer import load_tokenizer
from tests.conftest import shared_tokenizer

EOS, PAD = 0, 1  # the demo tokenizer's <|endoftext|> and <|padding|>

MULTI_TURN = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "  What colour is the sky?\n"},
    {"role": "assistant", "content": " Blue. \n"},
    {"role": "user", "content": "And grass?"},
    {"role": "assistant", "content": "Green."},
]


def write_jsonl(path: Path, rows: list[Any]) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def pairs(messages: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


def read_outputs(dest: Path) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]], dict[str, Any]]:
    manifest = json.loads((dest / "manifest.json").read_text())
    ids = np.fromfile(dest / "input_ids.npy", dtype=manifest["dtype"])
    mask = np.fromfile(dest / "label_mask.npy", dtype=np.bool_)
    meta = [json.loads(line) for line in (dest / "metadata.jsonl").read_text().splitlines()]
    return ids, mask, meta, manifest


@pytest.fixture(scope="module")
def tok(demo_tokenizer: str) -> Any:
    return load_tokenizer(demo_tokenizer, "hf")


# ------------------------------------------------------------------------------------------------------------
# The olmo template, token for token


def olmo_pieces(enc: Any) -> list[tuple[list[int], bool]]:
    """Hand-written layout of MULTI_TURN in OLMo's prepare_tulu_data.py: leading EOS; each header encoded
    alone; stripped content, encoded with its newline for non-assistants; assistant content, EOS, newline."""
    return [
        ([EOS], False),
        (enc("<|system|>\n"), False),
        (enc("You answer in one word.\n"), False),
        (enc("<|user|>\n"), False),
        (enc("What colour is the sky?\n"), False),
        (enc("<|assistant|>\n"), False),
        (enc("Blue."), True),
        ([EOS], True),
        (enc("\n"), False),
        (enc("<|user|>\n"), False),
        (enc("And grass?\n"), False),
        (enc("<|assistant|>\n"), False),
        (enc("Green."), True),
        ([EOS], True),
        (enc("\n"), False),
    ]


def test_olmo_template_multi_turn_with_system_message(tok: Any, demo_tokenizer: str, tmp_path: Path) -> None:
    pieces = olmo_pieces(tok.encode)
    expected_ids = [t for ids, _ in pieces for t in ids]
    expected_mask = [m for ids, m in pieces for _ in ids]

    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "c1", "dataset": "demo", "messages": MULTI_TURN}])
    L = len(expected_ids) + 7
    summary = prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=L))
    ids, mask, meta, manifest = read_outputs(tmp_path / "out")

    assert ids.tolist() == expected_ids + [PAD] * 7
    assert mask.tolist() == expected_mask + [False] * 7
    # the trained tokens are exactly the stripped assistant replies, each followed by EOS
    assert tok.decode(ids[mask]) == "Blue.<|endoftext|>Green.<|endoftext|>"
    n = len(expected_ids)
    assert meta == [
        {
            "id": "c1",
            "dataset": "demo",
            "src": src,
            "row": 1,
            "tokens": n,
            "trained_tokens": sum(expected_mask),
            "full_tokens": n,
            "truncated": False,
            "instance": 0,
            "start": 0,
            "end": n,
        }
    ]
    assert (summary.read, summary.written, summary.instances, summary.padding_tokens) == (1, 1, 1, 7)
    assert manifest["format"] == "olmo-data.chat" and manifest["dtype"] == "uint16"
    assert (manifest["eos_token_id"], manifest["pad_token_id"], manifest["sequence_length"]) == (EOS, PAD, L)


def test_olmo_template_truncates_on_the_right(tok: Any, demo_tokenizer: str, tmp_path: Path) -> None:
    pieces = olmo_pieces(tok.encode)
    full_ids = [t for ids, _ in pieces for t in ids]
    full_mask = [m for ids, m in pieces for _ in ids]
    cut = sum(len(ids) for ids, _ in pieces[:12]) + 1  # keep only the first token of "Green."
    assert len(tok.encode("Green.")) > 1
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": MULTI_TURN}])
    summary = prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=cut))
    ids, mask, meta, _ = read_outputs(tmp_path / "out")

    assert ids.tolist() == full_ids[:cut] and mask.tolist() == full_mask[:cut]
    assert mask[-1] and not mask[-2]  # the kept token of "Green." is trained; the header before it is not
    assert meta[0]["truncated"] is True and meta[0]["full_tokens"] == len(full_ids) > cut
    assert meta[0]["tokens"] == cut and meta[0]["trained_tokens"] == int(mask.sum())
    assert summary.truncated == 1 and summary.padding_tokens == 0


def test_conversations_with_nothing_trained_are_dropped_by_reason(demo_tokenizer: str, tmp_path: Path) -> None:
    rows = [
        {
            "id": "no-assistant",
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        },
        {
            "id": "kept",
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
        },
        {
            "id": "cut",
            "messages": [{"role": "user", "content": "word " * 50}, {"role": "assistant", "content": "A"}],
        },
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    summary = prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=24))
    _, _, meta, manifest = read_outputs(tmp_path / "out")
    assert [m["id"] for m in meta] == ["kept"]
    assert summary.dropped == {"no_assistant_message": 1, "no_trained_token_after_truncation": 1}
    assert (summary.read, summary.written) == (3, 1)
    assert manifest["totals"]["dropped"] == summary.dropped
    assert "dropped 2 (1 no assistant message, 1 no trained token after truncation)" in summary.line()


def test_everything_dropped_is_an_error_and_leaves_nothing(demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": [{"role": "user", "content": "alone"}]}])
    with pytest.raises(DataError, match="no conversation left to write: read 1, dropped 1 without an assistant"):
        prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=32))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend", ["hf", "auto"])  # auto: the fast backend where it is exact
def test_olmo_template_matches_olmo_reference_on_gpt_neox(tmp_path: Path, backend: str) -> None:
    """OLMo's preprocess (scripts/prepare_tulu_data.py), restated with `tokenizers`, on GPT-NeoX-20B."""
    from tokenizers import Tokenizer as HFTokenizer

    path = shared_tokenizer("gpt-neox-20b.json")
    hf = HFTokenizer.from_file(path)
    eos, pad, L = 0, 1, 96

    def reference(messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
        ids, mask = [eos], [False]
        for m in messages:
            header = hf.encode(f"<|{m['role']}|>\n", add_special_tokens=False).ids
            ids, mask = ids + header, mask + [False] * len(header)
            if m["role"] == "assistant":
                body = hf.encode(m["content"].strip() + "<|endoftext|>" + "\n", add_special_tokens=False).ids
                assert body[-2] == eos
                ids, mask = ids + body, mask + [True] * (len(body) - 1) + [False]
            else:
                body = hf.encode(m["content"].strip() + "\n", add_special_tokens=False).ids
                ids, mask = ids + body, mask + [False] * len(body)
        ids, mask = ids[:L], mask[:L]
        return ids + [pad] * (L - len(ids)), mask + [False] * (L - len(mask))

    conversations = [
        MULTI_TURN,
        [
            {"role": "user", "content": "Write   code:\n\tdef f():  return 1"},
            {"role": "assistant", "content": ""},
        ],
        [
            {"role": "user", "content": "Ünïcödé — “quotes” 東京"},
            {"role": "assistant", "content": "  x  =  1\n\n"},
        ],
        [
            {"role": "user", "content": "long " * 120},
            {"role": "assistant", "content": "cut off"},
        ],  # all masked
        [{"role": "user", "content": "a " * 40}, {"role": "assistant", "content": "b " * 80}],  # truncated
    ]
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in conversations])
    prepare_chat([src], tmp_path / "out", ChatOptions(path, seq_len=L, backend=backend))
    ids, mask, meta, manifest = read_outputs(tmp_path / "out")
    expected = [reference(c) for c in conversations]
    kept = [e for e in expected if any(e[1])]  # OLMo filters examples with no label
    assert len(kept) == 4 and len(meta) == 4
    assert ids.reshape(-1, L).tolist() == [e[0] for e in kept]
    assert mask.reshape(-1, L).tolist() == [e[1] for e in kept]
    assert manifest["dtype"] == "uint16" and os.path.getsize(tmp_path / "out" / "input_ids.npy") == 4 * L * 2


# ------------------------------------------------------------------------------------------------------------
# The tulu template


def test_tulu_template_layout_and_mask(tok: Any) -> None:
    enc = tok.encode
    ids, mask, _ = encode_conversations(tok, [pairs(MULTI_TURN)], template="tulu", eos_token_id=EOS)[0]
    # Hand-written layout: the text between two EOS tokens is one string; its untrained head is as many tokens
    # as that head encodes to on its own. Content is not stripped; no newline after the last message.
    prompt_1 = "<|system|>\nYou answer in one word.\n<|user|>\n  What colour is the sky?\n\n<|assistant|>\n"
    prompt_2 = "\n<|user|>\nAnd grass?\n<|assistant|>\n"  # the newline after an assistant's EOS is untrained
    expected_ids = enc(prompt_1 + " Blue. \n") + [EOS] + enc(prompt_2 + "Green.") + [EOS]
    n1, n2 = len(enc(prompt_1 + " Blue. \n")), len(enc(prompt_2 + "Green."))
    expected_mask = (
        [False] * len(enc(prompt_1))
        + [True] * (n1 - len(enc(prompt_1)) + 1)
        + [False] * len(enc(prompt_2))
        + [True] * (n2 - len(enc(prompt_2)) + 1)
    )
    assert ids == expected_ids and mask == expected_mask
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == " Blue. \n<|endoftext|>Green.<|endoftext|>"
    rendered = prompt_1 + " Blue. \n<|endoftext|>" + prompt_2 + "Green.<|endoftext|>"
    assert tok.decode(ids) == rendered


def test_tulu_template_trains_an_assistant_header_not_preceded_by_a_prompt(tok: Any) -> None:
    messages = [("assistant", "Hello."), ("assistant", "Again."), ("user", "Bye")]
    ids, mask, _ = encode_conversations(tok, [messages], template="tulu", eos_token_id=EOS)[0]
    enc = tok.encode
    trained = enc("<|assistant|>\nHello.") + [EOS] + enc("\n<|assistant|>\nAgain.") + [EOS]
    assert ids == trained + enc("\n<|user|>\nBye\n")
    assert mask == [True] * len(trained) + [False] * len(enc("\n<|user|>\nBye\n"))


def test_tulu_template_matches_open_instruct_reference_on_gpt_neox() -> None:
    """open-instruct's template and its sft_tulu_tokenize_and_truncate_v1 labels, restated with `tokenizers`:
    the whole rendered conversation encoded at once; each non-assistant message untrained from the token count
    of the rendering before it to that of the rendering through it (plus "<|assistant|>\n" if one follows)."""
    from tokenizers import Tokenizer as HFTokenizer

    path = shared_tokenizer("gpt-neox-20b.json")
    hf = HFTokenizer.from_file(path)
    tok = load_tokenizer(path, "hf")

    def rendered(messages: list[tuple[str, str]], generation_prompt: bool = False) -> str:
        text = ""
        for i, (role, content) in enumerate(messages):
            last = i == len(messages) - 1
            text += f"<|{role}|>\n{content}" + ("<|endoftext|>" if role == "assistant" else "\n")
            text += "\n" if role == "assistant" and not last else ""
        return text + ("<|assistant|>\n" if generation_prompt else "")

    def count(text: str) -> int:
        return len(hf.encode(text, add_special_tokens=False).ids)

    def reference(messages: list[tuple[str, str]]) -> tuple[list[int], list[bool]]:
        ids = hf.encode(rendered(messages), add_special_tokens=False).ids
        mask = [True] * len(ids)
        for i, (role, _) in enumerate(messages):
            if role != "assistant":
                start = count(rendered(messages[:i])) if i else 0
                prompt = i + 1 < len(messages) and messages[i + 1][0] == "assistant"
                end = count(rendered(messages[: i + 1], generation_prompt=prompt))
                mask[start:end] = [False] * (end - start)
        return ids, mask

    conversations = [
        pairs(MULTI_TURN),
        [("user", "Q?\n"), ("assistant", "\n\nA reply opening with newlines")],  # merges across the boundary
        [("system", "S"), ("assistant", "first"), ("assistant", "  second  "), ("user", "trailing question")],
        [("user", "Ünïcödé — “quotes” 東京   spaces   "), ("assistant", "ok.\t")],
    ]
    ours = encode_conversations(tok, conversations, template="tulu", eos_token_id=0)
    for messages, (ids, mask, _) in zip(conversations, ours, strict=True):
        assert (ids, mask) == reference(messages), messages


def test_unknown_template_is_refused(demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": MULTI_TURN}])
    with pytest.raises(
        DataError,
        match="unknown template 'chatml'; expected olmo, tulu, tokenizer, or the path of a chat-template file",
    ):
        prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=64, template="chatml"))


# ------------------------------------------------------------------------------------------------------------
# Packing


def realistic_conversations(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Chat lengths like an SFT mix: many short exchanges, a long tail, some multi-turn, a few over-long."""
    rng = np.random.default_rng(seed)
    words = "the model reads data and writes tokens while a user asks why the loss goes down slowly".split()
    rows = []
    for i in range(n):
        turns = int(rng.choice([1, 1, 1, 2, 3]))
        messages = []
        for _ in range(turns):
            for role, scale in (("user", 15), ("assistant", 40)):
                length = max(1, int(rng.lognormal(np.log(scale), 0.9)))
                messages.append({"role": role, "content": " ".join(rng.choice(words, size=length))})
        rows.append({"id": f"conv-{i}", "dataset": "mix", "messages": messages})
    return rows


def test_pack_cuts_padding_and_keeps_each_conversation_intact(demo_tokenizer: str, tmp_path: Path) -> None:
    L = 1024  # lengths here: median ~190 tokens, mean ~260, 1% longer than L (as Tulu V2 at L=4096)
    src = write_jsonl(tmp_path / "in.jsonl", realistic_conversations(300))
    padded = prepare_chat([src], tmp_path / "padded", ChatOptions(demo_tokenizer, seq_len=L))
    packed = prepare_chat([src], tmp_path / "packed", ChatOptions(demo_tokenizer, seq_len=L, pack=True))
    p_ids, p_mask, p_meta, _ = read_outputs(tmp_path / "padded")
    k_ids, k_mask, k_meta, k_manifest = read_outputs(tmp_path / "packed")

    def realized_padding(ids: np.ndarray, bounds: np.ndarray) -> float:
        covered = np.zeros(len(ids), dtype=bool)
        for start, end in bounds:
            assert not covered[start:end].any()  # examples never overlap
            covered[start:end] = True
        assert (ids[~covered] == PAD).all()  # everything else is padding
        return float((~covered).mean())

    pad_padded = realized_padding(p_ids, read_doc_boundaries(str(tmp_path / "padded")))
    pad_packed = realized_padding(k_ids, read_doc_boundaries(str(tmp_path / "packed")))
    assert pad_padded == pytest.approx(padded.padding_share) and pad_packed == pytest.approx(packed.padding_share)
    assert pad_padded > 0.5  # one conversation per instance wastes most of it
    assert pad_packed < 0.05  # first fit over a window of open instances fills them
    assert packed.instances < padded.instances / 2
    assert not k_mask[k_ids == PAD].any()

    # same conversations, same tokens and masks, each inside one instance
    assert sorted(m["id"] for m in k_meta) == sorted(m["id"] for m in p_meta) and len(k_meta) == 300
    assert packed.truncated == padded.truncated > 0  # the long tail reaches past L: truncated alike
    by_id = {m["id"]: m for m in p_meta}
    for m in k_meta:
        ref = by_id[m["id"]]
        assert m["start"] // L == m["instance"] == (m["end"] - 1) // L
        assert m["tokens"] == ref["tokens"] and m["trained_tokens"] == ref["trained_tokens"]
        assert (k_ids[m["start"] : m["end"]] == p_ids[ref["start"] : ref["end"]]).all()
        assert (k_mask[m["start"] : m["end"]] == p_mask[ref["start"] : ref["end"]]).all()
    assert k_manifest["pack"] is True and k_manifest["options"]["pack_window"] == chat.DEFAULT_PACK_WINDOW
    starts = [m["start"] for m in k_meta]
    assert starts == sorted(starts)  # side files are in file order


def test_dataset_reader_serves_instances_and_masks(demo_tokenizer: str, tmp_path: Path) -> None:
    from olmo_data.dataset.instances import open_dataset

    L = 128
    src = write_jsonl(tmp_path / "in.jsonl", realistic_conversations(40, seed=3))
    summary = prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=L, pack=True))
    ids, mask, _, _ = read_outputs(tmp_path / "out")
    out = str(tmp_path / "out")
    by_files = open_dataset([f"{out}/input_ids.npy"], label_mask_paths=[f"{out}/label_mask.npy"], sequence_length=L)
    by_dir = open_dataset([out], sequence_length=L)
    for source in (by_files, by_dir):
        assert len(source) == summary.instances
        tokens, masks = source.get_batch(np.arange(len(source))[::-1])
        assert masks is not None
        assert (tokens[::-1] == ids.reshape(-1, L)).all() and (masks[::-1] == mask.reshape(-1, L)).all()


# ------------------------------------------------------------------------------------------------------------
# Determinism, reruns, atomicity


@pytest.mark.parametrize("pack", [False, True])
def test_output_is_identical_whatever_the_process_count(
    demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack: bool
) -> None:
    monkeypatch.setattr("olmo_data.chat.prepare.CHUNK_CONVERSATIONS", 16)  # many chunks, so workers interleave
    src = write_jsonl(tmp_path / "in.jsonl", realistic_conversations(120, seed=1))
    for n in (1, 2):
        prepare_chat([src], tmp_path / f"p{n}", ChatOptions(demo_tokenizer, seq_len=128, pack=pack), processes=n)
    for name in (*chat.OUTPUT_FILES, "manifest.json"):
        assert (tmp_path / "p1" / name).read_bytes() == (tmp_path / "p2" / name).read_bytes(), name


def test_rerun_reuses_and_other_options_are_refused(demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": MULTI_TURN}])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".tmp-input_ids.npy.killed").write_bytes(b"left by a killed run")
    first = prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=64))
    assert not (tmp_path / "out" / ".tmp-input_ids.npy.killed").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([*chat.OUTPUT_FILES, "manifest.json"])
    before = (tmp_path / "out" / "input_ids.npy").stat().st_mtime_ns
    again = prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=64))
    assert again.reused and "already complete" in again.line()
    assert (again.written, again.tokens) == (first.written, first.tokens)
    assert (tmp_path / "out" / "input_ids.npy").stat().st_mtime_ns == before
    with pytest.raises(DataError, match="already holds olmo-data.chat output of a different run"):
        prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=65))


def test_a_bad_row_late_in_the_input_leaves_no_partial_output(demo_tokenizer: str, tmp_path: Path) -> None:
    rows: list[Any] = realistic_conversations(700)  # more than one chunk is written before the bad row
    rows.append({"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]})
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(DataError, match=r"in\.jsonl:701: message 2 has role 'robot'"):
        prepare_chat([src], tmp_path / "new", ChatOptions(demo_tokenizer, seq_len=64))
    assert not (tmp_path / "new").exists()
    (tmp_path / "existing").mkdir()
    packed_opts = ChatOptions(demo_tokenizer, seq_len=64, pack=True)
    with pytest.raises(DataError, match="robot"):
        prepare_chat([src], tmp_path / "existing", packed_opts, processes=2)
    assert list((tmp_path / "existing").iterdir()) == []


# ------------------------------------------------------------------------------------------------------------
# Bad rows and inputs


BAD_ROWS = [
    (
        {"messages": [{"role": "tool", "content": "x"}]},
        "message 1 has role 'tool'; expected one of system, user",
    ),
    ({"messages": []}, "field 'messages' is empty"),
    (
        {"messages": [{"role": "user", "content": ["a", "b"]}]},
        r"message 1 \(user\): 'content' is a list, not",
    ),
    (
        {"messages": [{"role": "user", "content": None}]},
        r"message 1 \(user\): 'content' is null, not a string",
    ),
    (
        {"messages": [{"role": "user", "content": "bad \ud800 escape"}]},
        r"message 1 \(user\): 'content' holds a lone surrogate escape",
    ),
    ({"conversation": []}, "field 'messages' is missing"),
    ({"messages": [{"content": "no role"}]}, "message 1 has no 'role'"),
    ({"messages": "hello"}, "field 'messages' is a str, not a list"),
    ('{"messages": [', "malformed JSON"),
    ('{"messages": []' + ', "m": ' + "[" * 100_000 + "]" * 100_000 + "}", "JSON nested too deeply"),
    ("[1, 2]", "expected a JSON object with 'messages', found list"),
    ("null", "expected a JSON object with 'messages', found NoneType"),
]


@pytest.mark.parametrize(("row", "message"), BAD_ROWS)
def test_bad_rows_name_file_and_line(demo_tokenizer: str, tmp_path: Path, row: Any, message: str) -> None:
    good = {"messages": MULTI_TURN}
    src = write_jsonl(tmp_path / "in.jsonl", [good, good, row, good])
    with pytest.raises(DataError, match=rf"in\.jsonl:3: {message}.*use --skip-bad-documents"):
        prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=64))
    summary = prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=64, skip_bad_rows=True))
    assert (summary.read, summary.written, summary.bad_rows) == (3, 3, 1)
    assert summary.bad_examples and "in.jsonl:3:" in summary.bad_examples[0]
    assert "1 bad rows skipped" in summary.line()


def test_parquet_input_gives_the_same_tokens_and_names_bad_rows(demo_tokenizer: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = realistic_conversations(30, seed=5)
    src_json = write_jsonl(tmp_path / "in.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    prepare_chat([src_json], tmp_path / "a", ChatOptions(demo_tokenizer, seq_len=128))
    prepare_chat([str(tmp_path / "in.parquet")], tmp_path / "b", ChatOptions(demo_tokenizer, seq_len=128))
    for name in ("input_ids.npy", "label_mask.npy", "doc_boundaries.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()

    bad = rows[:4] + [{"id": "x", "dataset": "d", "messages": [{"role": "user", "content": None}]}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: row 5: message 1 \(user\): 'content' is null"):
        prepare_chat([str(tmp_path / "bad.parquet")], tmp_path / "c", ChatOptions(demo_tokenizer, seq_len=128))
    pq.write_table(pa.table({"text": ["hi"]}), tmp_path / "text.parquet")
    with pytest.raises(DataError, match=r"text\.parquet: no column 'messages' \(columns: text\)"):
        prepare_chat([str(tmp_path / "text.parquet")], tmp_path / "d", ChatOptions(demo_tokenizer, seq_len=128))


def test_inputs_by_glob_in_order_with_default_ids(demo_tokenizer: str, tmp_path: Path) -> None:
    one = {"messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "one"}]}
    two = {"messages": [{"role": "user", "content": "2"}, {"role": "assistant", "content": "two"}]}
    write_jsonl(tmp_path / "b.jsonl", [two])
    write_jsonl(tmp_path / "a.jsonl", [one, one])
    opts = ChatOptions(demo_tokenizer, seq_len=32)
    prepare_chat([str(tmp_path / "*.jsonl")], tmp_path / "out", opts)
    _, _, meta, manifest = read_outputs(tmp_path / "out")
    assert [m["id"] for m in meta] == ["a.jsonl:1", "a.jsonl:2", "b.jsonl:1"]
    assert [os.path.basename(i["path"]) for i in manifest["inputs"]] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(DataError, match="unsupported file type"):
        prepare_chat([str(tmp_path / "a.jsonl"), __file__], tmp_path / "x", ChatOptions(demo_tokenizer, seq_len=32))


def test_hub_dataset_ids(demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails, as where it is not installed
    with pytest.raises(DataError, match="allenai/tulu-v2-sft-mixture: no such file; it looks like a Hugging Face"):
        prepare_chat(["allenai/tulu-v2-sft-mixture"], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=64))

    calls = []

    def load_dataset(name: str, split: str) -> list[dict[str, Any]]:
        calls.append((name, split))
        return [{"id": "h1", "dataset": "hub", "messages": MULTI_TURN}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    prepare_chat(["org/chat-set"], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=64, split="dev"))
    _, _, meta, manifest = read_outputs(tmp_path / "out")
    assert calls == [("org/chat-set", "dev")]
    assert meta[0]["id"] == "h1" and meta[0]["src"] == "hf:org/chat-set:dev"
    assert manifest["inputs"] == [{"path": "org/chat-set", "size": None, "split": "dev"}]


def test_special_ids_defaults_and_overrides(tok: Any, demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": MULTI_TURN}])
    opts = ChatOptions(demo_tokenizer, seq_len=96, eos_token_id=5, pad_token_id=7)
    prepare_chat([src], tmp_path / "out", opts)
    ids, _, meta, manifest = read_outputs(tmp_path / "out")
    expected = [t for p, _ in olmo_pieces(tok.encode) for t in ([5] if p == [EOS] else p)]
    assert ids.tolist() == expected + [7] * (96 - len(expected))
    assert (manifest["eos_token_id"], manifest["pad_token_id"]) == (5, 7)


def test_pad_falls_back_to_eos_on_gpt2(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": MULTI_TURN}])
    gpt2 = shared_tokenizer("gpt2.json")  # <|endoftext|> 50256 and no pad token
    prepare_chat([src], tmp_path / "gpt2", ChatOptions(gpt2, seq_len=64, backend="hf"))
    ids, _, meta, manifest = read_outputs(tmp_path / "gpt2")
    assert manifest["pad_token_id"] == manifest["eos_token_id"] == 50256
    assert (ids[meta[0]["tokens"] :] == 50256).all()


def test_a_tokenizer_without_eos_needs_eos_token_id(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    words = HFTokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "<|user|>": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "words.json"))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi hi"}]
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": messages}])
    with pytest.raises(DataError, match="words.json: the tokenizer has no recognisable EOS token.*--eos-token-id"):
        prepare_chat([src], tmp_path / "w", ChatOptions(str(tmp_path / "words.json"), seq_len=16, backend="hf"))
    opts = ChatOptions(str(tmp_path / "words.json"), seq_len=16, backend="hf", eos_token_id=9)
    prepare_chat([src], tmp_path / "w", opts)
    ids, mask, meta, manifest = read_outputs(tmp_path / "w")
    assert manifest["pad_token_id"] == manifest["eos_token_id"] == 9  # no pad token: pad with EOS
    assert (ids[meta[0]["tokens"] :] == 9).all() and not mask[meta[0]["tokens"] :].any()
    assert ids[mask].tolist() == [1, 1, 9]  # "hi hi" and its EOS


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seq_len": 0}, "--sequence-length must be a positive number of tokens, got 0"),
        ({"seq_len": 8, "pack_window": 0}, "--pack-window must be at least 1, got 0"),
        ({"seq_len": 8, "eos_token_id": -3}, "--eos-token-id -3 is not a valid token id"),
    ],
)
def test_bad_options(demo_tokenizer: str, tmp_path: Path, options: dict[str, Any], message: str) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": MULTI_TURN}])
    with pytest.raises(DataError, match=message):
        prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, **options))
    with pytest.raises(DataError, match="--processes must be at least 1, got 0"):
        prepare_chat([src], tmp_path / "out", ChatOptions(demo_tokenizer, seq_len=8), processes=0)


def test_large_vocabulary_is_written_as_uint32(tmp_path: Path) -> None:
    from olmo_data.dataset.instances import open_dataset

    cl100k = shared_tokenizer("cl100k_base.json")  # 100,278 ids: more than uint16 holds
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": MULTI_TURN}])
    prepare_chat([src], tmp_path / "out", ChatOptions(cl100k, seq_len=64, backend="hf"))
    ids, mask, _, manifest = read_outputs(tmp_path / "out")
    assert manifest["dtype"] == "uint32" and (tmp_path / "out" / "input_ids.npy").stat().st_size == 64 * 4
    assert ids[0] == manifest["eos_token_id"] == 100257 and manifest["pad_token_id"] == 100277
    tokens, masks = open_dataset([str(tmp_path / "out")], sequence_length=64).get_batch([0])
    assert tokens[0].tolist() == ids.tolist() and masks is not None and (masks[0] == mask).all()
