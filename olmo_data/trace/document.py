"""`olmo-data show-document`: one document of a run's data, by id, as text, and the steps that trained on it.

The id is looked up in the tokenize metadata (`find_documents`), its tokens read from the token file and decoded
with the tokenizer the data was made with; the steps come from `trace` over the run's order (the stored one, or
the permutation rebuilt), so "what was this document, and when did the model see it" is one command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olmo_data.config import read_run_config
from olmo_data.dataset import DTYPES, open_from_config
from olmo_data.errors import DataError
from olmo_data.tokenizer import data_tokenizer
from olmo_data.trace.find import Target, find_documents, trace


@dataclass
class DocumentView:
    """A document of the run's data: where it is, its text, and the steps whose batches held its tokens."""

    target: Target
    path: str  # the token file
    text: str
    steps: list[int]
    first_step: int
    last_step: int

    def to_json(self) -> dict[str, Any]:
        t = self.target
        return {
            "id": t.name,
            "src": t.src,
            "loc": t.loc,
            "path": self.path,
            "tokens": [t.start, t.end],
            "text": self.text,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }


def show_documents(config: str, doc_id: str, *, tokenizer: str | None = None) -> list[DocumentView]:
    """Every copy of document `doc_id` in the data of the run `config` describes (one, unless a file is listed
    twice or the id repeats), decoded, with the steps of the run that trained on it."""
    cfg = read_run_config(config)
    source = open_from_config(cfg)
    targets = find_documents(source, [doc_id])
    tok = data_tokenizer(tokenizer, source, "show-document")
    report = trace(cfg, targets, source=source)
    out = []
    for k, target in enumerate(targets):
        f = source.files[target.file_index]
        ids = source.read_tokens(f.path, DTYPES[f.dtype], target.start, target.end - target.start)
        steps = sorted({h.step for h in report.hits if h.target == k})
        out.append(DocumentView(target, f.path, tok.decode(ids.tolist()), steps, report.first_step, report.last_step))
    if not out:
        raise DataError(f"document id {doc_id!r} not found in the metadata of the run's token files; check the id")
    return out


def format_document(view: DocumentView, *, max_steps: int = 30) -> str:
    """The header (id, where, tokens, steps), then the text as it is, unquoted."""
    t = view.target
    where = f"{t.src}:{t.loc}" if t.src else "(no source recorded)"
    if view.steps:
        shown = ", ".join(map(str, view.steps[:max_steps])) + (" ..." if len(view.steps) > max_steps else "")
        trained = f"trained at {len(view.steps)} step(s) of {view.first_step}..{view.last_step}: {shown}"
    else:
        trained = (
            f"trained at no step of {view.first_step}..{view.last_step} (in a file's tail that no instance holds, "
            "or down-sampled away by a mix)"
        )
    return "\n".join(
        [
            f"document {t.name!r} from {where}",
            f"{t.end - t.start:,} tokens at [{t.start}, {t.end}) of {view.path}",
            trained,
            "-" * 40,
            view.text,
        ]
    )
