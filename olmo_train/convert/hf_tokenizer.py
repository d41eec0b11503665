"""The tokenizer a converted model ships with: the one its data was made with, checked by SHA-256, written as
`transformers` loads it (tokenizer.json and a tokenizer_config.json naming the special tokens)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from olmo_data.config import ModelConfig, TrainConfig
from olmo_data.errors import DataError
from olmo_data.tokenizer import Tokenizer, load_tokenizer
from olmo_train import checkpoint as ckpt
from olmo_train.convert.hf_files import read_json

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
SPECIAL = ("bos", "eos", "pad")


def write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def export_tokenizer(
    cfg: TrainConfig, source: Path, given: str | None, force: bool
) -> tuple[Tokenizer | None, dict[str, Any]]:
    """The tokenizer to ship and the bos/eos/pad ids the data was made with (the manifest's where it states
    them, else the tokenizer's own). A checkpoint made by import-hf has no data yet but carries its model's
    tokenizer files, which then stand in for the manifest."""
    where = "the run's data manifest"
    try:
        recorded = ckpt.recorded_tokenizer(cfg)
    except DataError:
        if given is None:
            raise
        log.warning("the run's data was tokenized with several tokenizers; exporting with %s as given", given)
        recorded = None
    own = source / ckpt.TOKENIZER_FILE
    if recorded is None and own.is_file():
        where = f"the checkpoint's {ckpt.TOKENIZER_FILE}"
        tok = shippable_tokenizer(str(own))
        recorded = {"name": own.name, "path": str(own), "sha256": tok.sha256}
        recorded.update(special_ids(source / "tokenizer_config.json", tok))
    if recorded is None and given is None:
        log.warning("no tokenizer: the run's data has no manifest naming one; pass --tokenizer to include one")
        return None, dict.fromkeys(SPECIAL)
    if given is not None:
        tok = shippable_tokenizer(given)
        if recorded and tok.sha256 != recorded["sha256"]:
            if not force:
                raise DataError(
                    f"{given}: sha256 {tok.sha256} differs from {recorded['sha256']}, the tokenizer "
                    f"({recorded.get('name')}, {recorded.get('path')}) that {where} records; it is not the tokenizer "
                    "the model was trained with. Pass --force to export with it anyway"
                )
            log.warning("%s differs from the tokenizer the data was made with; exporting it anyway (force)", given)
    elif recorded is not None:
        path = str(recorded.get("path") or "")
        if not path or not os.path.exists(path):
            raise DataError(
                f"{where} records tokenizer {recorded.get('name')!r} at {path or '(no path)'}, which is not here; "
                f"pass --tokenizer with that tokenizer.json (sha256 {recorded['sha256']})"
            )
        tok = shippable_tokenizer(path)
        if tok.sha256 != recorded["sha256"]:
            if not force:
                raise DataError(
                    f"{path}: sha256 {tok.sha256}, but {where} records {recorded['sha256']}: the file changed since "
                    "the data was tokenized. Pass --tokenizer with the original, or --force"
                )
            log.warning("%s changed since the data was tokenized; exporting it anyway (force)", path)
    ids = {s: (recorded or {}).get(f"{s}_token_id") for s in SPECIAL}
    for s in SPECIAL:
        if ids[s] is None:
            ids[s] = getattr(tok, f"{s}_token_id")
    return tok, ids


def special_ids(path: Path, tok: Tokenizer) -> dict[str, Any]:
    """bos/eos/pad ids named by a tokenizer_config.json (as a string or as {"content": ...})."""
    if not path.is_file():
        return {}
    config = read_json(path, "tokenizer config")
    out = {}
    for s in SPECIAL:
        token = config.get(f"{s}_token")
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and tok.hf.token_to_id(token) is not None:
            out[f"{s}_token_id"] = tok.hf.token_to_id(token)
    return out


def shippable_tokenizer(spec: str) -> Tokenizer:
    """A tokenizer that transformers can ship: a tokenizer.json (local, or a hub id where a network exists)."""
    if spec.endswith(".tiktoken"):
        raise DataError(f"{spec}: transformers needs a tokenizer.json, not a .tiktoken ranks file")
    return load_tokenizer(spec, "hf")


def import_tokenizer(
    spec: str | None, model: ModelConfig, checkpoint: str, trainer: str, named: Any
) -> Tokenizer | None:
    """The `--tokenizer` an import from another trainer's checkpoint ships with ours: refused when it has ids past
    the model's embedding rows (they would have no embedding). OLMo's and OLMo-core's checkpoints carry none: without
    one, a warning names the tokenizer the source's config names (`named`), which generate and export-hf need."""
    if spec is None:
        log.warning(
            "%s: %s checkpoints carry no tokenizer (its config names %s); pass it as --tokenizer for generate and "
            "export-hf to use",
            checkpoint,
            trainer,
            named or "none",
        )
        return None
    tok = shippable_tokenizer(spec)
    rows = model.embedding_size or model.vocab_size
    if tok.vocab_size > rows:
        raise DataError(
            f"{spec}: {tok.vocab_size} tokens, but the model's embedding has {rows} rows; ids past {rows - 1} would "
            "have no embedding: give the tokenizer the model was trained with"
        )
    return tok


def write_tokenizer(tok: Tokenizer, ids: dict[str, Any], model: ModelConfig, directory: Path) -> None:
    """tokenizer.json as the data was made with it, and the tokenizer_config.json that makes
    `AutoTokenizer.from_pretrained` load it as a fast tokenizer with its special tokens."""
    if os.path.isfile(tok.path):
        shutil.copyfile(tok.path, directory / "tokenizer.json")  # the bytes whose sha256 the manifest records
    else:  # loaded from the hub: its sha256 is that of this text
        directory.joinpath("tokenizer.json").write_text(tok.hf.to_str())
    tokens = {f"{s}_token": tok.hf.id_to_token(ids[s]) if ids[s] is not None else None for s in SPECIAL}
    write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **tokens,
            "model_max_length": model.max_sequence_length,
            "clean_up_tokenization_spaces": False,
        },
    )
