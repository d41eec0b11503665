"""The model and what runs inside its forward pass.

Modules: `model` (the decoder: norms, rotary attention, MLP, blocks; reads like nanoGPT), `loss` (the chunked
cross-entropy and z-loss computed inside the forward), `documents` (masks and positions that keep packed documents
apart), `windows` (attention windows: blocked attention, window masks), `rope` (rotary tables, plain or YaRN),
`recompute` (activation checkpointing policies), `float8` (fp8 linears through torchao), `lora` (the adapter module
and the arithmetic that merges adapters into a state dict).
"""

from olmo_train.nn import float8, lora, rope, windows
from olmo_train.nn.documents import (
    attention_mask,
    check_trainable,
    doc_ids_from_eos,
    doc_ids_from_starts,
    document_mask,
    document_positions,
    use_flex,
)
from olmo_train.nn.loss import chunk_tokens, token_loss_rows, token_loss_sum, token_loss_sums
from olmo_train.nn.model import Transformer, mlp_hidden_size
from olmo_train.nn.recompute import checkpointed

__all__ = [
    "Transformer",
    "attention_mask",
    "check_trainable",
    "checkpointed",
    "chunk_tokens",
    "doc_ids_from_eos",
    "doc_ids_from_starts",
    "document_mask",
    "document_positions",
    "float8",
    "lora",
    "mlp_hidden_size",
    "rope",
    "token_loss_rows",
    "token_loss_sum",
    "token_loss_sums",
    "use_flex",
    "windows",
]
