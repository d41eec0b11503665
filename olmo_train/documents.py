"""Attention within documents: the masks and positions that keep the documents packed into one instance apart.

A pretraining instance is a window of a token stream, so it holds the end of one document, others whole, and the
start of the next; `prepare-tulu --pack` puts several conversations into one instance. Plain causal attention
lets every token see the documents before it. With `model.document_masking`, a token attends only to earlier
tokens of its own document, and with `model.document_positions` the rotary positions restart at each document, so
a packed document is computed exactly as it would be alone.

Documents are numbered per instance: `doc_ids` (B, T) holds, for each token, its document's number within the
row (non-decreasing). The trainer derives them from the EOS token that ends each document (pretraining), or from
the conversation spans `prepare-tulu` records (chat data, where an EOS also ends each assistant turn).

Implementation (`model.document_attention`): a boolean (B, 1, T, T) mask for `scaled_dot_product_attention`,
correct on every device but T x T bytes per row and no saving in compute; or FlexAttention with a block mask, which
compiles to one fused kernel that skips the blocks outside every document (the default on GPUs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

    from olmo_data.instances import InstanceSource
    from olmo_data.manifest import Manifests
    from olmo_data.token_files import TokenFile


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
        from olmo_train.config import ConfigError

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


def boundary_token(eos_token_id: int | None, token_files: list[str], manifests: Manifests | None = None) -> int:
    """The token that ends a document: the config's `model.eos_token_id`, else the one the token files'
    manifests record (tokenize and prepare-tulu write it); a clear error when neither says."""
    if eos_token_id is not None:
        return eos_token_id
    from olmo_data.errors import DataError
    from olmo_data.manifest import Manifests

    manifests = manifests or Manifests()
    found: dict[int, str] = {}
    for path in token_files:
        directory, manifest = manifests.of_file(path)
        eos = manifest.get("eos_token_id")
        if eos is not None:
            found.setdefault(int(eos), directory)
    if len(found) != 1:
        which = f"record several: {sorted(found)}" if found else "record none"
        raise DataError(
            "config key 'model.document_masking': documents end at the EOS token, but model.eos_token_id is not set "
            f"and the token files' manifests {which}; set model.eos_token_id"
        )
    return next(iter(found))


class DocumentStarts:
    """Which tokens of a batch's rows start a document, as the trainer passes them to the model.

    A chat directory (`prepare-tulu`) records each conversation's (start, end) token span in `doc_boundaries.npy`:
    its instances are split there, and only there, because an EOS also ends every assistant turn inside a
    conversation; the padding after an instance's last conversation is a document of its own. Any other token file
    is split after each EOS (pretraining data: a document's EOS belongs to it, the next token starts a new one).
    """

    def __init__(self, source: InstanceSource, eos_token_id: int, manifests: Manifests | None = None) -> None:
        from olmo_data.manifest import Manifests

        self.source = source
        self.eos = eos_token_id
        manifests = manifests or Manifests()
        self._cuts = {k: cuts for k, f in enumerate(source.files) if (cuts := chat_cuts(f, manifests)) is not None}

    def rows(self, indices: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """(B, L) bool, True where a document starts, for the instances `indices` whose tokens are `tokens`."""
        starts = np.zeros(tokens.shape, dtype=bool)
        starts[:, 1:] = tokens[:, :-1] == self.eos
        if self._cuts:
            L = tokens.shape[1]
            for row, loc in enumerate(self.source.locate_many(indices)):
                cuts = self._cuts.get(loc.file_index)
                if cuts is not None:
                    lo, hi = np.searchsorted(cuts, [loc.token_offset, loc.token_offset + L])
                    starts[row] = False
                    starts[row, cuts[lo:hi] - loc.token_offset] = True
        starts[:, 0] = True
        return starts


def chat_cuts(file: TokenFile, manifests: Manifests) -> np.ndarray | None:
    """The sorted token offsets where a chat directory's conversations start or end (None for a file that is not
    a chat directory's). A chat directory without its boundaries, or with boundaries that do not fit its tokens,
    is refused by name: splitting its conversations at EOS would cut every reply from its prompt."""
    from olmo_data.chat import FORMAT
    from olmo_data.errors import DataError
    from olmo_data.instances import read_arrays
    from olmo_data.io import file_size

    directory, manifest = manifests.of_file(file.path)
    if manifest.get("format") != FORMAT:
        return None
    name = manifest.get("doc_boundaries")
    examples = sum(int(f.get("documents", 0)) for f in manifest.get("files", []))
    if not name:
        raise DataError(
            f"{directory}: a prepare-tulu directory without doc_boundaries in its manifest, which "
            "model.document_masking needs to keep conversations apart; prepare it again into a new destination"
        )
    path = f"{directory}/{name}"
    try:
        size = file_size(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read the conversation boundaries model.document_masking needs ({e})") from e
    if size != 16 * examples:
        raise DataError(
            f"{path}: {size} bytes, but {directory}/manifest.json counts {examples} conversations (16 bytes each); "
            "the directory is damaged: prepare it again"
        )
    spans = read_arrays([(path, "<u8", 0, 2 * examples)])[0].reshape(-1, 2).astype(np.int64)
    if len(spans) and (np.any(spans[:, 0] > spans[:, 1]) or spans.max() > file.num_tokens):
        raise DataError(
            f"{path}: spans outside the {file.num_tokens} tokens of {file.path}, or ending before they start"
        )
    return np.unique(spans)
