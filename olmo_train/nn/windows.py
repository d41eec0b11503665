"""Attention windows: layers whose tokens attend only to the last `window` tokens (OLMo 3's sliding-window layers).

A window of w tokens: query t sees the keys of tokens t-w+1 .. t, itself and the w - 1 before it. That is
transformers' rule (`kv_idx > q_idx - sliding_window`) and OLMo-core's (flash-attn's `window_size=(w - 1, 0)`,
both ends inclusive); which layers have one is `ModelConfig.attention_windows` (OLMo-core's pattern with its
first/last-layer rule, or transformers' `layer_types`). Windows combine with document masking: a token sees the
tokens of its own document within its window.

Paths, the fastest first (`Attention.forward` picks):
- flash-attn (GPU, bf16, no document masking, no cache): its own `window_size`;
- FlexAttention (document masking on GPUs): the window joins the document rule in the block mask, so the blocks
  outside the band are skipped, not computed;
- everywhere else, `window_attention`: SDPA over one block of B queries at a time, each block against the only
  keys its window reaches (B + w - 1 of them). No T x T mask exists: every block attends through a view of one
  (B, B + w - 1) additive band mask, which is all autograd keeps of masks for backward (torch's CPU and GPU SDPA
  kernels are flash-style: the scores are not kept); with document masking or padding, each block has its own
  mask, T x (B + w - 1) in all per row. The document rule is read from the (B, T) ids block by block. Compute is
  (B + w - 1) / w of the band's own, against T / w for a masked full attention.
- with document masking and rows of SEGMENT_TOKENS or more, every layer (full or windowed) attends one document at
  a time (`by_document`): no mask across documents at all, for the full layers either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from olmo_train.nn.documents import attention_mask, compiled_create_block_mask

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


@dataclass(frozen=True)
class DocumentIds:
    """A windowed layer's document rule kept as each token's document (B, T) rather than a (B, 1, T, T) mask, so
    that `window_attention` builds only the blocks of it that its windows reach."""

    ids: torch.Tensor


def query_block(window: int) -> int:
    """Queries per SDPA call. A block of B costs B x (B + w - 1) scores, but torch's CPU kernel is slow on small
    blocks (measured on 2 cores, 4 heads of 64: 250 ns a score at 128 x 1151, 38 at 1024 x 2047, 30 at 4096 x 4096),
    so 512 for small windows and 1024 above."""
    return 512 if window <= 512 else 1024


def band(rows: int, window: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(rows, rows + window - 1) additive mask, 0 where query r may see key c (r <= c <= r + window - 1, keys counted
    from window - 1 before the first query), -inf elsewhere: the same for every block, so that one tensor serves
    them all (as a view) and autograd keeps that one for backward instead of a mask per block."""
    r = torch.arange(rows, device=device)[:, None]
    c = torch.arange(rows + window - 1, device=device)[None, :]
    inside = (r <= c) & (c <= r + window - 1)
    return torch.zeros(inside.shape, dtype=dtype, device=device).masked_fill_(~inside, float("-inf"))


def window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    mask: torch.Tensor | None = None,
    doc_ids: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Causal attention within `window` tokens, a block of queries at a time.

    q (B, H, T, D) are the last T of the S tokens whose keys and values k, v (B, H_kv, S, D) hold (training: S == T;
    generation: the cached keys first). `mask` (B or 1, 1, T, S' >= S), bool: a further rule over the last S' keys
    (generation's padding), of which k holds the last S. `doc_ids` (B, T), with S == T: the document rule. Each
    query must be allowed to see itself (every rule here lets it), else its row has no key and gives NaN.

    Memory besides SDPA's own: the one shared band mask, B x (B + w - 1) in q's dtype; with documents or padding,
    a mask per block, T x (B + w - 1) in all a row.
    """
    T, S = q.shape[2], k.shape[2]
    offset = S - T  # the key index of query 0
    gqa = k.shape[1] != q.shape[1]
    if S <= window and T == S and mask is None and doc_ids is None:  # every key within reach: plain causal
        return F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=gqa)
    step = min(T, block or query_block(window))
    shared = band(step, window, q.dtype, q.device)
    outputs = []
    for start in range(0, T, step):
        end = min(T, start + step)
        k0, k1 = max(0, offset + start - window + 1), offset + end  # the keys any query of the block can see
        c0 = k0 - (offset + start - window + 1)  # the band's column of key k0
        bias = shared[: end - start, c0 : c0 + k1 - k0]
        if doc_ids is not None or mask is not None:
            allowed = torch.ones(bias.shape, dtype=torch.bool, device=q.device)
            if doc_ids is not None:
                allowed = allowed & (doc_ids[:, start:end, None] == doc_ids[:, None, k0:k1]).unsqueeze(1)
            if mask is not None:
                first = mask.shape[-1] - S  # mask's column of key 0
                allowed = allowed & mask[..., start:end, first + k0 : first + k1]
            bias = bias.masked_fill(~allowed, float("-inf"))
        y = F.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, k0:k1], v[:, :, k0:k1], attn_mask=bias, enable_gqa=gqa
        )
        outputs.append(y)
    return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def window_block_mask(doc_ids: torch.Tensor | None, window: int, batch: int, T: int, device: torch.device) -> BlockMask:
    """FlexAttention's block mask of the window rule (and the document rule when `doc_ids` is given)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def in_window(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        band = (q >= k) & (q - k < window)
        return band if doc_ids is None else band & (doc_ids[b, q] == doc_ids[b, k])

    build = compiled_create_block_mask() if device.type == "cuda" else create_block_mask
    return build(in_window, batch, None, T, T, device=device)  # type: ignore[no-any-return]


# from this many tokens a row, documents are attended one at a time (`by_document`) rather than through masks
SEGMENT_TOKENS = 2048


def by_document(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor, window: int | None
) -> torch.Tensor:
    """Each document of each row attended on its own, causal (within `window` when given): no mask across
    documents at all, O(T) memory for a full layer (its causal kernel) and the one band mask for a windowed one,
    against a T x T mask; the work is each document's own. One SDPA call a document, so for long rows only."""
    gqa = k.shape[1] != q.shape[1]
    rows = []
    for b in range(q.shape[0]):
        parts, start = [], 0
        for n in torch.unique_consecutive(doc_ids[b], return_counts=True)[1].tolist():
            qs, ks, vs = (t[b : b + 1, :, start : start + n] for t in (q, k, v))
            if window is None:
                parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=n > 1, enable_gqa=gqa))
            else:
                parts.append(window_attention(qs, ks, vs, window))
            start += n
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0)


def document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor, window: int | None
) -> torch.Tensor:
    """A layer's attention within documents, without a T x T mask: long rows (and full layers) one document at a
    time, short rows of a windowed layer in blocks of queries with the document rule."""
    if window is None or q.shape[2] >= SEGMENT_TOKENS:
        return by_document(q, k, v, doc_ids, window)
    return window_attention(q, k, v, window, doc_ids=doc_ids)


def layer_masks(
    windows: list[int | None], mask: Any, doc_ids: torch.Tensor | None, flex: bool
) -> dict[int | None, Any]:
    """What each kind of layer attends through, by its window (None: full attention), built once per forward and
    shared by the layers of that kind: the given `mask` (generation) without documents; with `doc_ids`, FlexAttention's
    block mask (flex), else the full layers' boolean document mask (`olmo_train.nn.documents`) for short rows and
    the ids themselves for windowed layers and long rows (`window_attention`, `by_document`)."""
    out: dict[int | None, Any] = {}
    for w in dict.fromkeys(windows):
        if doc_ids is None:
            out[w] = mask
        elif flex:
            B, T = doc_ids.shape
            out[w] = attention_mask(doc_ids, True) if w is None else window_block_mask(doc_ids, w, B, T, doc_ids.device)
        elif w is None and doc_ids.shape[1] < SEGMENT_TOKENS:
            out[w] = attention_mask(doc_ids, False)
        else:
            out[w] = DocumentIds(doc_ids)
    return out
