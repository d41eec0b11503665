"""Checkpoints out to, and in from, Hugging Face model directories (`olmo-train export-hf` / `import-hf`).

An export is only useful if others' tools load it as the model that was trained, with the tokenizer its data was
made with; so the tokenizer is the one the data manifest records (checked by hash), the special ids are the ones
the data used, and the written directory is loaded back (by transformers when installed) before it gets its name:
transformers itself only *warns* when a weight it expected is missing and quietly initialises it at random. An
import gives the trainer what it resumes from (model.pt, trainer_state.json, config.yaml), so fine-tuning an
imported model is `--load_path=DIR --reset_trainer_state`. Both write under a `.tmp-` name and rename at the end.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import time
from pathlib import Path

import torch

from olmo_data.config import ModelConfig
from olmo_data.display import Stages
from olmo_data.errors import DataError
from olmo_train import checkpoint as ckpt
from olmo_train.convert.hf import expected_hf_names, hf_config, model_type_for, read_hf_dir, to_hf_state
from olmo_train.convert.hf_files import (
    CONFIG_JSON,
    INSTALL_HINT,
    local_model_dir,
    read_json,
    safetensors_names,
    write_safetensors,
)
from olmo_train.convert.hf_olmo import is_hf_olmo
from olmo_train.convert.hf_tokenizer import SPECIAL, TOKENIZER_FILES, export_tokenizer, write_json, write_tokenizer
from olmo_train.convert.load import read_model_state

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def require_transformers(what: str) -> None:
    if importlib.util.find_spec("transformers") is None:
        raise DataError(f"{what} compares with transformers, which is not installed: {INSTALL_HINT}")


# ---- export -------------------------------------------------------------------------------------------------


def export_hf(
    checkpoint: Path,
    destination: Path,
    *,
    dtype: str = "float32",
    tokenizer: str | None = None,
    force: bool = False,
    check: bool = False,
    max_shard_bytes: int = 5 * 10**9,
) -> Path:
    """Write a transformers model directory (config, weights, generation config, tokenizer) for a sharded or
    unsharded checkpoint of ours; return its path.

    `tokenizer` replaces the one the data manifest records, which it must equal (by SHA-256) unless `force`.
    `check` also compares the exported model with ours block by block (see hf_check).
    """
    source, dest = Path(checkpoint).expanduser(), Path(destination).expanduser()
    ckpt.refuse_existing(dest)
    if dtype not in DTYPES:
        raise DataError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if check:
        require_transformers("--check")
    ckpt.checkpoint_kind(source)  # complete and ours, before anything else is read
    cfg = ckpt.read_config(source)
    model = cfg.model
    model_type_for(model)  # refuse an architecture transformers does not have before reading any weights
    tok, ids = export_tokenizer(cfg, source, tokenizer, force)
    rows = model.embedding_size or model.vocab_size
    if tok is not None and tok.vocab_size > rows:
        raise DataError(
            f"{tok.path}: the tokenizer has {tok.vocab_size} tokens, but the model's embedding has only {rows} rows "
            f"(model.{'embedding_size' if model.embedding_size else 'vocab_size'}); ids past {rows - 1} have no "
            "embedding. Export with the tokenizer the model was trained with"
        )
    t0 = time.perf_counter()
    with Stages("export-hf", ["reading", "converting", "writing", "loading back"], delay=1.0) as stages:
        stages.start("reading")
        state = read_model_state(source)
        stages.start("converting")
        # --check runs ours on the weights as exported (rounded to dtype), so only the mapping is compared
        reference = {k: v.to(DTYPES[dtype]).float() for k, v in state.items()} if check else None
        mapped = to_hf_state(state, model, str(source))
        del state
        hf_state = {}
        for key in list(mapped):  # cast one tensor at a time, dropping its source: memory stays near one model
            hf_state[key] = mapped.pop(key).to(DTYPES[dtype])
        with ckpt.atomic_directory(dest) as tmp:
            stages.start("writing")
            config = hf_config(model, dtype=dtype, **{f"{s}_token_id": ids[s] for s in SPECIAL})
            write_json(tmp / CONFIG_JSON, config)
            write_json(tmp / "generation_config.json", {f"{s}_token_id": ids[s] for s in SPECIAL})
            write_safetensors(hf_state, tmp, max_shard_bytes)
            del hf_state  # the reload below must not hold a second copy
            if tok is not None:
                write_tokenizer(tok, ids, model, tmp)
            stages.start("loading back")
            _verify_export(tmp, model, reference)
    log.debug("exported %s to %s in %.1f s", source, dest, time.perf_counter() - t0)
    return dest


def _verify_export(directory: Path, model: ModelConfig, reference: dict[str, torch.Tensor] | None) -> None:
    """Load the export back and fail on any tensor transformers would not take as written; with a `reference`
    state (--check), also compare the loaded model with ours block by block."""
    if importlib.util.find_spec("transformers") is None:
        written = safetensors_names(directory)
        expected = expected_hf_names(model)
        if set(written) != expected:
            raise DataError(
                f"{directory}: the written tensors are not the ones a {model_type_for(model).name} model has "
                f"(missing {sorted(expected - set(written))[:4]}, unexpected {sorted(set(written) - expected)[:4]})"
            )
        log.info("checked the written tensor names (transformers is not installed: not loaded back)")
        return
    from olmo_train.convert.hf_check import compare_with_transformers, load_transformers_model

    log.debug("loading the export back with transformers")
    hf_model, info = load_transformers_model(directory, loading_info=True, float32=reference is not None)
    problems = {k: list(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(problems.values()):
        found = "; ".join(f"{k.replace('_', ' ')}: {v[:4]}" for k, v in problems.items() if v)
        raise DataError(f"{directory}: transformers does not load every tensor as written ({found})")
    if reference is not None:
        diff = compare_with_transformers(hf_model, model, reference)
        log.info("check: every block agrees with transformers (max abs logit difference %.3g)", diff)


# ---- import -------------------------------------------------------------------------------------------------


def import_hf(model: str, destination: Path, *, check: bool = False) -> Path:
    """Make an unsharded checkpoint of ours (model.pt, trainer_state.json, config.yaml, tokenizer files) from a
    transformers model directory or hub id; return its path. `check` compares ours with transformers' model of
    the source, block by block, before anything is written."""
    dest = Path(destination).expanduser()
    ckpt.refuse_existing(dest)
    if check:
        require_transformers("--check")
    source = local_model_dir(model)
    if check and is_hf_olmo(read_json(source / CONFIG_JSON, "config")):
        raise DataError(
            f"{source}: --check loads the source with transformers, which has no hf_olmo (ai2-olmo's format); "
            "import without --check, then `export-hf --check` compares the result with transformers' olmo/olmo2"
        )
    t0 = time.perf_counter()
    with Stages("import-hf", ["reading", *(["checking"] if check else []), "writing"], delay=1.0) as stages:
        stages.start("reading")
        model_cfg, state = read_hf_dir(str(source))
        if check:
            from olmo_train.convert.hf_check import compare_with_transformers

            stages.start("checking")
            diff = compare_with_transformers(source, model_cfg, state)
            log.info("check: every block agrees with transformers (max abs logit difference %.3g)", diff)
        stages.start("writing")
        copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
        if "tokenizer.json" not in copied:
            log.warning("%s has no tokenizer.json: prepare data for this model with its tokenizer", source)

        def add_tokenizer(tmp: Path) -> None:
            for name in copied:
                shutil.copyfile(source / name, tmp / name)

        ckpt.write_imported(dest, model_cfg, state, add_tokenizer, [ckpt.lineage.import_record("import-hf", model)])
    log.debug("imported %s to %s in %.1f s", model, dest, time.perf_counter() - t0)
    return dest
