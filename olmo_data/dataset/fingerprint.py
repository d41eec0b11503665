"""Batch fingerprints: one short digest that names exactly which token ids a global batch held.

The trainer logs it each step (`train/batch_fingerprint` in metrics.jsonl) and `olmo-data inspect-batch` prints it,
so a user can check that the batch they reconstruct is the batch that was trained, bit for bit.

Definition (stable, documented in docs/inspect-and-trace.md): the first 16 hex digits of SHA-256 over the batch's
token ids, as a C-contiguous array of shape (global_batch_size, sequence_length) in batch-position order, cast to
little-endian uint32. The cast makes the digest independent of the dtype the token files happen to use.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

FINGERPRINT_HEX_DIGITS = 16


def batch_fingerprint(token_ids: npt.ArrayLike) -> str:
    """Digest of a global batch given as a (global_batch_size, sequence_length) array of token ids."""
    arr = np.ascontiguousarray(np.asarray(token_ids), dtype="<u4")
    if arr.ndim != 2:
        raise ValueError(f"batch_fingerprint expects a 2-D (batch, sequence) array, got shape {arr.shape}")
    return hashlib.sha256(arr.tobytes()).hexdigest()[:FINGERPRINT_HEX_DIGITS]
