"""The `config.json` an OLMo-core run saves, read as far as the data side needs it.

OLMo-core's scripts save `ExperimentConfig.as_config_dict()` in every checkpoint folder: each config object is a
dict that names its class under `_CLASS_` (`module.ClassName`). Three sections decide which tokens a step trains:
`dataset` (token files, sequence length, mixture), `data_loader` (global batch size *in tokens*, seed, work_dir)
and `trainer` (its callbacks: a batch-size schedule changes which instances a step holds).

Only the classes whose rules live in this package are accepted; every other dataset, data loader or data-changing
callback is refused by its class name, so a batch is never rebuilt by guessing.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from olmo_data.dataset import RepetitionFilter
from olmo_data.errors import DataError, shown
from olmo_data.io import expand_patterns, file_size, read_bytes
from olmo_data.olmo_core.interleaved import Interleaving, read_interleaving
from olmo_data.olmo_core.mix_paths import mix_paths
from olmo_data.olmo_core.vsl_curriculum import VSLCurriculum, vsl_settings

if TYPE_CHECKING:
    from olmo_data.olmo_core.composable.spec import ComposableSpec

CLASS_KEY = "_CLASS_"
FSL = "NumpyFSLDatasetConfig"
PADDED_FSL = "NumpyPaddedFSLDatasetConfig"
PACKED_FSL = "NumpyPackedFSLDatasetConfig"
INTERLEAVED_FSL = "NumpyInterleavedFSLDatasetConfig"
COVERED_DATASETS = {FSL: "fsl", PADDED_FSL: "padded", PACKED_FSL: "packed", INTERLEAVED_FSL: "interleaved"}
VSL = "NumpyVSLDatasetConfig"
COVERED_DATASETS |= {VSL: "vsl"}  # olmo_data.olmo_core.vsl
LONG_DOC_STRATEGIES = ("truncate", "fragment")  # OLMo-core 3.0.0's LongDocStrategy
LOADER = "NumpyDataLoaderConfig"
MIXTURE = "SourceMixtureDatasetConfig"
BATCH_SIZE_SCHEDULER = "BatchSizeSchedulerCallback"
# datasets whose instances or order follow rules not reproduced here
REFUSED_DATASETS: dict[str, str] = {}
REFUSED_CALLBACKS = {"SequenceLengthSchedulerCallback": "a sequence-length warm-up changes every instance's tokens"}
# OLMo-core's NumpyDatasetDType, smallest first (it picks the first that holds vocab_size - 1)
# Bounds on what a config.json may ask for: far past any OLMo-core run, and small enough that a hostile number is
# refused by its key instead of making a command allocate or loop without end.
MAX_CONFIG_BYTES = 64 << 20  # OLMo 2's largest configs (thousands of data paths) are a few MB
MAX_SEQUENCE_LENGTH = 1 << 24  # tokens in an instance
MAX_BATCH_TOKENS = 1 << 30  # tokens in a global batch (a batch is read whole: 8 bytes a token)
MAX_EPOCHS = 10_000  # epochs a run may last (each epoch's order is rebuilt when it is walked)
MAX_REPETITION_RATIO = 1_000  # a mixture source's max_repetition_ratio (its file list is repeated that often)
MAX_INT = (1 << 63) - 1  # every other whole number: it must fit numpy's int64
NUMPY_DTYPES: dict[str, type[np.unsignedinteger[Any]]] = {
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
}


@dataclass(frozen=True)
class MixtureSource:
    """One source of an OLMo-core `SourceMixtureDatasetConfig` (its files already glob-expanded, sorted)."""

    name: str
    target_ratio: float
    paths: tuple[str, ...]
    max_repetition_ratio: float = 1.0
    max_source_fraction: float = 1.0


@dataclass(frozen=True)
class Mixture:
    """OLMo-core's source mixture: a token budget per source, allocated over its files (see `olmo_core.mixture`)."""

    sources: tuple[MixtureSource, ...]
    requested_tokens: int
    global_batch_size: int  # the mixture's own, in tokens (used to round the total to whole steps)
    seed: int


@dataclass(frozen=True)
class BatchSizeChange:
    """From `start` (in `unit`: steps, tokens or epochs, as OLMo-core's Duration) the batch is `tokens` tokens."""

    tokens: int
    start: int
    unit: str


@dataclass(frozen=True)
class OlmoCoreRun:
    """The data side of an OLMo-core run: everything that decides which tokens training step N held."""

    kind: str  # "fsl" (NumpyFSLDataset, or its mixture), "padded", "packed" or "interleaved" (their datasets)
    paths: tuple[str, ...]  # token files in dataset order (globs expanded, source_permutation_seed applied)
    label_mask_paths: tuple[str, ...] | None
    sequence_length: int
    max_target_sequence_length: int | None
    dtype: str
    pad_token_id: int
    eos_token_id: int
    bos_token_id: int | None
    vocab_size: int
    global_batch_size: int  # tokens, as configured (a schedule's first entry overrides it from step 1)
    seed: int
    work_dir: str  # where OLMo-core wrote its orders (the loader's work_dir, else the dataset's, else the tmp dir)
    dataset_work_dir: str  # where OLMo-core wrote per-file indices (the dataset's work_dir, else the loader's)
    mixture: Mixture | None = None
    batch_sizes: tuple[BatchSizeChange, ...] = field(default_factory=tuple)
    instance_filter: RepetitionFilter | None = None  # OLMo-core's instance_filter_config (its batches' instance_mask)
    source: str = ""  # the config file read, for messages
    max_duration: tuple[int, str] | None = None  # trainer.max_duration: (value, unit), None when the file gives none
    hard_stop: tuple[int, str] | None = None  # trainer.hard_stop: the Trainer stops at whichever comes first
    dtype_from: str = ""  # the key that decided `dtype`, as a message names it ("dataset.dtype uint32", ...)
    # packed only (olmo_data.olmo_core.packed): how documents become instances
    long_doc_strategy: str = "truncate"
    source_group_size: int = 1
    generate_doc_lengths: bool = False
    use_array_if_local: bool | None = None
    composable: ComposableSpec | None = None  # composable only (olmo_data.olmo_core.composable): its sources
    interleaving: Interleaving | None = None  # interleaved only (olmo_data.olmo_core.interleaved)
    # vsl only (olmo_data.olmo_core.vsl): buckets min_sequence_length .. sequence_length (its max_sequence_length)
    min_sequence_length: int | None = None
    curriculum: VSLCurriculum | None = None
    loader_threads: int = 0  # threads its loader reads instances with in the training process (vsl_curriculum)

    @property
    def chunk_size(self) -> int:
        """OLMo-core shuffles runs of `max_target_sequence_length // sequence_length` instances together."""
        if self.max_target_sequence_length is None:
            return 1
        return self.max_target_sequence_length // self.sequence_length


def is_olmo_core_config(config: Any) -> bool:
    """Whether a parsed config is one an OLMo-core run saved (its sections name their classes)."""
    if not isinstance(config, dict):
        return False
    sections = [config.get(k) for k in ("dataset", "data_loader")]
    return any(isinstance(s, dict) and str(s.get(CLASS_KEY, "")).startswith("olmo_core.") for s in sections)


def read_olmo_core_config(config: str | dict[str, Any], *, work_dir: str | None = None) -> OlmoCoreRun:
    """The data side of an OLMo-core `config.json` (a path or its parsed dict).

    `work_dir` replaces the run's own (the folder of OLMo-core's order files), for runs inspected away from the
    machine that trained them. Refuses what this package does not reproduce, naming the class.
    """
    where = "config"
    if isinstance(config, str):
        where = config
        config = read_config_json(config)
    if not isinstance(config, dict):
        raise DataError(f"{where}: expected a JSON object with dataset, data_loader and trainer sections")
    if composable_form(config):  # OLMo-core's composable data API: olmo_data.olmo_core.composable reads it
        return _composable(config, where, work_dir)
    dataset = _section(config, "dataset", where)
    loader = _section(config, "data_loader", where)
    trainer = config.get("trainer")
    if trainer is None:
        trainer = {}
    if not isinstance(trainer, dict):
        raise DataError(f"{where}: trainer is {shown(trainer)}; expected OLMo-core's TrainerConfig (a JSON object)")
    ds_class = _class_name(dataset, "dataset", where)
    if ds_class in REFUSED_DATASETS:
        raise DataError(
            f"{where}: dataset is OLMo-core's {ds_class} ({REFUSED_DATASETS[ds_class]}); not covered: only "
            f"{', '.join(COVERED_DATASETS)} batches are rebuilt"
        )
    if ds_class not in COVERED_DATASETS:
        raise DataError(
            f"{where}: dataset is {dataset.get(CLASS_KEY)}; not covered: only OLMo-core's "
            f"{', '.join(COVERED_DATASETS)} batches are rebuilt"
        )
    loader_class = _class_name(loader, "data_loader", where)
    if loader_class != LOADER:
        raise DataError(f"{where}: data_loader is {loader.get(CLASS_KEY)}; only OLMo-core's {LOADER} is covered")
    tokenizer = dataset.get("tokenizer")
    if not isinstance(tokenizer, dict):
        raise DataError(f"{where}: dataset.tokenizer is missing; OLMo-core's config names the token ids there")
    vocab_size = _int(tokenizer, "vocab_size", "dataset.tokenizer", where, lo=1)
    vsl = vsl_settings(dataset, loader, tokenizer, where) if ds_class == VSL else None
    if vsl is not None:  # its longest bucket
        seq_len = vsl.max_length
    else:
        seq_len = _int(dataset, "sequence_length", "dataset", where, lo=1, hi=MAX_SEQUENCE_LENGTH)
    mtsl = dataset.get("max_target_sequence_length")
    if mtsl is not None:
        mtsl = _int(dataset, "max_target_sequence_length", "dataset", where, lo=1, hi=MAX_SEQUENCE_LENGTH * 64)
    if mtsl is not None and (mtsl < seq_len or mtsl % seq_len):
        raise DataError(
            f"{where}: dataset.max_target_sequence_length ({mtsl}) must be a multiple of sequence_length ({seq_len})"
        )
    dtype = _dtype(dataset.get("dtype"), vocab_size, where)
    dtype_from = (
        f"dataset.dtype {dtype}"
        if dataset.get("dtype") is not None
        else f"dataset.tokenizer.vocab_size {vocab_size} (OLMo-core's rule: {dtype} tokens)"
    )
    gbs = _int(loader, "global_batch_size", "data_loader", where, lo=1, hi=MAX_BATCH_TOKENS)
    if gbs % seq_len:
        raise DataError(
            f"{where}: data_loader.global_batch_size ({gbs} tokens) must be a positive multiple of "
            f"dataset.sequence_length ({seq_len})"
        )
    mixture = _mixture(dataset.get("source_mixture_config"), where)
    if mixture is not None and (dataset.get("paths") is not None or dataset.get("mix") is not None):
        raise DataError(f"{where}: dataset gives both source_mixture_config and paths or mix; OLMo-core refuses that")
    if mixture is not None and dataset.get("label_mask_paths") is not None:
        raise DataError(f"{where}: dataset.label_mask_paths is not supported with source_mixture_config")
    paths, masks = _paths(dataset, where) if mixture is None else ((), None)
    # OLMo-core's loader writes orders to its work_dir, else the dataset's; the dataset writes its files to its
    # own, else the loader's; with neither, both use the training machine's temporary directory
    loader_wd = work_dir or loader.get("work_dir") or dataset.get("work_dir") or tempfile.gettempdir()
    dataset_wd = work_dir or dataset.get("work_dir") or loader.get("work_dir") or tempfile.gettempdir()
    if ds_class in (PACKED_FSL, INTERLEAVED_FSL) and mixture is not None:
        raise DataError(
            f"{where}: dataset.source_mixture_config with {ds_class}: not covered (OLMo-core reads its paths)"
        )
    batch_sizes = _batch_schedule(trainer, seq_len, where)
    if vsl is not None and batch_sizes:
        raise DataError(
            f"{where}: trainer.callbacks' {BATCH_SIZE_SCHEDULER} with {VSL}: not covered (OLMo-core's VSL loader "
            "keeps its batch counts from its first batch size, and fails reading a changed one's order)"
        )
    return OlmoCoreRun(
        kind=COVERED_DATASETS[ds_class],
        paths=paths,
        label_mask_paths=masks,
        sequence_length=seq_len,
        max_target_sequence_length=mtsl,
        dtype=dtype,
        pad_token_id=_int(tokenizer, "pad_token_id", "dataset.tokenizer", where),
        eos_token_id=_int(tokenizer, "eos_token_id", "dataset.tokenizer", where),
        bos_token_id=_int(tokenizer, "bos_token_id", "dataset.tokenizer", where)
        if tokenizer.get("bos_token_id") is not None
        else None,
        vocab_size=vocab_size,
        global_batch_size=gbs,
        seed=_int(loader, "seed", "data_loader", where),
        work_dir=str(loader_wd),
        dataset_work_dir=str(dataset_wd),
        mixture=mixture,
        batch_sizes=batch_sizes,
        instance_filter=_instance_filter(dataset.get("instance_filter_config"), where),
        source=where,
        max_duration=_duration(trainer.get("max_duration"), where),
        hard_stop=_duration(trainer.get("hard_stop"), where, "trainer.hard_stop"),
        dtype_from=dtype_from,
        **(_packing(dataset, seq_len, where) if ds_class == PACKED_FSL else {}),
        **(vsl.run_fields() if vsl else {}),
        interleaving=read_interleaving(dataset, seq_len, where) if ds_class == INTERLEAVED_FSL else None,
    )


def _packing(dataset: dict[str, Any], seq_len: int, where: str) -> dict[str, Any]:
    """A NumpyPackedFSLDatasetConfig's packing keys, checked as OLMo-core checks them (its packer's segment tree
    needs a power-of-two sequence length)."""
    strategy = dataset.get("long_doc_strategy", "truncate")
    if strategy not in LONG_DOC_STRATEGIES:
        raise DataError(
            f"{where}: dataset.long_doc_strategy is {shown(strategy)}; expected one of {list(LONG_DOC_STRATEGIES)}"
        )
    if seq_len & (seq_len - 1):
        raise DataError(f"{where}: dataset.sequence_length is {seq_len}; OLMo-core's packer needs a power of two")
    generate = dataset.get("generate_doc_lengths", False)
    local = dataset.get("use_array_if_local")
    for key, value in (("generate_doc_lengths", generate), ("use_array_if_local", local)):
        if value is not None and not isinstance(value, bool):
            raise DataError(f"{where}: dataset.{key} is {shown(value)}; expected true or false")
    return {
        "long_doc_strategy": str(strategy),
        "source_group_size": _int(dataset, "source_group_size", "dataset", where, lo=1, hi=1 << 20)
        if dataset.get("source_group_size") is not None
        else 1,
        "generate_doc_lengths": bool(generate),
        "use_array_if_local": local,
    }


def read_config_json(path: str) -> Any:
    """A config.json's parsed keys, or one line naming the file and what is wrong with it: too large, not UTF-8,
    not JSON (where it stops: a truncated copy), or nested too deeply for Python's parser (a hostile file)."""
    try:
        size = file_size(path)
    except (OSError, DataError) as e:
        raise DataError(f"{path}: cannot read the config ({e})") from e
    if size > MAX_CONFIG_BYTES:
        raise DataError(
            f"{path}: {size:,} bytes; an OLMo-core config.json is at most a few MB (read up to "
            f"{MAX_CONFIG_BYTES >> 20} MB): is this the run's config.json?"
        )
    try:
        return json.loads(read_bytes(path).decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text at byte {e.start}; give the config.json an OLMo-core run saved") from e
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}: not valid JSON: {e.msg} (line {e.lineno}, column {e.colno}; a truncated copy?); give the "
            "config.json an OLMo-core run saved"
        ) from e
    except RecursionError as e:
        raise DataError(
            f"{path}: JSON nested too deeply to read (objects or arrays inside each other thousands of levels "
            "deep); not a config.json OLMo-core saves"
        ) from e


def _duration(value: Any, where: str, key: str = "trainer.max_duration") -> tuple[int, str] | None:
    """A Duration of the trainer section (OLMo-core's: value and unit), checked; None when the file gives none."""
    if value is None:
        return None
    if not isinstance(value, dict) or "value" not in value:
        raise DataError(f"{where}: {key} is {shown(value)}; expected OLMo-core's Duration ({{value, unit}})")
    unit = value.get("unit", "steps")
    if unit not in ("steps", "tokens", "epochs"):
        raise DataError(f"{where}: {key}.unit is {shown(unit)}; expected steps, tokens or epochs")
    hi = MAX_EPOCHS if unit == "epochs" else MAX_INT
    return _int(value, "value", key, where, lo=0, hi=hi), str(unit)


def _section(config: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    section = config.get(key)
    if not isinstance(section, dict):
        raise DataError(
            f"{where}: no {key} section; give the config.json an OLMo-core run saved (its dataset, data_loader and "
            "trainer sections)"
        )
    return section


def _class_name(section: dict[str, Any], key: str, where: str) -> str:
    name = section.get(CLASS_KEY)
    if not isinstance(name, str) or not name.startswith("olmo_core."):
        raise DataError(
            f"{where}: {key}.{CLASS_KEY} is {shown(name)}; an OLMo-core config names each section's class there"
        )
    return name.rsplit(".", 1)[-1]


def _int(section: dict[str, Any], key: str, what: str, where: str, *, lo: int = 0, hi: int = MAX_INT) -> int:
    """A whole number from `lo` to `hi`, or one line naming the key (a string, a float, a bool or a number out of
    range would fail later as a traceback, or make a command work without bound)."""
    return _whole(section.get(key), f"{what}.{key}", where, lo=lo, hi=hi)


def _whole(value: Any, key: str, where: str, *, lo: int = 0, hi: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{where}: {key} is {shown(value)}; expected a whole number")
    if not lo <= value <= hi:
        raise DataError(f"{where}: {key} is {value}; expected a whole number from {lo:,} to {hi:,}")
    return value


def _number(
    section: dict[str, Any], key: str, what: str, where: str, default: float | None, lo: float, hi: float
) -> float:
    """A finite number from `lo` to `hi` (its default when the key is absent), or one line naming the key."""
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise DataError(f"{where}: {what}.{key} is {shown(value)}; expected a number from {lo:g} to {hi:g}")
    return float(value)


def _strings(value: Any, what: str, where: str) -> list[str]:
    """A list of paths (strings), or one line naming the key."""
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise DataError(f"{where}: {what} is {shown(value)}; expected a list of paths")
    return list(value)


def _dtype(value: Any, vocab_size: int, where: str) -> str:
    """OLMo-core's rule: the configured dtype, else the smallest unsigned type that holds vocab_size - 1."""
    if value is not None:
        if str(value) not in NUMPY_DTYPES:
            raise DataError(f"{where}: dataset.dtype is {shown(value)}; expected one of {list(NUMPY_DTYPES)}")
        return str(value)
    for name, dt in NUMPY_DTYPES.items():
        if vocab_size - 1 <= np.iinfo(dt).max:
            return name
    raise DataError(f"{where}: dataset.tokenizer.vocab_size {vocab_size} is too large for any token dtype")


def _expand(patterns: list[str], where: str, what: str) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        matches = sorted(expand_patterns([pattern])) if "*" in pattern else [pattern]
        if not matches:
            raise DataError(f"{where}: {what} pattern {pattern!r} matches no files")
        out.extend(matches)
    return out


def _paths(dataset: dict[str, Any], where: str) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """Token files and label masks in OLMo-core's dataset order: globs expanded (sorted), then shuffled with
    Python's `random.Random(source_permutation_seed)` when that is set, as its `_resolve_paths_metadata` does."""
    if dataset.get("mix") is not None:  # its files from the data_paths.txt OLMo-core saved, in dataset order
        return mix_paths(dataset, where), None
    raw = dataset.get("paths")
    if not isinstance(raw, list) or not raw:
        raise DataError(f"{where}: dataset.paths is missing or empty (and no source_mixture_config)")
    raw = _strings(raw, "dataset.paths", where)
    raw_masks = dataset.get("label_mask_paths")
    if raw_masks is not None:
        raw_masks = _strings(raw_masks, "dataset.label_mask_paths", where)
    if dataset.get("expand_glob"):
        paths = _expand(raw, where, "dataset.paths")
        masks = _expand(raw_masks, where, "dataset.label_mask_paths") if raw_masks else None
    else:
        paths = list(raw)
        masks = list(raw_masks) if raw_masks else None
    if masks is not None and len(masks) != len(paths):
        raise DataError(
            f"{where}: dataset.label_mask_paths has {len(masks)} files for {len(paths)} token files; one per file"
        )
    perm_seed = dataset.get("source_permutation_seed")
    if perm_seed is not None:
        perm_seed = _int(dataset, "source_permutation_seed", "dataset", where)
        order = list(range(len(paths)))
        random.Random(perm_seed).shuffle(order)
        paths = [paths[i] for i in order]
        masks = [masks[i] for i in order] if masks is not None else None
    return tuple(paths), tuple(masks) if masks is not None else None


def _mixture(section: Any, where: str) -> Mixture | None:
    if section is None:
        return None
    what = "dataset.source_mixture_config"
    if not isinstance(section, dict) or str(section.get(CLASS_KEY, "")).rsplit(".", 1)[-1] != MIXTURE:
        raise DataError(f"{where}: {what} is not OLMo-core's {MIXTURE}")
    source_list = section.get("source_list")
    listed = source_list.get("sources") if isinstance(source_list, dict) else None
    if not isinstance(listed, list) or not listed:
        raise DataError(f"{where}: {what}.source_list.sources is {shown(listed)}; expected a list of sources")
    sources = []
    for i, s in enumerate(listed):
        at = f"{what}.source_list.sources[{i}]"
        if not isinstance(s, dict) or not s.get("paths"):
            raise DataError(f"{where}: {at} has no paths")
        name = s.get("source_name", i)
        if not isinstance(name, (str, int)) or isinstance(name, bool):
            raise DataError(f"{where}: {at}.source_name is {shown(name)}; expected a name")
        sources.append(
            MixtureSource(
                name=str(name),
                target_ratio=_number(s, "target_ratio", at, where, None, 0.0, 1.0),
                paths=tuple(_expand(_strings(s["paths"], f"{at}.paths", where), where, f"{at}.paths")),
                max_repetition_ratio=_number(s, "max_repetition_ratio", at, where, 1.0, 0.0, MAX_REPETITION_RATIO),
                max_source_fraction=_number(s, "max_source_fraction", at, where, 1.0, 0.0, 1.0),
            )
        )
    total = sum(s.target_ratio for s in sources)
    if not np.isclose(total, 1.0):
        raise DataError(f"{where}: the mixture's target_ratio values sum to {total}, not 1 (OLMo-core refuses it)")
    return Mixture(
        sources=tuple(sources),
        requested_tokens=_int(section, "requested_tokens", what, where, lo=1),
        global_batch_size=_int(section, "global_batch_size", what, where, lo=1, hi=MAX_BATCH_TOKENS),
        seed=_whole(section.get("seed", 42), f"{what}.seed", where),
    )


def _instance_filter(section: Any, where: str) -> RepetitionFilter | None:
    """OLMo-core's `InstanceFilterConfig` (present means on; its defaults are OLMo's 13, 1, 32)."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise DataError(f"{where}: dataset.instance_filter_config is {shown(section)}; expected its settings")
    what = "dataset.instance_filter_config"
    values = {
        k: section.get(k, d)
        for k, d in (("repetition_max_period", 13), ("repetition_min_period", 1), ("repetition_max_count", 32))
    }
    for k in values:
        _int(values, k, what, where, lo=1, hi=MAX_SEQUENCE_LENGTH)
    if values["repetition_min_period"] > values["repetition_max_period"]:
        raise DataError(
            f"{where}: {what}.repetition_min_period {values['repetition_min_period']} is more than its "
            f"repetition_max_period {values['repetition_max_period']}"
        )
    return RepetitionFilter(
        max_period=values["repetition_max_period"],
        min_period=values["repetition_min_period"],
        max_count=values["repetition_max_count"],
    )


def _batch_schedule(trainer: dict[str, Any], seq_len: int, where: str) -> tuple[BatchSizeChange, ...]:
    """The trainer's enabled BatchSizeSchedulerCallback, checked as OLMo-core checks it; refused callbacks named."""
    callbacks = trainer.get("callbacks")
    if callbacks is None:
        callbacks = {}
    if not isinstance(callbacks, dict):
        raise DataError(
            f"{where}: trainer.callbacks is {shown(callbacks)}; expected OLMo-core's mapping of callback names to "
            "callbacks"
        )
    found: tuple[BatchSizeChange, ...] = ()
    for name, cb in callbacks.items():
        if not isinstance(cb, dict):
            continue
        at = f"trainer.callbacks.{name}"
        cls = str(cb.get(CLASS_KEY, "")).rsplit(".", 1)[-1]
        enabled = cb.get("enabled", True)
        if not isinstance(enabled, bool):
            raise DataError(f"{where}: {at}.enabled is {shown(enabled)}; expected true or false")
        if cls in REFUSED_CALLBACKS and enabled:
            raise DataError(f"{where}: {at} is OLMo-core's {cls} ({REFUSED_CALLBACKS[cls]}); not covered")
        if cls != BATCH_SIZE_SCHEDULER or not enabled or not cb.get("schedule"):
            continue
        if found:
            raise DataError(f"{where}: trainer.callbacks has two {BATCH_SIZE_SCHEDULER}s; OLMo-core's run is ambiguous")
        found = _schedule(cb, at, seq_len, where)
    return found


def _schedule(cb: dict[str, Any], at: str, seq_len: int, where: str) -> tuple[BatchSizeChange, ...]:
    """A BatchSizeSchedulerCallback's batch sizes (tokens) and the Durations they start at, checked by key."""
    sizes, schedule = cb.get("batch_sizes"), cb.get("schedule")
    if not isinstance(sizes, list) or not isinstance(schedule, list) or len(sizes) != len(schedule):
        raise DataError(f"{where}: {at}: batch_sizes and schedule must be lists of one length")
    changes = []
    for i, (b, d) in enumerate(zip(sizes, schedule, strict=True)):
        tokens = _whole(b, f"{at}.batch_sizes[{i}]", where, lo=1, hi=MAX_BATCH_TOKENS)
        if not isinstance(d, dict):
            raise DataError(f"{where}: {at}.schedule[{i}] is {shown(d)}; expected a Duration ({{value, unit}})")
        unit = d.get("unit")
        if unit not in ("steps", "tokens", "epochs"):
            raise DataError(f"{where}: {at}.schedule[{i}].unit is {shown(unit)}; expected steps, tokens or epochs")
        hi = MAX_EPOCHS if unit == "epochs" else MAX_INT
        changes.append(BatchSizeChange(tokens, _int(d, "value", f"{at}.schedule[{i}]", where, hi=hi), unit))
    if len({c.unit for c in changes}) > 1 or changes[0].start != 0:
        raise DataError(f"{where}: {at}: a schedule starts at 0, in one unit")
    for a, b in zip(changes, changes[1:], strict=False):
        big, small = max(a.tokens, b.tokens), min(a.tokens, b.tokens)
        if b.start <= a.start or big % small or big == small:
            raise DataError(f"{where}: {at}: batch sizes change by whole factors at increasing points")
    for c in changes:
        if c.tokens % seq_len:
            raise DataError(
                f"{where}: {at}: batch size {c.tokens} tokens is not a multiple of dataset.sequence_length {seq_len}"
            )
    return tuple(changes)


def local_path(path: str) -> bool:
    """Whether OLMo-core would treat `path` as a local file (it finds documents in local arrays by their EOS)."""
    return re.match(r"[a-z0-9]+://", path) is None


def composable_form(config: dict[str, Any]) -> bool:
    """Whether a config.json's run is on OLMo-core's composable API (a dataset list, a ComposableDataLoaderConfig)."""
    loader = config.get("data_loader")
    name = str(loader.get(CLASS_KEY, "")) if isinstance(loader, dict) else ""
    return isinstance(config.get("dataset"), list) or name.rsplit(".", 1)[-1] == "ComposableDataLoaderConfig"


def _composable(config: dict[str, Any], where: str, work_dir: str | None) -> OlmoCoreRun:
    """A composable run: its sources and loader read by `olmo_data.olmo_core.composable.spec` (imported here: the
    rest of that package stands above this module), the trainer's keys as for the other runs."""
    from olmo_data.olmo_core.composable.spec import read_composable

    spec = read_composable(config, where, work_dir)
    trainer = config.get("trainer") or {}
    if not isinstance(trainer, dict):
        raise DataError(f"{where}: trainer is {shown(trainer)}; expected OLMo-core's TrainerConfig (a JSON object)")
    return OlmoCoreRun(
        **spec.run_fields(),
        batch_sizes=_batch_schedule(trainer, spec.sequence_length, where),
        instance_filter=_instance_filter(config["data_loader"].get("instance_filter_config"), where),
        source=where,
        max_duration=_duration(trainer.get("max_duration"), where),
        hard_stop=_duration(trainer.get("hard_stop"), where, "trainer.hard_stop"),
        composable=spec,
    )
