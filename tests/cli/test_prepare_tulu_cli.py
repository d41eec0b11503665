"""`olmo-data prepare-tulu` from the command line: outputs, summary line, errors without tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from olmo_cli.main import main

CONVERSATIONS = [
    {"id": "a", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
    {"id": "b", "messages": [{"role": "user", "content": "Only a question?"}]},
    {"id": "c", "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
]


def write_input(path: Path, extra: list[str] | None = None) -> str:
    lines = [json.dumps(c) for c in CONVERSATIONS] + (extra or [])
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_prepare_tulu_writes_padded_instances_and_reports(demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_input(tmp_path / "chat.jsonl")
    dest = tmp_path / "sft"
    args = ["prepare-tulu", "--documents", src, "--tokenizer", demo_tokenizer, "--destination", str(dest)]
    result = CliRunner().invoke(main, [*args, "--sequence-length", "32", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "read 3 conversations, wrote 2 into 2 instances of 32 tokens" in result.output
    assert "dropped 1 (1 no assistant message)" in result.output
    ids = np.fromfile(dest / "input_ids.npy", dtype=np.uint16)
    mask = np.fromfile(dest / "label_mask.npy", dtype=np.bool_)
    assert ids.size == mask.size == 64 and ids[0] == 0 and ids[32] == 0  # each instance opens with EOS
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["files"][0]["label_mask"] == "label_mask.npy" and manifest["template"] == "olmo"
    trained = int(mask.sum())
    assert f"trained tokens {100 * trained / 64:.1f}%" in result.output


def test_prepare_tulu_pack_and_tulu_template(demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_input(tmp_path / "chat.jsonl")
    args = ["prepare-tulu", "--documents", src, "--tokenizer", demo_tokenizer, "--destination", str(tmp_path / "o")]
    result = CliRunner().invoke(main, [*args, "--sequence-length", "64", "--pack", "--template", "tulu"])
    assert result.exit_code == 0, result.output
    assert "wrote 2 into 1 packed instances of 64 tokens" in result.output and "template tulu" in result.output
    meta = [json.loads(line) for line in (tmp_path / "o" / "metadata.jsonl").read_text().splitlines()]
    assert [(m["id"], m["instance"]) for m in meta] == [("a", 0), ("c", 0)]
    assert meta[1]["start"] == meta[0]["end"]


def test_prepare_tulu_bad_row_is_an_error_unless_skipped(demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_input(tmp_path / "chat.jsonl", ['{"messages": [{"role": "tool", "content": "x"}]}'])
    base = ["prepare-tulu", "--documents", src, "--tokenizer", demo_tokenizer, "--sequence-length", "32"]
    result = CliRunner().invoke(main, [*base, "--destination", str(tmp_path / "a")])
    assert result.exit_code == 2
    assert "chat.jsonl:4: message 1 has role 'tool'; expected one of system, user, assistant" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "a").exists()

    result = CliRunner().invoke(main, [*base, "--destination", str(tmp_path / "b"), "--skip-bad-documents"])
    assert result.exit_code == 0, result.output
    assert "1 bad rows skipped" in result.output
    assert "bad row: " in result.output and "chat.jsonl:4: message 1 has role 'tool'" in result.output


def test_prepare_tulu_requires_seq_len(demo_tokenizer: str, tmp_path: Path) -> None:
    src = write_input(tmp_path / "chat.jsonl")
    args = ["prepare-tulu", "--documents", src, "--tokenizer", demo_tokenizer, "--destination", str(tmp_path / "o")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "Missing option '--sequence-length'" in result.output


def test_demo_chat_sample_prepares_with_every_conversation_trained(demo_tokenizer: str, tmp_path: Path) -> None:
    from olmo_data.demo import make_demo_chat

    path = make_demo_chat(tmp_path / "tulu.jsonl", max_files=60)
    assert (
        make_demo_chat(tmp_path / "again.jsonl", max_files=60)
        and (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "tulu.jsonl").read_bytes()
    )  # the same sample on every run
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert len(rows) > 20
    for row in rows:
        user, assistant = row["messages"]
        assert user["role"] == "user" and f"`{row['id']}`" in user["content"]
        assert assistant["role"] == "assistant" and assistant["content"].strip()
    args = ["prepare-tulu", "--documents", path, "--tokenizer", demo_tokenizer, "--destination", str(tmp_path / "sft")]
    result = CliRunner().invoke(main, [*args, "--sequence-length", "128", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert f"read {len(rows)} conversations, wrote {len(rows)} into {len(rows)} instances" in result.output


def test_prepare_tulu_names_a_truncated_gzip_and_leaves_nothing(demo_tokenizer: str, tmp_path: Path) -> None:
    import gzip

    rows = [json.dumps(CONVERSATIONS[0] | {"id": str(i)}) for i in range(3000)]
    data = gzip.compress(("\n".join(rows) + "\n").encode())
    src = tmp_path / "chat.jsonl.gz"
    src.write_bytes(data[: len(data) // 2])
    args = [
        "prepare-tulu",
        "--documents",
        str(src),
        "--tokenizer",
        demo_tokenizer,
        "--destination",
        str(tmp_path / "o"),
    ]
    result = CliRunner().invoke(main, [*args, "--sequence-length", "32", "--no-progress"])
    assert result.exit_code == 2
    assert "chat.jsonl.gz: cannot be read past line" in result.output and "truncated or corrupt" in result.output
    assert not (tmp_path / "o").exists()
