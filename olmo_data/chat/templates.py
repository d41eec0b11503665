"""Chat templates: a conversation as the token ids and label mask a model is fine-tuned on.

Templates (docs/data.md shows the token layouts):
  olmo  OLMo's `scripts/prepare_tulu_data.py`: EOS, then per message `<|{role}|>\n` (encoded alone) and the
        stripped content; a non-assistant's content is encoded together with its trailing `\n`; an
        assistant's content is followed by the EOS id and `\n` (encoded alone). Trained: the assistant's
        content and its EOS.
  tulu  open-instruct's "tulu" chat template: per message `<|{role}|>\n` + content (not stripped) + `\n`;
        an assistant's content is followed by EOS and `\n` (no `\n` after the last message). The text between
        two EOS tokens is encoded as one string. Trained, as in open-instruct's
        `sft_tulu_tokenize_and_truncate_v1`: all but each non-assistant message together with the `\n` before
        it and the `<|assistant|>\n` after it, i.e. the assistant replies and their EOS; a mask boundary inside
        a string falls after as many tokens as the text before it encodes to.
Both insert EOS by id. Conversations are truncated on the right to the sequence length.
A tokenizer's own chat template (`--template tokenizer` or PATH) is `hf_template`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from olmo_data.errors import DataError
from olmo_data.tokenizer import Tokenizer

TEMPLATES = ("olmo", "tulu")

Segment = tuple[str | int, int]  # (text to encode, or a token id; how much of it is untrained: see render)


def render(messages: Sequence[tuple[str, str]], template: str, eos: int) -> list[Segment]:
    """The conversation as segments `(piece, untrained)`: a text to encode as one string, whose first `untrained`
    characters are not trained and the rest are; or a token id, trained when `untrained` is 0."""
    if template == "olmo":
        return _render_olmo(messages, eos)
    if template == "tulu":
        return _render_tulu(messages, eos)
    raise DataError(f"unknown chat template {template!r}; expected one of {', '.join(TEMPLATES)}")


def _render_olmo(messages: Sequence[tuple[str, str]], eos: int) -> list[Segment]:
    segments: list[Segment] = [(eos, 1)]
    for role, content in messages:
        header = f"<|{role}|>\n"
        segments.append((header, len(header)))
        if role == "assistant":
            segments += [(content.strip(), 0), (eos, 0), ("\n", 1)]
        else:
            text = content.strip() + "\n"
            segments.append((text, len(text)))
    return segments


def _render_tulu(messages: Sequence[tuple[str, str]], eos: int) -> list[Segment]:
    # open-instruct's labels: each non-assistant message is untrained from the end of what precedes it (so with
    # the "\n" after a previous assistant's EOS) to its end plus the "<|assistant|>\n" that follows it; all
    # else is trained. Between two EOS tokens that is an untrained part, then a trained part.
    pieces: list[tuple[str | int, bool]] = []
    for i, (role, content) in enumerate(messages):
        if role != "assistant":
            pieces.append((f"<|{role}|>\n{content}\n", False))
            continue
        pieces += [("<|assistant|>\n", i == 0 or messages[i - 1][0] == "assistant"), (content, True), (eos, True)]
        if i < len(messages) - 1:
            pieces.append(("\n", messages[i + 1][0] == "assistant"))
    segments: list[Segment] = []
    text, untrained = "", 0
    for piece, trained in pieces:
        if isinstance(piece, int):
            segments += [(text, untrained), (piece, 0)] if text else [(piece, 0)]
            text, untrained = "", 0
            continue
        if not trained:
            assert untrained == len(text), "an untrained part after a trained one between two EOS tokens"
            untrained += len(piece)
        text += piece
    return segments + [(text, untrained)] if text else segments


def encode_conversations(
    tok: Tokenizer,
    conversations: Sequence[Sequence[tuple[str, str]]],
    *,
    template: str,
    eos_token_id: int,
    seq_len: int | None = None,
) -> list[tuple[list[int], list[bool], int]]:
    """(ids, label mask, untruncated length) per conversation, with one batch encode call for all their text.

    A text segment trained from character k on is encoded whole; its first len(encode(text[:k])) tokens are
    untrained, which is how open-instruct places mask boundaries (by the token count of the rendered prefix).
    """
    rendered = [render(messages, template, eos_token_id) for messages in conversations]
    index: dict[str, int] = {}
    for segments in rendered:
        for piece, untrained in segments:
            if isinstance(piece, str):
                index.setdefault(piece, len(index))
                if 0 < untrained < len(piece):
                    index.setdefault(piece[:untrained], len(index))
    encoded = tok.encode_batch(list(index))
    out = []
    for segments in rendered:
        ids: list[int] = []
        mask: list[bool] = []
        for piece, untrained in segments:
            if isinstance(piece, int):
                ids.append(piece)
                mask.append(untrained == 0)
                continue
            part = encoded[index[piece]]
            if untrained >= len(piece) or untrained == 0:
                n = len(part) if untrained else 0
            else:
                n = min(len(encoded[index[piece[:untrained]]]), len(part))
            ids += part
            mask += [False] * n + [True] * (len(part) - n)
        full = len(ids)
        if seq_len is not None:
            ids, mask = ids[:seq_len], mask[:seq_len]
        out.append((ids, mask, full))
    return out
