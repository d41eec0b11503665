"""A tokenizer's own chat template (`--template tokenizer` or `--template PATH`), rendered by `transformers`.

The conversation's ids are those of `apply_chat_template(messages, tokenize=True)`: the whole conversation is
rendered once and tokenized as one string, special tokens not added (what `apply_chat_template` does). The label
mask covers the assistant turns, found by rendering prefixes, so that it works for any template, with or without
`{% generation %}` markers:

  assistant message i starts where `render(messages[:i], add_generation_prompt=True)` ends (after the template's
  assistant header) and ends where `render(messages[:i+1])` ends (its content and whatever the template writes to
  close a conversation that ends with that turn: the end-of-turn token, and for ChatML its newline).

This is the rule of open-instruct's SFT masks (OLMo 2's and Tulu 3's fine-tunes), which place their boundaries at
the same prefix renders: the trained tokens are each reply and its end-of-turn token, never the header. Every
prefix render must be the start of the whole conversation's text; a template that rewrites earlier turns depending
on what follows is refused for that row, naming it. A token is trained when its first character (its offset) lies
in an assistant turn, which decides a token that a merge carries across a boundary.

`transformers` (the `hf` extra) is imported here and nowhere else in olmo_data, and only when such a template is
used.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from olmo_data.errors import DataError

TOKENIZER = "tokenizer"  # `--template tokenizer`: the chat template of the --tokenizer
JINJA_FILE = "chat_template.jinja"  # where transformers saves a template beside tokenizer_config.json
CONFIG_FILE = "tokenizer_config.json"
INSTALL = "pip install 'olmo-data[hf]'"


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise DataError(
            f"a tokenizer's chat template is rendered by transformers' apply_chat_template, and transformers is "
            f"not installed: {INSTALL}"
        ) from None
    return transformers


@dataclass(frozen=True)
class ChatTemplate:
    """A resolved chat template: its Jinja text and where it came from (recorded in the manifest)."""

    text: str
    source: str  # the file it was read from (absolute path; `FILE#chat_template` inside a config), or `hf:ID`

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def record(self) -> dict[str, Any]:
        version = None
        try:
            version = _transformers().__version__
        except DataError:
            pass
        return {"source": self.source, "sha256": self.sha256, "transformers": version}


def _from_config(path: str) -> ChatTemplate:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: cannot be read as a tokenizer_config.json ({e})") from None
    value = config.get("chat_template") if isinstance(config, dict) else None
    where = f"{os.path.abspath(path)}#chat_template"
    if value is None:
        raise DataError(
            f"{path}: no 'chat_template' key; give --template PATH of a Jinja chat-template file, "
            "or --template olmo or tulu"
        )
    if isinstance(value, list):  # named templates, as transformers saves several: the "default" one is used
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        default = named.get("default")
        if not isinstance(default, str):
            raise DataError(f"{path}: 'chat_template' names {sorted(map(str, named))} but no 'default' template")
        return ChatTemplate(default, f"{where}:default")
    if not isinstance(value, str):
        raise DataError(f"{path}: 'chat_template' is a {type(value).__name__}, not a Jinja string")
    return ChatTemplate(value, where)


def _from_directory(directory: str) -> ChatTemplate | None:
    jinja = os.path.join(directory, JINJA_FILE)
    if os.path.isfile(jinja):  # transformers reads this one first too
        return _from_file(jinja)
    config = os.path.join(directory, CONFIG_FILE)
    return _from_config(config) if os.path.isfile(config) else None


def _from_file(path: str) -> ChatTemplate:
    if path.endswith(".json"):
        return _from_config(path)
    try:
        with open(path, encoding="utf-8") as f:
            return ChatTemplate(f.read(), os.path.abspath(path))
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot be read as a Jinja chat template ({e})") from None


def tokenizer_dir(tokenizer: str) -> str | None:
    """The local directory a --tokenizer lives in (its own path, or the folder of its tokenizer.json)."""
    tokenizer = os.path.expanduser(tokenizer)
    if os.path.isdir(tokenizer):
        return tokenizer
    return os.path.dirname(os.path.abspath(tokenizer)) if os.path.isfile(tokenizer) else None


def resolve_template(spec: str, tokenizer: str) -> ChatTemplate:
    """The template `--template SPEC` names: `tokenizer` (the --tokenizer's chat_template.jinja or its
    tokenizer_config.json's chat_template, beside tokenizer.json or on the hub), a directory holding either, a
    tokenizer_config.json, or a Jinja file."""
    if spec == TOKENIZER:
        directory = tokenizer_dir(tokenizer)
        if directory is None:  # a hub id: transformers finds the template (HF_HUB_OFFLINE uses its cache)
            try:
                text = _transformers().AutoTokenizer.from_pretrained(tokenizer).chat_template
            except DataError:
                raise
            except Exception as e:
                raise DataError(f"{tokenizer}: could not load its tokenizer with transformers ({e})") from None
            if not isinstance(text, str):
                raise DataError(f"{tokenizer}: the tokenizer has no chat template; give --template PATH")
            return ChatTemplate(text, f"hf:{tokenizer}")
        found = _from_directory(directory)
        if found is None:
            raise DataError(
                f"{directory}: no chat template for --template tokenizer: neither {JINJA_FILE} nor {CONFIG_FILE} "
                "with a 'chat_template' is there; give --template PATH of a Jinja file, or --template olmo or tulu"
            )
        return found
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        found = _from_directory(path)
        if found is None:
            raise DataError(f"{spec}: a directory without {JINJA_FILE} or {CONFIG_FILE}; expected a chat template")
        return found
    if os.path.isfile(path):
        return _from_file(path)
    raise DataError(f"unknown template {spec!r}; expected olmo, tulu, tokenizer, or the path of a chat-template file")


def _special_tokens(directory: str | None) -> dict[str, str]:
    """The special tokens (`bos_token`, `eos_token`, ...) of a tokenizer_config.json in `directory`, for a
    tokenizer file that `AutoTokenizer` would not load by itself (one not named tokenizer.json)."""
    path = os.path.join(directory, CONFIG_FILE) if directory else ""
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: cannot be read as a tokenizer_config.json ({e})") from None
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key) if isinstance(config, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[key] = value
    return out


def _hf_tokenizer(tokenizer: str, eos: int) -> Any:
    """The transformers tokenizer that `AutoTokenizer.from_pretrained` gives for the --tokenizer (so the ids are
    the ones a user's `apply_chat_template` gives); another tokenizer file is wrapped with the special tokens of a
    tokenizer_config.json beside it, else with its EOS as the template's `eos_token`."""
    transformers = _transformers()
    local = os.path.expanduser(tokenizer)
    directory = tokenizer_dir(tokenizer)
    try:
        if (
            directory is None
            or os.path.isfile(os.path.join(directory, CONFIG_FILE))
            and (os.path.isdir(local) or os.path.basename(local) == "tokenizer.json")
        ):
            hf = transformers.AutoTokenizer.from_pretrained(directory or tokenizer)
        else:
            file = local if os.path.isfile(local) else os.path.join(local, "tokenizer.json")
            hf = transformers.PreTrainedTokenizerFast(tokenizer_file=file, **_special_tokens(directory))
            if eos >= 0 and hf.eos_token is None:
                hf.eos_token = hf.convert_ids_to_tokens(eos)
    except Exception as e:
        raise DataError(f"{tokenizer}: transformers could not load this tokenizer ({type(e).__name__}: {e})") from None
    if not getattr(hf, "is_fast", False):
        raise DataError(f"{tokenizer}: transformers loads it as a slow tokenizer, which gives no token offsets")
    return hf


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


class TemplateEncoder:
    """Renders conversations with a `ChatTemplate` and tokenizes them with the --tokenizer as transformers loads it."""

    def __init__(self, template: ChatTemplate, tokenizer: str, eos: int) -> None:
        self.template = template
        self.hf = _hf_tokenizer(tokenizer, eos)
        self.vocab_size = len(self.hf)
        self.raw = None  # the offsets' tokenizer (see encode)
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is not None:
            from tokenizers import Tokenizer as RawTokenizer

            self.raw = RawTokenizer.from_str(backend.to_str())
            self.raw.post_processor = None

    def check(self) -> None:
        """Fail before any work on a template that does not compile (not on one that refuses a given row)."""
        import jinja2  # transformers' dependency: there whenever transformers is

        try:
            self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], False)
        except jinja2.TemplateSyntaxError as e:
            raise DataError(f"{self.template.source}: not a valid chat template ({_one_line(e)})") from None
        except Exception:
            pass  # a template may refuse this conversation; each row is checked as it is rendered

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        text = self.hf.apply_chat_template(
            messages, chat_template=self.template.text, tokenize=False, add_generation_prompt=generation_prompt
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, not text")
        return text

    def turns(self, messages: Sequence[tuple[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans of its assistant turns (see the module's rule).
        Raises ValueError with what went wrong (the caller names the row)."""
        msgs = [{"role": role, "content": content} for role, content in messages]
        try:
            full = self._render(msgs, False)
            spans: list[tuple[int, int]] = []
            for i, (role, _) in enumerate(messages):
                if role != "assistant":
                    continue
                start, end = self._render(msgs[:i], True), self._render(msgs[: i + 1], False)
                for what, n, prefix in (("with the generation prompt ", i, start), ("", i + 1, end)):
                    if not full.startswith(prefix):
                        raise ValueError(
                            f"the text it renders for messages[:{n}] {what}is not the start of the whole "
                            f"conversation's, so assistant message {i + 1} cannot be located (the template renders "
                            "earlier turns differently depending on what follows)"
                        )
                if len(end) < len(start) or (spans and len(start) < spans[-1][1]):
                    raise ValueError(f"assistant message {i + 1} renders before the text that precedes it")
                spans.append((len(start), len(end)))
        except ValueError:
            raise
        except Exception as e:  # Jinja's errors, a template's raise_exception, a TypeError inside the template
            raise ValueError(f"it fails to render ({_one_line(e)})") from None
        return full, spans

    def encode(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]]
    ) -> list[tuple[list[int], list[bool]]]:
        """(ids, mask) per rendered conversation. The ids are transformers' (special tokens not added, as
        apply_chat_template tokenizes); the offsets come from the same tokenizer without its post-processor,
        whose `trim_offsets` moves a token's start past its leading spaces (so a space of the header merged into
        a reply's first token would count as the reply's). A token is trained when it starts inside a turn."""
        if not texts:
            return []
        ids_all = self.hf(list(texts), add_special_tokens=False)["input_ids"]
        raw = self.raw.encode_batch(list(texts), add_special_tokens=False) if self.raw is not None else None
        out = []
        for n, (ids, turns) in enumerate(zip(ids_all, spans, strict=True)):
            if raw is not None and raw[n].ids == list(ids):
                offsets = raw[n].offsets
            else:  # the post-processor changed the ids (never seen): transformers' own (trimmed) offsets
                one = self.hf(texts[n], add_special_tokens=False, return_offsets_mapping=True)
                offsets = one["offset_mapping"]
            mask, k = [], 0
            for start, _ in offsets:
                while k < len(turns) and start >= turns[k][1]:
                    k += 1
                mask.append(k < len(turns) and turns[k][0] <= start)
            out.append((list(ids), mask))
        return out
