"""Attention within documents: the masks and positions that keep the documents packed into one instance apart.

A pretraining instance is a window of a token stream, so it holds the end of one document, others whole, and the
start of the next; `prepare-tulu --pack` puts several conversations into one instance. Plain causal attention
lets every token see the documents before it. With `model.document_masking`, a token attends only to earlier
tokens of its own document, and with `model.document_positions` the rotary positions restart at each document, so
a packed document is computed exactly as it would be alone.

Documents are numbered per instance: `doc_ids` (B, T) holds, for each token, its document's number within the
row (non-decreasing). The trainer derives them from the EOS token that ends each document (pretraining), or from
the conversation spans `prepare-tulu` records (chat data, where an EOS also ends each assistant turn).

Implementation: a boolean (B, 1, T, T) mask for `scaled_dot_product_attention`, correct on every device. It costs
T x T bytes per row; on GPUs, variable-length flash attention over the same boundaries is the fast path (left for
the GPU work of issue 15).
"""

from __future__ import annotations

import torch


def doc_ids_from_eos(input_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Documents separated by EOS, which belongs to the document it ends: the next token starts a new one."""
    ends = (input_ids == eos_token_id).to(torch.int64)
    return torch.cumsum(ends, dim=1) - ends


def doc_ids_from_starts(starts: torch.Tensor) -> torch.Tensor:
    """(B, T) bool, True where a document starts -> document numbers (a row's first tokens are document 0)."""
    s = starts.to(torch.int64).clone()
    s[:, 0] = 0
    return torch.cumsum(s, dim=1)


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool: query t may attend to key s when s <= t and both are in the same document."""
    T = doc_ids.shape[1]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return (same & causal).unsqueeze(1)


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token within its document (0 at each document's first token)."""
    T = doc_ids.shape[1]
    index = torch.arange(T, device=doc_ids.device).expand_as(doc_ids)
    new = torch.ones_like(doc_ids, dtype=torch.bool)
    new[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(new, index, torch.zeros_like(index))
    return index - torch.cummax(first, dim=1).values


def boundary_token(eos_token_id: int | None, token_files: list[str]) -> int:
    """The token that ends a document: the config's `model.eos_token_id`, else the one the token files'
    manifests record (tokenize and prepare-tulu write it); a clear error when neither says."""
    if eos_token_id is not None:
        return eos_token_id
    from olmo_data.errors import DataError
    from olmo_data.manifest import read_manifest

    found: dict[int, str] = {}
    for directory in dict.fromkeys(p.rpartition("/")[0] or "." for p in token_files):
        eos = (read_manifest(directory) or {}).get("eos_token_id")
        if eos is not None:
            found.setdefault(int(eos), directory)
    if len(found) != 1:
        which = f"record several: {sorted(found)}" if found else "record none"
        raise DataError(
            "config key 'model.document_masking': documents end at the EOS token, but model.eos_token_id is not set "
            f"and the token files' manifests {which}; set model.eos_token_id"
        )
    return next(iter(found))
