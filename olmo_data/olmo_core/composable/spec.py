"""How an OLMo-core run on the composable data API is described in its config.json, read and checked.

OLMo-core's experiment scripts give such a run a `dataset` that is a *list* of instance-source configs and a
`data_loader` that is a `ComposableDataLoaderConfig`. Each config is a JSON object naming its class under
`_CLASS_`; its sources nest under `sources`, `source` or `source_specs` down to `NumpyDocumentSourceConfig`s
(token files). `as_config_dict` leaves out every key whose value was None: an absent `seed` of a sampling, mixing
or split source means no shuffling (its default is a drawn or 0 seed, written out when it was used), an absent
`max_sequence_length` means the sequence length. Everything that decides the batches is in those keys and the
token files, so the run is rebuilt from them alone.

This module reads that tree into `Node`s, checks every value by key (one line naming the key, as
`dataset[0].sources[1].ratio`) and refuses by class name what the package does not rebuild. It imports nothing
of `olmo_data.olmo_core` (its `config` module calls it); the sources are built from the nodes by `build`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from olmo_data.errors import DataError, shown
from olmo_data.io import expand_patterns

CLASS_KEY = "_CLASS_"
LOADER = "ComposableDataLoaderConfig"
STRATEGIES = ("inter_source", "intra_source", "interleaved_source")  # OLMo-core 3.0.0's ShuffleStrategy
LONG_DOC = ("truncate", "fragment")
MAX_SEQUENCE_LENGTH = 1 << 24
MAX_BATCH_TOKENS = 1 << 30
MAX_INT = (1 << 63) - 1
SEED_MAX = (1 << 63) - 1  # numpy's PCG64 takes a non-negative seed
DTYPES = ("uint8", "uint16", "uint32", "uint64")
# the kinds of child a key holds: one source or a list of them, of tokens, documents or instances
TOKEN_CLASSES = {
    "ConcatenatedTokenSourceConfig",
    "SplitTokenSourceConfig",
    "SamplingTokenSourceConfig",
    "MixingTokenSourceConfig",
}
DOCUMENT_CLASSES = {
    "NumpyDocumentSourceConfig",
    "ConcatenatedDocumentSourceConfig",
    "SamplingDocumentSourceConfig",
    "MixingDocumentSourceConfig",
}
INSTANCE_CLASSES = {
    "ConcatAndChunkInstanceSourceConfig",
    "ConcatenatedInstanceSourceConfig",
    "SplitInstanceSourceConfig",
    "SamplingInstanceSourceConfig",
    "MixingInstanceSourceConfig",
    "PackingInstanceSourceConfig",
    "RandomInstanceSourceConfig",
}
SPEC_CLASSES = {"token": "MixingTokenSourceSpecConfig", "document": "MixingDocumentSourceSpecConfig"}
SPEC_CLASSES["instance"] = "MixingInstanceSourceSpecConfig"
LISTS = {"tokens", "documents", "instances", "token_specs", "document_specs", "instance_specs"}
REFUSED = {
    "NumpyDocumentSourceMixConfig": "a named data mix (its paths are resolved by OLMo-core's mix tables)",
}
# per class, its keys: kind (how the value is checked) and default (the dataclass's, used when the key is absent)
_REQUIRED = object()
_SAMPLE = {
    "max_tokens": ("pos?", None),
    "factor": ("positive?", None),
    "seed": ("seed?", None),
    "label": ("str?", None),
}
_MIX = {"seed": ("seed?", None), "label": ("str?", None), "num_tokens": ("pos?", None)}
SCHEMA: dict[str, dict[str, tuple[str, Any]]] = {
    "NumpyDocumentSourceConfig": {
        "tokenizer": ("tokenizer", _REQUIRED),
        "dtype": ("dtype?", None),
        "source_permutation_seed": ("int?", None),
        "source_group_size": ("group", 1),
        "label": ("str?", None),
        "max_document_length": ("pos?", None),
        "long_doc_strategy": ("long_doc", "truncate"),
        "source_paths": ("paths", _REQUIRED),
        "label_mask_paths": ("paths?", None),
        "expand_glob": ("bool?", None),
    },
    "ConcatenatedTokenSourceConfig": {"sources": ("tokens", _REQUIRED), "label": ("str?", None)},
    "ConcatenatedDocumentSourceConfig": {"sources": ("documents", _REQUIRED), "label": ("str?", None)},
    "SplitTokenSourceConfig": {
        "source": ("token", _REQUIRED),
        "ratio": ("ratio", _REQUIRED),
        "idx": ("idx", _REQUIRED),
    },
    "SamplingTokenSourceConfig": {"sources": ("tokens", _REQUIRED), **_SAMPLE},
    "SamplingDocumentSourceConfig": {"sources": ("documents", _REQUIRED), **_SAMPLE},
    "MixingTokenSourceConfig": {"source_specs": ("token_specs", _REQUIRED), **_MIX},
    "MixingDocumentSourceConfig": {"source_specs": ("document_specs", _REQUIRED), **_MIX},
    "ConcatAndChunkInstanceSourceConfig": {
        "sources": ("tokens", _REQUIRED),
        "sequence_length": ("seq_len", _REQUIRED),
        "max_sequence_length": ("seq_len?", None),
        "label": ("str?", None),
    },
    "ConcatenatedInstanceSourceConfig": {"sources": ("instances", _REQUIRED)},
    "SplitInstanceSourceConfig": {
        "source": ("instance", _REQUIRED),
        "ratio": ("ratio", _REQUIRED),
        "idx": ("idx", _REQUIRED),
        "seed": ("seed?", None),
    },
    "SamplingInstanceSourceConfig": {"sources": ("instances", _REQUIRED), "max_instances": ("pos?", None), **_SAMPLE},
    "MixingInstanceSourceConfig": {
        "source_specs": ("instance_specs", _REQUIRED),
        "num_instances": ("pos?", None),
        **_MIX,
    },
    "PackingInstanceSourceConfig": {
        "sources": ("documents", _REQUIRED),
        "sequence_length": ("seq_len", _REQUIRED),
        "tokenizer": ("tokenizer", _REQUIRED),
        "max_sequence_length": ("seq_len?", None),
        "long_doc_strategy": ("long_doc", "truncate"),
        "source_group_size": ("pos", 1),
        "label": ("str?", None),
    },
    "RandomInstanceSourceConfig": {
        "tokenizer": ("tokenizer", _REQUIRED),
        "sequence_length": ("seq_len", _REQUIRED),
        "avg_document_length": ("pos", _REQUIRED),
        "seed": ("seed", _REQUIRED),
        "num_instances": ("pos?", None),
        "num_tokens": ("pos?", None),
        "max_sequence_length": ("seq_len?", None),
        "label": ("str?", None),
    },
}
for _kind, _name in SPEC_CLASSES.items():
    SCHEMA[_name] = {
        "source": (_kind, _REQUIRED),
        "ratio": ("positive", _REQUIRED),
        "max_repetition_factor": ("repetition", 1.0),
        "label": ("str?", None),
    }
LOADER_KEYS = {
    "tokenizer", "global_batch_size", "seed", "work_dir", "shuffle", "shuffle_strategy", "sources_per_epoch",
    "num_threads", "num_workers", "prefetch_factor", "target_device_type", "generate_doc_lengths",
    "instance_filter_config", "display_source_visualization", "type", CLASS_KEY,
}  # fmt: skip


@dataclass(frozen=True)
class Tokenizer:
    """A TokenizerConfig's ids (OLMo-core's sources and loader each carry their own)."""

    vocab_size: int
    eos_token_id: int
    pad_token_id: int
    bos_token_id: int | None


@dataclass(frozen=True)
class Node:
    """One source config of the run: its OLMo-core class, its place in config.json, its checked values (child
    sources as Nodes, lists of them as tuples) with absent keys at their dataclass defaults."""

    cls: str
    at: str
    values: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


@dataclass(frozen=True)
class ComposableSpec:
    """The dataset list and the loader's settings of a composable run (see the module)."""

    sources: tuple[Node, ...]
    shuffle: bool
    strategy: str | None  # None without shuffling; OLMo-core's default inter_source filled in
    sources_per_epoch: int  # -1: all the sources every epoch
    sequence_length: int
    max_sequence_length: int
    tokenizer: Tokenizer  # the loader's: its pad id collates, its EOS/BOS ids give doc_lens
    global_batch_size: int  # tokens
    seed: int
    work_dir: str  # the loader's: its orders, and the sources' caches below it
    generate_doc_lengths: bool
    source: str = ""  # the config file, for messages

    def describe(self) -> dict[str, Any]:
        """The sources and the loader's order settings as plain JSON values (for the run's data fingerprint)."""

        def plain(value: Any) -> Any:
            if isinstance(value, Node):
                return {"class": value.cls, **{k: plain(v) for k, v in sorted(value.values.items())}}
            if isinstance(value, tuple):
                return [plain(v) for v in value]
            if isinstance(value, Tokenizer):
                return [value.vocab_size, value.eos_token_id, value.pad_token_id, value.bos_token_id]
            return value

        return {
            "sources": plain(self.sources),
            "shuffle": [self.shuffle, self.strategy, self.sources_per_epoch],
            "lengths": [self.sequence_length, self.max_sequence_length],
        }

    def run_fields(self) -> dict[str, Any]:
        """The keys of `olmo_data.olmo_core.config.OlmoCoreRun` a composable run decides (its `composable` spec
        aside): the loader tokenizer's ids, the loader's batch size, seed and work_dir."""
        tok, L, M = self.tokenizer, self.sequence_length, self.max_sequence_length
        dtype = next(name for name in DTYPES if tok.vocab_size - 1 <= np.iinfo(np.dtype(name)).max)
        return {
            "kind": "composable",
            "paths": (),  # the token files are the sources' (olmo_data.olmo_core.composable.build)
            "label_mask_paths": None,
            "sequence_length": L,
            "max_target_sequence_length": M if M != L else None,
            "dtype": dtype,
            "dtype_from": "each NumpyDocumentSourceConfig's dtype (or its tokenizer's vocab_size)",
            "pad_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id,
            "bos_token_id": tok.bos_token_id,
            "vocab_size": tok.vocab_size,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "work_dir": self.work_dir,
            "dataset_work_dir": self.work_dir,
            "generate_doc_lengths": self.generate_doc_lengths,
        }


def is_composable(config: dict[str, Any]) -> bool:
    """Whether a config.json's run uses OLMo-core's composable API (a dataset list or a ComposableDataLoaderConfig)."""
    loader = config.get("data_loader")
    name = str(loader.get(CLASS_KEY, "")) if isinstance(loader, dict) else ""
    return isinstance(config.get("dataset"), list) or name.rsplit(".", 1)[-1] == LOADER


def read_composable(config: dict[str, Any], where: str, work_dir: str | None = None) -> ComposableSpec:
    """The composable run of a config.json (`is_composable`), every source checked, the uncovered refused;
    `work_dir` replaces the loader's (where its order files are, for a run inspected elsewhere)."""
    loader = config.get("data_loader")
    if not isinstance(loader, dict) or str(loader.get(CLASS_KEY, "")).rsplit(".", 1)[-1] != LOADER:
        raise DataError(
            f"{where}: dataset is a list of instance sources, but data_loader is "
            f"{shown(loader.get(CLASS_KEY) if isinstance(loader, dict) else loader)}; OLMo-core reads that list "
            f"with its {LOADER} only"
        )
    listed = config.get("dataset")
    if not isinstance(listed, list) or not listed:
        raise DataError(
            f"{where}: dataset is {shown(listed)}; with OLMo-core's {LOADER} it is a non-empty list of instance "
            "source configs"
        )
    unknown = sorted(set(loader) - LOADER_KEYS)
    if unknown:
        raise DataError(f"{where}: data_loader.{unknown[0]} is not a key of OLMo-core 3.0.0's {LOADER}; not covered")
    sources = tuple(_node(s, f"dataset[{i}]", "instance", where) for i, s in enumerate(listed))
    lengths = {_lengths(s, where) for s in sources}
    if len(lengths) > 1:
        raise DataError(
            f"{where}: the dataset's instance sources have different sequence_length / max_sequence_length "
            f"{sorted(lengths)}; OLMo-core's loader refuses that"
        )
    L, M = lengths.pop()
    tokenizer = loader.get("tokenizer")
    if tokenizer is None:
        raise DataError(f"{where}: data_loader.tokenizer is missing; OLMo-core's {LOADER} needs one")
    shuffle = _check("bool", loader.get("shuffle", True), "data_loader.shuffle", where)
    strategy = loader.get("shuffle_strategy")
    if strategy is not None and strategy not in STRATEGIES:
        raise DataError(f"{where}: data_loader.shuffle_strategy is {shown(strategy)}; expected one of {STRATEGIES}")
    if not shuffle and strategy is not None:
        raise DataError(f"{where}: data_loader.shuffle_strategy is set with shuffle false; OLMo-core refuses that")
    per_epoch = _check("int?", loader.get("sources_per_epoch", -1), "data_loader.sources_per_epoch", where)
    if per_epoch == 0 or per_epoch < -1 or (per_epoch > 0 and len(sources) % per_epoch):
        raise DataError(
            f"{where}: data_loader.sources_per_epoch is {per_epoch}; expected -1 or a number of sources dividing "
            f"the dataset's {len(sources)}"
        )
    gbs = _check("pos", loader.get("global_batch_size"), "data_loader.global_batch_size", where)
    if gbs > MAX_BATCH_TOKENS or gbs % L:
        raise DataError(
            f"{where}: data_loader.global_batch_size is {gbs} tokens; expected a multiple of the sources' "
            f"sequence_length {L}, at most {MAX_BATCH_TOKENS:,}"
        )
    work_dir = work_dir or loader.get("work_dir")
    if not isinstance(work_dir, str) or not work_dir:
        raise DataError(f"{where}: data_loader.work_dir is {shown(work_dir)}; OLMo-core's {LOADER} needs one")
    return ComposableSpec(
        global_batch_size=gbs,
        seed=_check("seed", loader.get("seed"), "data_loader.seed", where),
        work_dir=work_dir.rstrip("/").replace("file://", ""),
        generate_doc_lengths=_check(
            "bool", loader.get("generate_doc_lengths", False), "data_loader.generate_doc_lengths", where
        ),
        sources=sources,
        shuffle=shuffle,
        strategy=(strategy or "inter_source") if shuffle else None,
        sources_per_epoch=per_epoch,
        sequence_length=L,
        max_sequence_length=M,
        tokenizer=_check("tokenizer", tokenizer, "data_loader.tokenizer", where),
        source=where,
    )


def _node(raw: Any, at: str, kind: str, where: str) -> Node:
    """A source config (`kind`: token, document, instance, or a mixing spec's `*_spec`), checked key by key."""
    if not isinstance(raw, dict) or not isinstance(raw.get(CLASS_KEY), str):
        raise DataError(f"{where}: {at} is {shown(raw)}; expected an OLMo-core source config naming its {CLASS_KEY}")
    full = raw[CLASS_KEY]
    cls = full.rsplit(".", 1)[-1]
    if cls in REFUSED:
        raise DataError(f"{where}: {at} is OLMo-core's {cls} ({REFUSED[cls]}); not covered")
    allowed = {
        "token": TOKEN_CLASSES | DOCUMENT_CLASSES,
        "document": DOCUMENT_CLASSES,
        "instance": INSTANCE_CLASSES,
    }.get(kind, {SPEC_CLASSES.get(kind.removesuffix("_spec"), "")})
    if not full.startswith("olmo_core.") or cls not in SCHEMA:
        raise DataError(f"{where}: {at} is {full}; not covered: not one of OLMo-core 3.0.0's composable sources")
    if cls not in allowed:
        raise DataError(f"{where}: {at} is OLMo-core's {cls}, where a {kind.replace('_', ' ')} source belongs")
    schema = SCHEMA[cls]
    unknown = sorted(set(raw) - set(schema) - {CLASS_KEY})
    if unknown:
        raise DataError(f"{where}: {at}.{unknown[0]} is not a key of OLMo-core 3.0.0's {cls}; not covered")
    values: dict[str, Any] = {}
    for key, (check, default) in schema.items():
        if key not in raw:
            if default is _REQUIRED:
                raise DataError(f"{where}: {at}.{key} is missing; OLMo-core's {cls} needs it")
            values[key] = default
            continue
        value, what = raw[key], f"{at}.{key}"
        if check in LISTS:  # a list of sources (tokens, documents, instances) or of mixing specs
            child = check[:-1]
            if not isinstance(value, list) or not value:
                raise DataError(f"{where}: {what} is {shown(value)}; expected a non-empty list of source configs")
            values[key] = tuple(_node(v, f"{what}[{i}]", child, where) for i, v in enumerate(value))
        elif check in ("token", "document", "instance"):
            values[key] = _node(value, what, check, where)
        else:
            values[key] = _check(check, value, what, where)
    node = Node(cls, at, values)
    _check_node(node, where)
    return node


def _check_node(node: Node, where: str) -> None:
    """What OLMo-core's config classes check in `__post_init__` or when they build (it would have raised)."""
    cls, at = node.cls, node.at
    if cls.startswith("Sampling"):
        given = [k for k in ("max_tokens", "max_instances", "factor") if node.values.get(k) is not None]
        if len(given) != 1:
            raise DataError(f"{where}: {at} gives {given or 'none'} of max_tokens / max_instances / factor; one")
    if cls == "RandomInstanceSourceConfig" and (node["num_tokens"] is None) == (node["num_instances"] is None):
        raise DataError(f"{where}: {at} gives both or neither of num_tokens / num_instances; OLMo-core needs one")
    if cls == "MixingInstanceSourceConfig" and None not in (node["num_tokens"], node["num_instances"]):
        if node["num_tokens"] != node["num_instances"] * _lengths(node, where)[0]:
            raise DataError(f"{where}: {at} gives num_tokens and num_instances that disagree; OLMo-core refuses it")
    if cls == "NumpyDocumentSourceConfig":
        masks = node["label_mask_paths"]
        if masks is not None and len(masks) != len(node["source_paths"]):
            raise DataError(f"{where}: {at}.label_mask_paths has {len(masks)} files for {len(node['source_paths'])}")


def _lengths(node: Node, where: str) -> tuple[int, int]:
    """(sequence_length, max_sequence_length) of an instance source, as OLMo-core derives and checks them."""
    if node.cls in ("ConcatAndChunkInstanceSourceConfig", "PackingInstanceSourceConfig", "RandomInstanceSourceConfig"):
        L = node["sequence_length"]
        M = node["max_sequence_length"] or L
        if M < L or M % L:
            raise DataError(
                f"{where}: {node.at}.max_sequence_length ({M}) must be a multiple of its sequence_length ({L})"
            )
        if node.cls == "PackingInstanceSourceConfig" and (M != L or L & (L - 1)):
            raise DataError(
                f"{where}: {node.at}: OLMo-core's packing needs max_sequence_length = sequence_length, a power of "
                f"two (its packer's segment tree); got {L} and {M}"
            )
        return L, M
    children = [node["source"]] if "source" in node.values else list(node.values.get("sources") or ())
    children += [spec["source"] for spec in node.values.get("source_specs") or ()]
    found = {_lengths(c, where) for c in children}
    if len(found) > 1:
        raise DataError(
            f"{where}: {node.at}'s sources have different sequence lengths {sorted(found)}; OLMo-core refuses"
        )
    return found.pop()


def _check(check: str, value: Any, what: str, where: str) -> Any:
    """One value by its kind, or one line naming the key and what was expected."""
    optional = check.endswith("?")
    kind = check.rstrip("?")
    if optional and value is None:
        return None
    whole = {"int": (-MAX_INT, MAX_INT), "pos": (1, MAX_INT), "seed": (0, SEED_MAX), "idx": (0, 1)}
    whole |= {"seq_len": (1, MAX_SEQUENCE_LENGTH), "group": (-1, MAX_INT)}
    if kind in whole:
        lo, hi = whole[kind]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise DataError(f"{where}: {what} is {shown(value)}; expected a whole number from {lo:,} to {hi:,}")
        if kind == "group" and value == 0:
            raise DataError(f"{where}: {what} is 0; expected -1 or a positive number of files")
        return value
    if kind in ("ratio", "positive", "repetition"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
        lo_ok = {"ratio": lambda v: 0 < v < 1, "positive": lambda v: v > 0, "repetition": lambda v: v >= 1}[kind]
        if not ok or not lo_ok(value):
            expected = {"ratio": "between 0 and 1", "positive": "above 0", "repetition": "of at least 1"}[kind]
            raise DataError(f"{where}: {what} is {shown(value)}; expected a number {expected}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise DataError(f"{where}: {what} is {shown(value)}; expected true or false")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise DataError(f"{where}: {what} is {shown(value)}; expected a string")
        return value
    if kind == "paths":
        if not isinstance(value, list) or not value or not all(isinstance(p, str) and p for p in value):
            raise DataError(f"{where}: {what} is {shown(value)}; expected a non-empty list of paths")
        return tuple(value)
    if kind == "dtype":
        if value not in DTYPES:
            raise DataError(f"{where}: {what} is {shown(value)}; expected one of {list(DTYPES)}")
        return value
    if kind == "long_doc":
        if value not in LONG_DOC:
            raise DataError(f"{where}: {what} is {shown(value)}; expected one of {list(LONG_DOC)}")
        return value
    if kind == "tokenizer":
        if not isinstance(value, dict):
            raise DataError(f"{where}: {what} is {shown(value)}; expected OLMo-core's TokenizerConfig")
        bos = value.get("bos_token_id")
        return Tokenizer(
            vocab_size=_check("pos", value.get("vocab_size"), f"{what}.vocab_size", where),
            eos_token_id=_check("seed", value.get("eos_token_id"), f"{what}.eos_token_id", where),
            pad_token_id=_check("seed", value.get("pad_token_id"), f"{what}.pad_token_id", where),
            bos_token_id=None if bos is None else _check("seed", bos, f"{what}.bos_token_id", where),
        )
    raise AssertionError(check)


def dtype_of(node: Node) -> str:
    """A NumpyDocumentSourceConfig's token dtype: its own, else the smallest that holds its vocab_size - 1."""
    if node["dtype"] is not None:
        return str(node["dtype"])
    vocab = node["tokenizer"].vocab_size
    for name in DTYPES:
        if vocab - 1 <= np.iinfo(np.dtype(name)).max:
            return name
    raise DataError(f"{node.at}.tokenizer.vocab_size {vocab} is too large for any token dtype")


def numpy_paths(node: Node, where: str) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """A NumpyDocumentSourceConfig's token files and label masks as its `build` lists them: globs expanded when
    `expand_glob` is true (or, unset, when a path has a `*`), then `source_permutation_seed`'s shuffle, which
    OLMo-core 3.0.0 draws over the configured entries (a glob counts once: the expanded files past that count
    are left out, as they are by OLMo-core); paths normalised as OLMo-core's `normalize_path` does."""
    paths, masks = list(node["source_paths"]), node["label_mask_paths"]
    masks = list(masks) if masks is not None else None
    expand = node["expand_glob"]
    if expand is None:
        expand = any("*" in p for p in paths)
    if expand:
        paths = _expand(paths, f"{node.at}.source_paths", where)
        masks = _expand(masks, f"{node.at}.label_mask_paths", where) if masks is not None else None
    seed = node["source_permutation_seed"]
    if seed is not None:
        order = list(range(len(node["source_paths"])))
        random.Random(seed).shuffle(order)
        paths = [paths[i] for i in order]
        masks = [masks[i] for i in order] if masks is not None else None
    if masks is not None and len(masks) != len(paths):
        raise DataError(f"{where}: {node.at}.label_mask_paths lists {len(masks)} files for {len(paths)} token files")
    norm = [p.rstrip("/").replace("file://", "") for p in paths]
    return tuple(norm), tuple(m.rstrip("/").replace("file://", "") for m in masks) if masks is not None else None


def _expand(patterns: list[str], what: str, where: str) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        if "*" not in pattern:
            out.append(pattern)
            continue
        try:
            matches = sorted(expand_patterns([pattern]))
        except DataError as e:
            raise DataError(f"{where}: {what} pattern {pattern!r} matches no files ({e})") from e
        out.extend(matches)
    return out
