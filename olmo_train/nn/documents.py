"""Attention within documents: the masks and positions that keep the documents packed into one instance apart.

A pretraining instance is a window of a token stream, so it holds the end of one document, others whole, and the
start of the next; `prepare-tulu --pack` puts several conversations into one instance. Plain causal attention
lets every token see the documents before it. With `model.document_masking`, a token attends only to earlier
tokens of its own document, and with `model.document_positions` the rotary positions restart at each document, so
a packed document is computed exactly as it would be alone.

Documents are numbered per instance: `doc_ids` (B, T) holds, for each token, its document's number within the
row (non-decreasing). The trainer derives them from the EOS token that ends each document (pretraining), or from
the conversation spans `prepare-tulu` records (chat data, where an EOS also ends each assistant turn): that data
side is `olmo_train.train.documents`.

Implementation (`model.document_attention`): a boolean (B, 1, T, T) mask for `scaled_dot_product_attention`,
correct on every device but T x T bytes per row and no saving in compute; or FlexAttention with a block mask, which
compiles to one fused kernel that skips the blocks outside every document (the default on GPUs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


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


def attention_mask(doc_ids: torch.Tensor, flex: bool) -> torch.Tensor | BlockMask:
    """What the blocks attend through: the boolean mask of `document_mask`, or with `flex` a FlexAttention block
    mask of the same rule, which skips the blocks of (query, key) pairs that lie in different documents instead
    of computing and discarding them, and holds no T x T tensor. Built once per forward, shared by all layers."""
    if not flex:
        return document_mask(doc_ids)
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q >= k) & (doc_ids[b, q] == doc_ids[b, k])

    B, T = doc_ids.shape
    build = compiled_create_block_mask() if doc_ids.is_cuda else create_block_mask
    return build(same_document_causal, B, None, T, T, device=doc_ids.device)  # type: ignore[no-any-return]


_compiled_create_block_mask: Any = None


def compiled_create_block_mask() -> Any:
    """`create_block_mask` compiled, made at first use: on GPUs uncompiled it evaluates the rule for every (query,
    key) pair in Python-dispatched ops. A new rule each batch (new doc_ids) does not recompile it."""
    global _compiled_create_block_mask
    if _compiled_create_block_mask is None:
        from torch.nn.attention.flex_attention import create_block_mask

        _compiled_create_block_mask = torch.compile(create_block_mask)
    return _compiled_create_block_mask


def use_flex(choice: str, device: torch.device) -> bool:
    """`model.document_attention`: flex, mask, or auto (FlexAttention on GPUs, where it is compiled into a fused
    kernel; the boolean mask elsewhere, where FlexAttention would run unfused)."""
    return choice == "flex" or (choice == "auto" and device.type == "cuda")


def check_trainable(choice: str, device: torch.device) -> None:
    """Refuse `model.document_attention: flex` for training off GPUs at start: torch's FlexAttention has no
    backward pass on CPU, and the run would otherwise fail at its first step."""
    if choice == "flex" and device.type != "cuda":
        from olmo_data.config import ConfigError

        raise ConfigError(
            f"config key 'model.document_attention': flex cannot train on {device.type} (torch's FlexAttention has "
            "no backward pass there); use auto, which picks flex on GPUs and mask elsewhere, or mask"
        )


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token within its document (0 at each document's first token)."""
    T = doc_ids.shape[1]
    index = torch.arange(T, device=doc_ids.device).expand_as(doc_ids)
    new = torch.ones_like(doc_ids, dtype=torch.bool)
    new[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(new, index, torch.zeros_like(index))
    return index - torch.cummax(first, dim=1).values
