"""An OLMo-2-style decoder-only transformer, small enough to read top to bottom.

RMSNorm, rotary position embeddings, SwiGLU MLP, QK-norm, no biases, optional grouped-query attention and
weight tying. `norm_after=True` is OLMo-2's reordered norm (the sublayer's output is normalised before it
joins the residual stream, which keeps the residual stream's scale in check at scale); `norm_after=False` is
the classic pre-norm block. OLMo-1 is the pre-norm block with LayerNorm instead of RMSNorm, without learned
scales and without QK-norm (`layer_norm_type: layer_norm`, `layer_norm_with_affine: false`). Attention is
torch's SDPA, or flash-attn when it is installed and the model runs on a GPU in bf16. OLMo 3 adds attention windows on
some layers (`olmo_train/nn/windows`) and YaRN-scaled rotary tables on the others (`olmo_train/nn/rope`).

For generation (`olmo_train/generate.py`) the forward also takes explicit positions, an attention mask and a
key/value cache; training passes none of them. Rotary tables are extended on demand, so a model runs on sequences
longer than the `max_sequence_length` it was trained with, as `transformers` does.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from olmo_data.config import CHOICES, ModelConfig
from olmo_train.nn.documents import document_positions, use_flex
from olmo_train.nn.loss import token_loss_rows, token_loss_sum, token_loss_sums
from olmo_train.nn.recompute import checkpointed
from olmo_train.nn.rope import apply_rotary, rotary_tables
from olmo_train.nn.windows import DocumentIds, document_attention, layer_masks, window_attention

try:  # optional: only on GPU machines that have it
    from flash_attn import flash_attn_func  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


NORM_TYPES = CHOICES["model.layer_norm_type"]


def mlp_hidden_size(cfg: ModelConfig) -> int:
    if cfg.mlp_hidden_size is not None:
        return cfg.mlp_hidden_size
    return 128 * math.ceil(8 * cfg.d_model / 3 / 128)


class Norm(nn.Module):
    """RMSNorm (OLMo-2, Llama) or LayerNorm without bias (OLMo-1), with a learned scale or none.

    Without the scale the module has no parameter at all, so such a model's state dict has no norm weights, as
    OLMo-1's checkpoints and transformers' `OlmoLayerNorm` have none.
    """

    def __init__(self, size: int, eps: float, kind: str = "rms", affine: bool = True) -> None:
        super().__init__()
        if kind not in NORM_TYPES:
            raise ValueError(f"norm type {kind!r}: expected one of {NORM_TYPES}")
        self.eps = eps
        self.rms = kind == "rms"
        self.weight: nn.Parameter | None = nn.Parameter(torch.ones(size)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 for stability under bf16 autocast, then return to the input's dtype (transformers does
        # so for both kinds; OLMo under autocast too, as torch runs layer_norm in fp32 there)
        weight = self.weight.float() if self.weight is not None else None
        if self.rms:
            return F.rms_norm(x.float(), (x.shape[-1],), weight, self.eps).to(x.dtype)
        return F.layer_norm(x.float(), (x.shape[-1],), weight, None, self.eps).to(x.dtype)


def build_norm(cfg: ModelConfig, size: int, affine: bool | None = None) -> Norm:
    """The config's norm for `size` features; `affine` defaults to `layer_norm_with_affine` (QK-norm passes
    True: OLMo keeps its scale whatever layer_norm_with_affine says)."""
    with_scale = cfg.layer_norm_with_affine if affine is None else affine
    return Norm(size, cfg.layer_norm_eps, cfg.layer_norm_type, with_scale)


class LayerCache(Protocol):
    """Keys and values of one layer for the tokens before the current ones (see generate.KVCache)."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's keys/values (B, H_kv, T, D); return all of them so far (B, H_kv, S, D)."""
        ...


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int | None = None) -> None:
        super().__init__()
        self.window = window  # attend to the last `window` tokens only (olmo_train/nn/windows); None: all
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        kv_dim = self.n_kv_heads * self.head_dim
        self.use_flash = cfg.flash_attention and flash_attn_func is not None
        self.w_q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.w_k = nn.Linear(cfg.d_model, kv_dim, bias=False)
        self.w_v = nn.Linear(cfg.d_model, kv_dim, bias=False)
        self.w_out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        # OLMo-2's QK-norm normalises the whole projection (all heads together), before splitting into heads
        self.q_norm = build_norm(cfg, cfg.d_model, affine=True) if cfg.attention_layer_norm else None
        self.k_norm = build_norm(cfg, kv_dim, affine=True) if cfg.attention_layer_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | BlockMask | DocumentIds | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        """`mask`: bool (B, 1, T, S), True where a query may attend to a key, or a FlexAttention block mask
        (document masking, `olmo_train.nn.documents`); a windowed layer's document rule comes as `DocumentIds`.
        None is plain causal attention. `cache`: earlier tokens' keys/values, extended with this call's."""
        B, T, C = x.shape
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v)
        y = self.attend(q, k, v, mask, plain=mask is None and cache is None)
        return self.w_out(y.transpose(1, 2).reshape(B, T, C))  # type: ignore[no-any-return]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | BlockMask | DocumentIds | None,
        plain: bool,
    ) -> torch.Tensor:
        """(B, H, T, D) queries against (B, H_kv, S, D) keys, by the fastest path the mask and device allow."""
        T, S, gqa = q.shape[2], k.shape[2], self.n_kv_heads != self.n_heads
        if isinstance(mask, BlockMask):
            flex = _compiled_flex if q.is_cuda and _compiled_flex is not None else flex_attention
            return flex(q, k, v, block_mask=mask, enable_gqa=gqa)  # type: ignore[no-any-return]
        if plain and self.use_flash and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
            # flash-attn's window is (keys before, keys after) inclusive: w - 1 before and itself make w tokens
            window = {} if self.window is None else {"window_size": (self.window - 1, 0)}
            y = flash_attn_func(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                causal=True,
                deterministic=torch.are_deterministic_algorithms_enabled(),  # `deterministic: true`
                **window,
            )
            return y.transpose(1, 2)  # type: ignore[no-any-return]
        if isinstance(mask, DocumentIds):  # no T x T mask: documents one at a time, or blocks of queries
            return document_attention(q, k, v, mask.ids, self.window)
        if self.window is not None and S > self.window:  # some keys lie outside the window: blocks of queries
            return window_attention(q, k, v, self.window, mask)
        assert not isinstance(mask, DocumentIds)
        if mask is not None and mask.shape[-1] > S:  # a windowed layer's cache keeps the last S keys only
            mask = mask[..., -S:]
        if mask is None and T > 1 and S > T:  # new tokens after cached ones: causal, aligned at the end
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1, enable_gqa=gqa)


_compiled_flex: Any = None


def compiled_flex_attention() -> Any:
    """FlexAttention compiled, for GPUs: uncompiled it materialises every score (inside a compiled block it is
    compiled with the block either way). Made at the first GPU forward with a block mask, outside any compiled
    region, so that importing the model does not load the compiler. On CPU flex runs unfused: for tests and
    inference (torch has no FlexAttention backward there)."""
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = mlp_hidden_size(cfg)
        self.w_gate = nn.Linear(cfg.d_model, hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int | None = None) -> None:
        super().__init__()
        self.norm_after = cfg.norm_after
        self.attention = Attention(cfg, window)
        self.attention_norm = build_norm(cfg, cfg.d_model)
        self.mlp = MLP(cfg)
        self.mlp_norm = build_norm(cfg, cfg.d_model)
        # model.activation_checkpointing: the policy (olmo_train/nn/recompute). Applied inside forward, so that a
        # compiled block compiles the checkpoint with it (the policy then holds for the compiled kernels too) and
        # FSDP2's hooks gather the weights around both the forward and its recomputation.
        self.recompute = cfg.activation_checkpointing_policy if cfg.activation_checkpointing else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | BlockMask | DocumentIds | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        if self.recompute is not None and self.training and cache is None and torch.is_grad_enabled():
            return checkpointed(self.compute, self.recompute, x, cos, sin, mask)
        return self.compute(x, cos, sin, mask, cache)

    def compute(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | BlockMask | DocumentIds | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        if self.norm_after:  # OLMo-2: x + norm(f(x))
            x = x + self.attention_norm(self.attention(x, cos, sin, mask, cache))
            return x + self.mlp_norm(self.mlp(x))  # type: ignore[no-any-return]
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, cache)  # pre-norm: x + f(norm(x))
        return x + self.mlp(self.mlp_norm(x))  # type: ignore[no-any-return]


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        embedding_size = cfg.embedding_size or cfg.vocab_size
        self.embeddings = nn.Embedding(embedding_size, cfg.d_model)
        # per layer: its attention window (None: full attention), and whether its rotary tables are YaRN's (the
        # full-attention layers', as transformers' Olmo3 and OLMo-core's with_rope_scaling have it)
        self.windows, self.yarn = cfg.attention_windows(), cfg.yarn()
        self.scaled = [self.yarn is not None and w is None for w in self.windows]
        self.blocks = nn.ModuleList([Block(cfg, w) for w in self.windows])
        self.norm = build_norm(cfg, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, embedding_size, bias=False)
        if cfg.weight_tying:
            self.lm_head.weight = self.embeddings.weight
        self.rope_cos: torch.Tensor
        self.rope_sin: torch.Tensor
        self.yarn_cos: torch.Tensor | None
        self.yarn_sin: torch.Tensor | None
        self._make_rotary(cfg.max_sequence_length)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """OLMo-2's init: every weight matrix ~ N(0, init_std) truncated at 3 std; norm weights 1."""
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
            elif isinstance(module, Norm) and module.weight is not None:
                nn.init.ones_(module.weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | BlockMask | None = None,
        cache: list[LayerCache] | None = None,
        last_only: bool = False,
        labels: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        z_loss_multiplier: float | None = None,
        logits_at: torch.Tensor | None = None,
        instance_losses: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, ...] | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(B, T) token ids -> (B, T, embedding_size) logits; with `labels` (B, T - 1), the next-token targets
        (-100: not trained), the summed cross-entropy instead, computed without ever holding the full logits
        (`olmo_train.nn.loss`): training passes them. With `z_loss_multiplier` too, the pair (cross-entropy sum,
        z-loss sum), both over the supervised tokens (a tuple: FSDP2 and DDP follow the tensors of a tuple into
        backward). With `instance_losses` too, the triple (cross-entropy sum, z-loss sum or None, each row's
        cross-entropy sum, detached float64 (B,)): the per-instance record of the same forward, the sums unchanged.

        Generation passes `positions` (B, T) (each row's own, e.g. after left padding), `mask` (see
        `Attention.forward`), one cache per layer, and `last_only` to compute the logits of the last position
        only (the output head is the largest matmul at a 100K vocabulary). Training with `model.document_masking`
        passes `doc_ids` (B, T), each token's document within its row (`olmo_train.nn.documents`): attention then
        stays within documents, and with `model.document_positions` positions restart at each. Downstream
        evaluation passes `logits_at` (B, K), the positions of each row whose logits it scores (B, K, vocab).
        """
        T = input_ids.shape[1]
        flex = doc_ids is not None and use_flex(self.cfg.document_attention, input_ids.device)
        if doc_ids is not None:
            if flex and input_ids.is_cuda:
                compiled_flex_attention()
            if self.cfg.document_positions:
                positions = document_positions(doc_ids)
        masks = layer_masks(self.windows, mask, doc_ids, flex)  # by window: one per kind of layer
        self._extend_rotary(T if positions is None else int(positions.max()) + 1)
        tables = {False: (self.rope_cos, self.rope_sin), True: (self.yarn_cos, self.yarn_sin)}
        rotary = {}
        for scaled in dict.fromkeys(self.scaled):
            cos, sin = tables[scaled]
            assert cos is not None and sin is not None
            if positions is None:
                rotary[scaled] = cos[:T], sin[:T]
            else:
                rotary[scaled] = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        x = self.embeddings(input_ids)
        for i, block in enumerate(self.blocks):  # with activation checkpointing, each block recomputes itself
            cos, sin = rotary[self.scaled[i]]
            x = block(x, cos, sin, masks[self.windows[i]], cache[i] if cache is not None else None)
        if labels is not None:
            hidden, chunk = self.norm(x[:, :-1]), self.cfg.loss_chunk_tokens
            if instance_losses:
                return token_loss_rows(hidden, self.lm_head.weight, labels, z_loss_multiplier, chunk)
            if z_loss_multiplier is not None:
                return token_loss_sums(hidden, self.lm_head.weight, labels, z_loss_multiplier, chunk)
            return token_loss_sum(hidden, self.lm_head.weight, labels, chunk)
        if last_only:
            x = x[:, -1:]
        elif logits_at is not None:
            x = x.gather(1, logits_at.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return self.lm_head(self.norm(x))  # type: ignore[no-any-return]

    def _make_rotary(self, length: int) -> None:
        """The rotary tables for `length` positions: plain, and YaRN's for the full-attention layers when the config
        scales them (buffers derived from the config: not checkpointed)."""
        head_dim, theta = self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta
        device = self.rope_cos.device if hasattr(self, "rope_cos") else torch.get_default_device()
        cos, sin = rotary_tables(head_dim, length, theta)
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)
        ycos, ysin = rotary_tables(head_dim, length, theta, self.yarn) if self.yarn is not None else (None, None)
        self.register_buffer("yarn_cos", None if ycos is None else ycos.to(device), persistent=False)
        self.register_buffer("yarn_sin", None if ysin is None else ysin.to(device), persistent=False)

    def _extend_rotary(self, length: int) -> None:
        """Grow the rotary tables to `length` positions (doubling), for sequences past the trained length."""
        have = self.rope_cos.shape[0]
        if length > have:
            self._make_rotary(max(length, 2 * have))

    def num_params(self, include_embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())  # a tied weight is counted once
        if not include_embeddings:
            n -= self.embeddings.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 * non-embedding params (with the output head) + attention's 12*d*T per
        layer, T capped at a windowed layer's window."""
        non_embedding = sum(p.numel() for p in self.parameters()) - self.embeddings.weight.numel()
        if self.cfg.weight_tying:
            non_embedding += self.embeddings.weight.numel()  # the tied head still does its matmul
        keys = sum(seq_len if w is None else min(w, seq_len) for w in self.windows)
        return 6.0 * non_embedding + 12.0 * self.cfg.d_model * keys
