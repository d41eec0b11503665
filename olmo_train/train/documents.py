"""Where the documents of a batch start: the data side of document-masked attention (`olmo_train.nn.documents`).

Pretraining token files are split after each EOS; a chat directory (`prepare-tulu`) at the conversation spans it
records, because there an EOS also ends every assistant turn inside a conversation.
"""

from __future__ import annotations

import numpy as np

from olmo_data.chat import FORMAT
from olmo_data.dataset import InstanceSource, Manifests, TokenFile, read_arrays
from olmo_data.errors import DataError
from olmo_data.io import file_size


def boundary_token(eos_token_id: int | None, token_files: list[str], manifests: Manifests | None = None) -> int:
    """The token that ends a document: the config's `model.eos_token_id`, else the one the token files'
    manifests record (tokenize and prepare-tulu write it); a clear error when neither says."""
    if eos_token_id is not None:
        return eos_token_id
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
