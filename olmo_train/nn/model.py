"""An OLMo-2-style decoder-only transformer, small enough to read top to bottom.

RMSNorm, rotary position embeddings, SwiGLU MLP, QK-norm, no biases, optional grouped-query attention and
weight tying. `norm_after=True` is OLMo-2's reordered norm (the sublayer's output is normalised before it
joins the residual stream, which keeps the residual stream's scale in check at scale); `norm_after=False` is
the classic pre-norm block. OLMo-1 is the pre-norm block with LayerNorm instead of RMSNorm, without learned
scales and without QK-norm (`layer_norm_type: layer_norm`, `layer_norm_with_affine: false`). Attention is
torch's SDPA, or flash-attn when it is installed and the model runs on a GPU in bf16.

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
from olmo_train.nn.documents import attention_mask, document_positions, use_flex
from olmo_train.nn.loss import token_loss_rows, token_loss_sum, token_loss_sums
from olmo_train.nn.recompute import checkpointed

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


def rotary_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (T, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, head_dim), rotate-half layout as in OLMo / GPT-NeoX
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin: (T, D), or (B, 1, T, D) when each row has its own positions."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class LayerCache(Protocol):
    """Keys and values of one layer for the tokens before the current ones (see generate.KVCache)."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's keys/values (B, H_kv, T, D); return all of them so far (B, H_kv, S, D)."""
        ...


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
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
        mask: torch.Tensor | BlockMask | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        """`mask`: bool (B, 1, T, S), True where a query may attend to a key, or a FlexAttention block mask
        (document masking, `olmo_train.nn.documents`); None is plain causal attention. `cache`: earlier tokens'
        keys/values, extended with this call's."""
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
        plain = mask is None and cache is None
        if isinstance(mask, BlockMask):
            flex = _compiled_flex if q.is_cuda and _compiled_flex is not None else flex_attention
            y = flex(q, k, v, block_mask=mask, enable_gqa=self.n_kv_heads != self.n_heads)
            y = y.transpose(1, 2).reshape(B, T, C)
        elif plain and self.use_flash and x.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
            y = flash_attn_func(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                causal=True,
                deterministic=torch.are_deterministic_algorithms_enabled(),  # `deterministic: true`
            )
            y = y.reshape(B, T, C)
        else:
            S = k.shape[2]
            if mask is None and T > 1 and S > T:  # new tokens after cached ones: causal, aligned at the end
                mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None and T > 1, enable_gqa=self.n_kv_heads != self.n_heads
            )
            y = y.transpose(1, 2).reshape(B, T, C)
        return self.w_out(y)  # type: ignore[no-any-return]


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
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_after = cfg.norm_after
        self.attention = Attention(cfg)
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
        mask: torch.Tensor | BlockMask | None = None,
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
        mask: torch.Tensor | BlockMask | None = None,
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
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = build_norm(cfg, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, embedding_size, bias=False)
        if cfg.weight_tying:
            self.lm_head.weight = self.embeddings.weight
        cos, sin = rotary_tables(cfg.d_model // cfg.n_heads, cfg.max_sequence_length, cfg.rope_theta)
        self.rope_cos: torch.Tensor
        self.rope_sin: torch.Tensor
        self.register_buffer("rope_cos", cos, persistent=False)  # derived from the config: not checkpointed
        self.register_buffer("rope_sin", sin, persistent=False)
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
        if doc_ids is not None:
            flex = use_flex(self.cfg.document_attention, input_ids.device)
            mask = attention_mask(doc_ids, flex)
            if flex and input_ids.is_cuda:
                compiled_flex_attention()
            if self.cfg.document_positions:
                positions = document_positions(doc_ids)
        self._extend_rotary(T if positions is None else int(positions.max()) + 1)
        if positions is None:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        x = self.embeddings(input_ids)
        for i, block in enumerate(self.blocks):  # with activation checkpointing, each block recomputes itself
            x = block(x, cos, sin, mask, cache[i] if cache is not None else None)
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

    def _extend_rotary(self, length: int) -> None:
        """Grow the rotary tables to `length` positions (doubling), for sequences past the trained length."""
        have = self.rope_cos.shape[0]
        if length <= have:
            return
        new_len = max(length, 2 * have)
        cos, sin = rotary_tables(self.cfg.d_model // self.cfg.n_heads, new_len, self.cfg.rope_theta)
        self.rope_cos = cos.to(self.rope_cos.device)
        self.rope_sin = sin.to(self.rope_sin.device)

    def num_params(self, include_embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())  # a tied weight is counted once
        if not include_embeddings:
            n -= self.embeddings.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 * non-embedding params (with the output head) + attention's
        12*l*d*T."""
        non_embedding = sum(p.numel() for p in self.parameters()) - self.embeddings.weight.numel()
        if self.cfg.weight_tying:
            non_embedding += self.embeddings.weight.numel()  # the tied head still does its matmul
        return 6.0 * non_embedding + 12.0 * self.cfg.n_layers * self.cfg.d_model * seq_len
