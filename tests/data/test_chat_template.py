"""`prepare-tulu --template tokenizer|PATH`: a tokenizer's own chat template, rendered by transformers.

Tokenizers are built offline from ../shared/tokenizers/gpt2.json with a tokenizer_config.json written here: one
with OLMo 2 / Tulu's template (`<|user|>\\n...<|assistant|>\\n...<|endoftext|>`), one ChatML (`<|im_start|>` and
`<|im_end|>` added as special tokens). Per conversation: the ids equal `apply_chat_template(tokenize=True)`, and
the trained tokens, decoded run by run, are exactly each assistant turn (its content and end-of-turn text).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.chat import ChatOptions, prepare_chat
from olmo_data.errors import DataError
from tests.conftest import shared_tokenizer

transformers = pytest.importorskip(
    "transformers", reason="transformers renders chat templates: pip install 'olmo-data[hf]' (the dev extra has it)"
)

OLMO2 = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<|system|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}{{ '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ '<|assistant|>\\n' + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}"
)
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
END_OF_TURN = {"olmo2": "<|endoftext|>", "chatml": "<|im_end|>\n"}  # what each template writes after a reply


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


CONVERSATIONS = [
    [msg("system", "You answer in one word."), msg("user", "Sky?"), msg("assistant", "Blue."), msg("user", "Grass?")]
    + [msg("assistant", "Green.")],
    [msg("user", "Say nothing."), msg("assistant", ""), msg("user", "Now say hi."), msg("assistant", "hi")],
    [msg("user", "Grüße auf Japanisch?"), msg("assistant", "こんにちは 🙂 — «ça va»")],
    [msg("user", "Leading space and newlines"), msg("assistant", "  \n\nindented\n  "), msg("user", "ok")],
    [msg("user", "Only a question, nothing to train")],
]


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return str(path)


def make_tokenizer(directory: Path, template: str | None, *, chatml: bool = False) -> Path:
    """A tokenizer directory: gpt2.json (with ChatML's two special tokens added when `chatml`) and a
    tokenizer_config.json holding `template`."""
    directory.mkdir(parents=True)
    spec = json.loads(Path(shared_tokenizer("gpt2.json")).read_text())
    config: dict[str, Any] = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    if chatml:
        for k, token in enumerate(("<|im_start|>", "<|im_end|>")):
            spec["added_tokens"].append(
                {"id": 50257 + k, "content": token, "single_word": False, "lstrip": False, "rstrip": False}
                | {"normalized": False, "special": True}
            )
        config = {"eos_token": "<|im_end|>"}
    (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def tokenizers_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat-templates")
    return {
        "olmo2": make_tokenizer(root / "olmo2", OLMO2),
        "chatml": make_tokenizer(root / "chatml", CHATML, chatml=True),
    }


def prepare(src: str, tokenizer: str, dest: Path, template: str = "tokenizer", **kw: Any) -> Any:
    processes = kw.pop("processes", 1)
    options = ChatOptions(tokenizer=tokenizer, seq_len=kw.pop("seq_len", 256), template=template, **kw)
    return prepare_chat([src], dest, options, progress=False, processes=processes)


def examples(dest: Path) -> tuple[list[tuple[list[int], list[bool]]], dict[str, Any]]:
    manifest = json.loads((dest / "manifest.json").read_text())
    ids = np.fromfile(dest / "input_ids.npy", dtype=manifest["dtype"])
    mask = np.fromfile(dest / "label_mask.npy", dtype=np.bool_)
    meta = [json.loads(line) for line in (dest / "metadata.jsonl").read_text().splitlines()]
    out = [(ids[m["start"] : m["end"]].tolist(), mask[m["start"] : m["end"]].tolist()) for m in meta]
    return out, manifest


def runs(hf: Any, ids: list[int], mask: list[bool]) -> list[tuple[bool, str]]:
    """The conversation as maximal runs of trained / untrained tokens, each decoded."""
    out: list[tuple[bool, list[int]]] = []
    for i, m in zip(ids, mask, strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(i)
        else:
            out.append((m, [i]))
    return [(m, hf.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)) for m, part in out]


@pytest.mark.parametrize("style", ["olmo2", "chatml"])
def test_ids_are_apply_chat_templates_and_the_mask_is_the_assistant_turns(
    style: str, tokenizers_dir: dict[str, Path], tmp_path: Path
) -> None:
    directory = tokenizers_dir[style]
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in CONVERSATIONS])
    summary = prepare(src, str(directory), tmp_path / "out")
    assert summary.read == 5 and summary.written == 4 and summary.dropped["no_assistant_message"] == 1
    got, manifest = examples(tmp_path / "out")
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    for conversation, (ids, mask) in zip(CONVERSATIONS[:4], got, strict=True):
        expected = hf.apply_chat_template(conversation, tokenize=True, return_dict=False)
        assert ids == list(expected)
        text = hf.apply_chat_template(conversation, tokenize=False)
        parts = runs(hf, ids, mask)
        assert "".join(t for _, t in parts) == text  # no run splits a character
        replies = [m["content"] + END_OF_TURN[style] for m in conversation if m["role"] == "assistant"]
        assert [t for trained, t in parts if trained] == replies
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert manifest["template"] == "tokenizer"
    record = manifest["chat_template"]
    assert record["source"] == f"{directory / 'tokenizer_config.json'}#chat_template"
    assert record["sha256"] == hashlib.sha256(config["chat_template"].encode()).hexdigest()
    assert record["transformers"] == transformers.__version__


def test_a_jinja_file_with_a_lone_tokenizer_json(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    """--template PATH of a Jinja file, and a tokenizer.json file with no config: its EOS is the template's
    eos_token, as for PreTrainedTokenizerFast(tokenizer_file=..., eos_token=...)."""
    gpt2 = shared_tokenizer("gpt2.json")
    jinja = tmp_path / "olmo2.jinja"
    jinja.write_text(OLMO2)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in CONVERSATIONS[:3]])
    prepare(src, gpt2, tmp_path / "out", template=str(jinja))
    got, manifest = examples(tmp_path / "out")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=gpt2, eos_token="<|endoftext|>")
    for conversation, (ids, mask) in zip(CONVERSATIONS[:3], got, strict=True):
        assert ids == list(hf.apply_chat_template(conversation, chat_template=OLMO2, return_dict=False))
        replies = [m["content"] + "<|endoftext|>" for m in conversation if m["role"] == "assistant"]
        assert [t for trained, t in runs(hf, ids, mask) if trained] == replies
    assert manifest["chat_template"]["source"] == str(jinja)
    assert manifest["template"] == str(jinja)


def test_truncation_keeps_the_mask_of_the_ids_kept(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    prepare(src, str(tokenizers_dir["chatml"]), tmp_path / "full")
    prepare(src, str(tokenizers_dir["chatml"]), tmp_path / "cut", seq_len=30)
    (full_ids, full_mask), (cut_ids, cut_mask) = examples(tmp_path / "full")[0][0], examples(tmp_path / "cut")[0][0]
    assert len(cut_ids) == 30 < len(full_ids) and cut_ids == full_ids[:30] and cut_mask == full_mask[:30]
    meta = json.loads((tmp_path / "cut" / "metadata.jsonl").read_text())
    assert meta["truncated"] and meta["full_tokens"] == len(full_ids)


def test_rerun_is_reused_and_an_edited_template_is_another_run(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    directory = tmp_path / "tok"
    shutil.copytree(tokenizers_dir["olmo2"], directory)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    assert not prepare(src, str(directory), tmp_path / "out").reused
    assert prepare(src, str(directory), tmp_path / "out").reused
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = OLMO2.replace("<|user|>", "<|human|>")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(DataError, match="already holds olmo-data.chat output of a different run"):
        prepare(src, str(directory), tmp_path / "out")


def test_chat_template_jinja_beside_the_config_wins(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    """transformers saves a template as chat_template.jinja and reads it before tokenizer_config.json's."""
    directory = tmp_path / "tok"
    shutil.copytree(tokenizers_dir["olmo2"], directory)
    (directory / "chat_template.jinja").write_text(CHATML)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[2]}])
    prepare(src, str(directory / "tokenizer.json"), tmp_path / "out")
    (ids, _), manifest = examples(tmp_path / "out")[0][0], examples(tmp_path / "out")[1]
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert hf.chat_template == CHATML  # the reference agrees on which template is the tokenizer's
    assert ids == list(hf.apply_chat_template(CONVERSATIONS[2], return_dict=False))
    assert manifest["chat_template"]["source"] == str(directory / "chat_template.jinja")


# ------------------------------------------------------------------------------------------------------------
# Errors: one line naming the row and the template; nothing left behind

REFUSES_SYSTEM = CHATML.replace(
    "{% for message in messages %}",
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}",
)


@pytest.mark.parametrize(
    ("template", "row", "expected"),
    [
        (REFUSES_SYSTEM, 2, "it fails to render (TemplateError: System role not supported)"),
        (CHATML.replace("message['content'] +", "message['content'] + 1 +"), 1, "it fails to render (TypeError: "),
        (
            "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['content'] }}{% endfor %}",
            1,
            "the text it renders for messages[:1] with the generation prompt is not the start of the whole "
            "conversation's, so assistant message 2 cannot be located",
        ),
    ],
    ids=["raise_exception", "type-error", "rewrites-earlier-turns"],
)
def test_a_row_the_template_cannot_render_is_named(
    template: str, row: int, expected: str, tokenizers_dir: dict[str, Path], tmp_path: Path
) -> None:
    jinja = tmp_path / "t.jinja"
    jinja.write_text(template)
    rows = [{"messages": CONVERSATIONS[2]}, {"messages": CONVERSATIONS[0]}]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    base = ["prepare-tulu", "-d", src, "-t", str(tokenizers_dir["chatml"]), "--template", str(jinja)]
    result = CliRunner().invoke(main, [*base, "--sequence-length", "64", "--destination", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith(f"error: {src}:{row}: chat template {jinja}: {expected}"), lines[0]
    assert lines[0].endswith("(use --skip-bad-documents to count and skip such rows)")
    assert not (tmp_path / "o").exists()


def test_a_refused_row_is_skipped_and_counted_when_asked(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    jinja = tmp_path / "t.jinja"
    jinja.write_text(REFUSES_SYSTEM)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in CONVERSATIONS[:3]])
    summary = prepare(src, str(tokenizers_dir["chatml"]), tmp_path / "o", template=str(jinja), skip_bad_rows=True)
    assert summary.written == 2 and summary.bad_rows == 1
    assert summary.bad_examples == [
        f"{src}:1: chat template {jinja}: it fails to render (TemplateError: System role not supported)"
    ]


def test_template_errors_before_any_work(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }}")
    no_template = make_tokenizer(tmp_path / "bare", None)
    cases = [
        (str(broken), str(tokenizers_dir["olmo2"]), f"{broken}: not a valid chat template (TemplateSyntaxError: "),
        ("tokenizer", str(no_template), f"{no_template / 'tokenizer_config.json'}: no 'chat_template' key"),
        ("chatml", str(tokenizers_dir["olmo2"]), "unknown template 'chatml'; expected olmo, tulu, tokenizer, or the"),
        (str(tmp_path), str(tokenizers_dir["olmo2"]), f"{tmp_path}: a directory without chat_template.jinja or"),
    ]
    for template, tokenizer, expected in cases:
        base = ["prepare-tulu", "-d", src, "-t", tokenizer, "--template", template, "--sequence-length", "64"]
        result = CliRunner().invoke(main, [*base, "--destination", str(tmp_path / "o")])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), (template, lines)
        assert not (tmp_path / "o").exists()


def test_missing_transformers_names_the_extra(
    tokenizers_dir: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[0]}])
    with pytest.raises(DataError, match=r"transformers is not installed: pip install 'olmo-data\[hf\]'$"):
        prepare(src, str(tokenizers_dir["olmo2"]), tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_worker_processes_give_the_same_bytes(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    rows = [{"messages": c, "id": str(i)} for i in range(300) for c in CONVERSATIONS[:4]]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    prepare(src, str(tokenizers_dir["chatml"]), tmp_path / "one", pack=True)
    prepare(src, str(tokenizers_dir["chatml"]), tmp_path / "two", pack=True, processes=2)
    for name in ("input_ids.npy", "label_mask.npy", "metadata.jsonl"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


CHATML_MARKED = (  # ChatML with transformers' {% generation %} markers around each reply and its end of turn
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_the_mask_equals_transformers_assistant_tokens_mask(tokenizers_dir: dict[str, Path], tmp_path: Path) -> None:
    """Where a template marks its assistant turns with {% generation %}, transformers' own
    return_assistant_tokens_mask agrees with the mask found by prefix renders (which needs no markers). Not on a
    reply that opens with spaces: transformers maps characters to tokens through trimmed offsets and finds no
    token for it (an all-false mask), which is why the prefix renders use untrimmed ones."""
    jinja = tmp_path / "marked.jinja"
    jinja.write_text(CHATML_MARKED)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in CONVERSATIONS[:3]])
    prepare(src, str(tokenizers_dir["chatml"]), tmp_path / "out", template=str(jinja))
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizers_dir["chatml"]))
    for conversation, (ids, mask) in zip(CONVERSATIONS[:3], examples(tmp_path / "out")[0], strict=True):
        ref = hf.apply_chat_template(
            conversation, chat_template=CHATML_MARKED, return_dict=True, return_assistant_tokens_mask=True
        )
        assert ids == list(ref["input_ids"]) and mask == [bool(m) for m in ref["assistant_masks"]]
        assert any(mask)


def test_a_tokenizer_file_of_another_name_takes_the_special_tokens_beside_it(
    tokenizers_dir: dict[str, Path], tmp_path: Path
) -> None:
    """--tokenizer DIR/other.json with a tokenizer_config.json beside it: the template's eos_token is the config's
    (ChatML's <|im_end|>), not the <|endoftext|> the vocabulary also has."""
    directory = tmp_path / "tok"
    shutil.copytree(tokenizers_dir["chatml"], directory)
    (directory / "tokenizer.json").rename(directory / "other.json")
    template = CHATML.replace("'<|im_end|>\\n'", "eos_token + '\\n'")
    config = json.loads((directory / "tokenizer_config.json").read_text()) | {"chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONVERSATIONS[2]}])
    prepare(src, str(directory / "other.json"), tmp_path / "out")
    ids, mask = examples(tmp_path / "out")[0][0]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "other.json"), eos_token="<|im_end|>")
    assert ids == list(hf.apply_chat_template(CONVERSATIONS[2], chat_template=template, return_dict=False))
    assert [t for trained, t in runs(hf, ids, mask) if trained] == [CONVERSATIONS[2][1]["content"] + "<|im_end|>\n"]
