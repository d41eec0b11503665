"""Reconstruct any training batch: its instances, their tokens, and the documents they came from.

`inspect_batch(config, step=N)` answers "what did the model see at step N?" from the training config alone:
the data section and sequence length give the instance index, the seed and global batch size give the order
and the batch's slice of it, and the tokenize metadata (`part-*.csv.gz`, rows `start,end,id,src,loc`) gives
the documents each instance overlaps. The batch fingerprint is the one the trainer logs each step, so the two
can be compared.

Document lookups use a side index built once per token file (`DocIndex`): sorted document starts and ends as
`.npy` arrays plus the ids and sources, in a cache directory. A lookup is two binary searches on memory maps,
so inspecting a batch never scans a CSV, whatever the dataset size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data.errors import DataError
from olmo_data.fingerprint import batch_fingerprint
from olmo_data.instances import InstanceSource, open_from_config
from olmo_data.io import default_cache_dir, is_remote, local_copy, open_file, read_yaml
from olmo_data.manifest import read_manifest
from olmo_data.order import (
    BatchPosition,
    batch_position,
    default_order_location,
    order_path_for_epoch,
    rank_positions,
    read_order_range,
    step_position,
)
from olmo_data.remote import remote_reader

DOCINDEX_VERSION = 2
INDEX_JSON = "index.json"


def read_train_config(path: str) -> dict[str, Any]:
    """The keys of a training config that the data side needs, checked, with the trainer's defaults.

    Only PyYAML is used (not the trainer's config module) so that inspecting data never needs the trainer.
    """
    raw = read_yaml(path, "config file")
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a mapping of config keys at the top level")
    # the trainer's defaults (olmo_train/config.py) for keys a config leaves out
    raw.setdefault("seed", 6198)
    raw.setdefault("save_folder", "runs/olmo-run")
    raw.setdefault("global_train_batch_size", 512)
    for section in ("model", "data"):
        raw[section] = raw.get(section) or {}
        if not isinstance(raw[section], dict):
            raise DataError(f"{path}: {section} must be a mapping of keys, got {raw[section]!r}")
    raw["model"].setdefault("max_sequence_length", 1024)
    for key in ("seed", "global_train_batch_size"):
        if not isinstance(raw[key], int) or isinstance(raw[key], bool):
            raise DataError(f"{path}: {key} must be an integer, got {raw[key]!r}")
    length = raw["model"]["max_sequence_length"]
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        raise DataError(f"{path}: model.max_sequence_length must be a positive integer, got {length!r}")
    if not isinstance(raw["save_folder"], str):
        raise DataError(f"{path}: save_folder must be a string (a directory), got {raw['save_folder']!r}")
    data = raw["data"]
    for key in ("paths", "label_mask_paths"):
        value = data.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(p, str) for p in value)):
            raise DataError(
                f"{path}: data.{key} must be a list of paths (strings), got {value!r}; "
                f"write it as a YAML list, e.g. {key}: [runs/demo/tokens]"
            )
    for key in ("mix", "order_path"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise DataError(f"{path}: data.{key} must be a path (a string), got {data[key]!r}")
    if data.get("dtype") is not None and data["dtype"] not in ("uint16", "uint32"):
        raise DataError(f"{path}: data.dtype must be uint16 or uint32, got {data['dtype']!r}")
    return raw


def order_location(config: dict[str, Any]) -> str:
    """`data.order_path` if the config sets one, else `save_folder/train_data`, where the trainer puts it."""
    explicit = (config.get("data") or {}).get("order_path")
    return str(explicit) if explicit else default_order_location(str(config["save_folder"]))


# -- the document side index ---------------------------------------------------------------------------------


def metadata_path_for(token_path: str) -> str | None:
    """The `.csv.gz` beside a token file: the manifest's `metadata` entry, else dolma's naming (same stem)."""
    directory, _, name = token_path.rpartition("/")
    with contextlib.suppress(DataError):
        manifest = read_manifest(directory or ".")
        if manifest:
            for entry in manifest.get("files", []):
                if entry.get("path") == name and entry.get("metadata"):
                    return f"{directory}/{entry['metadata']}"
    candidate = token_path[: -len(".npy")] + ".csv.gz" if token_path.endswith(".npy") else None
    if candidate is None or (not is_remote(candidate) and not os.path.exists(candidate)):
        return None
    return candidate


@dataclass(frozen=True)
class DocumentSpan:
    """A document an instance overlaps: its identity, its token span in the file, and the overlap."""

    id: str
    src: str
    loc: int  # 1-based line of the document in `src`
    start: int  # document's token span in the token file [start, end)
    end: int
    instance_start: int  # the overlap, as positions within the instance [instance_start, instance_end)
    instance_end: int
    document_start: int  # which token of the document the overlap starts at (0: the instance holds its start)


class _FileIndex:
    """One token file's document index: `spans.npy`, an int64 (documents, 5) Fortran-order array whose columns
    (start, end, loc, src code, id offset) are each contiguous, so binary searches run on the memory map without
    copies; `ids.bin`, the ids' UTF-8 bytes back to back; `index.json`, the sources (written last: "complete")."""

    def __init__(self, directory: Path) -> None:
        info = json.loads((directory / INDEX_JSON).read_text())
        spans = np.load(directory / "spans.npy", mmap_mode="r").view(np.ndarray)  # plain views index faster
        self.starts, self.ends, self.locs, self.src_codes, self.id_offsets = (spans[:, c] for c in range(5))
        self.ids = np.zeros(0, dtype=np.uint8)
        if info["id_bytes"]:  # (an empty file cannot be memory-mapped)
            self.ids = np.memmap(directory / "ids.bin", dtype=np.uint8, mode="r").view(np.ndarray)
        self.sources: list[str] = info["sources"]

    def doc(self, k: int) -> tuple[str, str, int, int, int]:
        lo = int(self.id_offsets[k])
        hi = int(self.id_offsets[k + 1]) if k + 1 < len(self.id_offsets) else len(self.ids)
        return (
            self.ids[lo:hi].tobytes().decode("utf-8"),
            self.sources[int(self.src_codes[k])],
            int(self.locs[k]),
            int(self.starts[k]),
            int(self.ends[k]),
        )


class DocIndex:
    """Document lookups by token offset, from per-file side indexes built once from the tokenize metadata.

    The index of a metadata file lives in `cache_dir/docindex/<digest>/`, where the digest covers the metadata
    file's location, size and modification time: a rewritten metadata file gets a new index, never a stale
    one. Building is atomic (a temporary directory renamed into place), so concurrent users cannot see half an
    index.
    """

    def __init__(self, cache_dir: str | None = None) -> None:
        self.root = Path(cache_dir or default_cache_dir()) / "docindex"
        self._files: dict[str, _FileIndex | None] = {}
        self._sizes: dict[str, int] = {}  # remote metadata files' sizes (part of their index's key)
        self._lock = threading.Lock()
        self.built = 0  # how many indexes this object had to build (tests check that lookups reuse them)

    def prepare(self, files: Iterable[tuple[str, str | None]]) -> None:
        """Get ready to look up these (token file, metadata) pairs, doing at once what one lookup after another
        would do in turn: ask for the sizes of the remote metadata files (each index's key needs one: a HEAD
        request), and build the indexes not built yet (each a download and a parse). A batch touches up to
        hundreds of files; in turn, each would cost network round trips."""
        with self._lock:
            todo = {m for t, m in files if m and t not in self._files}
            urls = sorted({m for m in todo if is_remote(m)} - set(self._sizes))
        if urls:
            sizes = remote_reader().sizes(urls)
            with self._lock:
                self._sizes.update(zip(urls, sizes, strict=True))
        with self._lock:
            missing = {m: d for m in sorted(todo) if not ((d := self.root / self._key(m)) / INDEX_JSON).exists()}
        if len(missing) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(build_doc_index, missing, missing.values()))
            with self._lock:
                self.built += len(missing)

    def _key(self, metadata: str) -> str:
        if is_remote(metadata):
            if metadata not in self._sizes:
                from olmo_data.io import file_size

                self._sizes[metadata] = file_size(metadata)
            stamp = f"{metadata}|{self._sizes[metadata]}"
        else:
            st = os.stat(metadata)
            stamp = f"{os.path.abspath(metadata)}|{st.st_size}|{st.st_mtime_ns}"
        return hashlib.sha256(f"v{DOCINDEX_VERSION}|{stamp}".encode()).hexdigest()[:24]

    def index_for(self, token_path: str, metadata: str | None = None) -> _FileIndex | None:
        """The side index of a token file, building it on first use; None when the file has no metadata.

        `metadata` is the file's `.csv.gz` when known (`TokenFile.metadata_path`, from the manifest); else it is
        looked up beside the token file.
        """
        with self._lock:
            if token_path in self._files:
                return self._files[token_path]
            metadata = metadata or metadata_path_for(token_path)
            index = None
            if metadata is not None:
                directory = self.root / self._key(metadata)
                if not (directory / INDEX_JSON).exists():
                    build_doc_index(metadata, directory)
                    self.built += 1
                index = _FileIndex(directory)
            self._files[token_path] = index
            return index

    def lookup(self, token_path: str, start: int, end: int, metadata: str | None = None) -> list[DocumentSpan] | None:
        """The documents overlapping tokens [start, end) of a token file, in order; None without metadata."""
        index = self.index_for(token_path, metadata)
        if index is None:
            return None
        first = int(np.searchsorted(index.ends, start, side="right"))  # first document ending after `start`
        last = int(np.searchsorted(index.starts, end, side="left"))  # documents starting before `end`
        out = []
        for k in range(first, last):
            doc_id, src, loc, d_start, d_end = index.doc(k)
            lo = max(d_start, start)
            out.append(
                DocumentSpan(doc_id, src, loc, d_start, d_end, lo - start, min(d_end, end) - start, lo - d_start)
            )
        return out


def build_doc_index(metadata: str, directory: Path) -> None:
    """Index a `.csv.gz` metadata file (rows `start,end,id,src,loc`) into `directory`, atomically."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    names = ["start", "end", "id", "src", "loc"]
    types = {"start": pa.int64(), "end": pa.int64(), "id": pa.string(), "src": pa.string(), "loc": pa.int64()}
    try:  # a remote file is downloaded first, in retried ranged chunks: a reset midway costs one chunk
        with local_copy(metadata, directory.parent) as local, open_file(local, "rb") as f:  # gunzipped by name
            table = pacsv.read_csv(
                f,
                read_options=pacsv.ReadOptions(column_names=names),
                convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False),
            )
    except (pa.ArrowInvalid, ValueError) as e:
        raise DataError(f"{metadata}: not a metadata file of rows start,end,id,src,loc ({e})") from e
    starts = table.column("start").to_numpy().astype(np.int64)
    ends = table.column("end").to_numpy().astype(np.int64)
    if len(starts) and (np.any(np.diff(starts) < 0) or np.any(ends < starts)):
        raise DataError(
            f"{metadata}: document rows are not in token order (start ascending, end >= start); "
            "the file is damaged: re-run tokenize"
        )
    src_dict = table.column("src").combine_chunks().dictionary_encode()
    sources = [str(s) for s in src_dict.dictionary.to_pylist()]
    src_codes = src_dict.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    ids = table.column("id").combine_chunks()
    id_bytes = [s.encode("utf-8") for s in ids.to_pylist()]
    id_offsets = np.zeros(len(id_bytes), dtype=np.int64)
    if len(id_bytes) > 1:
        np.cumsum([len(b) for b in id_bytes[:-1]], out=id_offsets[1:])
    spans = np.empty((len(starts), 5), dtype=np.int64, order="F")
    spans[:, 0], spans[:, 1] = starts, ends
    spans[:, 2] = table.column("loc").to_numpy().astype(np.int64)
    spans[:, 3], spans[:, 4] = src_codes, id_offsets
    blob = b"".join(id_bytes)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{directory.name}.", dir=directory.parent))
    try:
        np.save(tmp / "spans.npy", spans)
        (tmp / "ids.bin").write_bytes(blob)
        info = {"metadata": metadata, "documents": len(starts), "id_bytes": len(blob), "sources": sources}
        (tmp / INDEX_JSON).write_text(json.dumps(info) + "\n")
        try:
            os.replace(tmp, directory)
        except OSError:  # another process built it first: keep theirs
            if not (directory / INDEX_JSON).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- batch reports -------------------------------------------------------------------------------------------


@dataclass
class InstanceReport:
    position: int  # in the global batch
    instance: int  # index in the dataset (what the order holds)
    path: str
    token_offset: int
    token_ids: np.ndarray  # int64 (sequence_length,); lists only in to_json(), as converting costs time
    label_mask: np.ndarray | None = None  # bool, True = a training target
    source: str | None = None  # mixture source
    documents: list[DocumentSpan] | None = None  # None: the token file has no metadata
    text: str | None = None


@dataclass
class BatchReport:
    step: int
    global_batch: int
    epoch: int
    batch_in_epoch: int
    batches_per_epoch: int
    global_batch_size: int
    sequence_length: int
    seed: int
    num_instances: int
    order_path: str
    data_fingerprint: str
    batch_fingerprint: str
    rank: int | None
    world_size: int | None
    instances: list[InstanceReport] = field(default_factory=list)
    run_steps: int | None = None  # steps the config's max_duration trains; a later step was never trained

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (built field by field: `asdict` would deep-copy millions of token ids)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "instances"}
        out["instances"] = [
            {f.name: getattr(i, f.name) for f in fields(i) if f.name not in ("documents", "token_ids", "label_mask")}
            | {
                "token_ids": i.token_ids.tolist(),
                "label_mask": None if i.label_mask is None else i.label_mask.tolist(),
                "documents": None if i.documents is None else [asdict(d) for d in i.documents],
            }
            for i in self.instances
        ]
        return out


def inspect_batch(
    config: str | dict[str, Any],
    *,
    step: int | None = None,
    batch_index: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    order: str | None = None,
    decode: bool = False,
    tokenizer: str | None = None,
    doc_index: DocIndex | None = None,
    source: InstanceSource | None = None,
    verify_data: bool = True,
) -> BatchReport:
    """The global batch of training step `step` (1-based) or `batch_index` (0-based), or rank `rank`'s part.

    `config` is the training config (path or dict). `order` overrides where the order is read (a directory, an
    epoch-0 order file or a URL). The batch fingerprint always covers the whole global batch, as the
    trainer's. `verify_data=False` uses an order whose recorded data fingerprint differs from the data's (the
    same files moved elsewhere, say); compare the batch fingerprint with the run's metrics to be sure.
    """
    cfg = read_train_config(config) if isinstance(config, str) else config
    if (step is None) == (batch_index is None):
        raise DataError("give exactly one of --step (1-based training step) and --batch-index (0-based)")
    if (rank is None) != (world_size is None):
        raise DataError("--rank and --world-size go together: rank r of world size W trains positions r, r+W, ...")
    if source is None:
        source = open_from_config(cfg)
    gbs = int(cfg["global_train_batch_size"])
    n = len(source)
    pos: BatchPosition = (
        step_position(step, gbs, n) if step is not None else batch_position(int(batch_index or 0), gbs, n)
    )
    path = order_path_for_epoch(order or order_location(cfg), pos.epoch)
    start, stop = pos.order_range(gbs)
    if not is_remote(path) and not os.path.exists(path):
        raise DataError(
            f"step {pos.step} is past the end of the orders built: it is batch {pos.batch_in_epoch} of epoch "
            f"{pos.epoch} ({pos.batches_per_epoch} batches per epoch) and {path}: order file not found; "
            "build it "
            f"with `olmo-data build-order CONFIG --first-epoch {pos.epoch}`, or point data.order_path / "
            "--order at "
            "the order file"
        )
    try:
        expected = source.fingerprint() if verify_data else None
        indices = read_order_range(
            path, start, stop, expected_fingerprint=expected, num_instances=n, seed=int(cfg["seed"]), epoch=pos.epoch
        )
    except DataError as e:
        if "past the end" in str(e):
            raise DataError(
                f"step {pos.step} (batch index {pos.global_batch}) is past the end of the order: {e}"
            ) from e
        raise
    tokens, masks = source.get_batch(indices)
    report = BatchReport(
        step=pos.step,
        global_batch=pos.global_batch,
        epoch=pos.epoch,
        batch_in_epoch=pos.batch_in_epoch,
        batches_per_epoch=pos.batches_per_epoch,
        global_batch_size=gbs,
        sequence_length=source.sequence_length,
        seed=int(cfg["seed"]),
        num_instances=n,
        order_path=path,
        data_fingerprint=source.fingerprint(),
        batch_fingerprint=batch_fingerprint(tokens),
        rank=rank,
        world_size=world_size,
        run_steps=_run_steps(cfg, gbs, source.sequence_length, pos.batches_per_epoch),
    )
    positions = rank_positions(gbs, rank, world_size) if rank is not None and world_size is not None else np.arange(gbs)
    locations = source.locate_many(indices[positions])
    docs = doc_index or DocIndex()
    docs.prepare((loc.path, source.files[loc.file_index].metadata_path) for loc in locations)
    decoder = data_tokenizer(tokenizer, source) if decode else None
    L = source.sequence_length
    for p, loc in zip(positions.tolist(), locations, strict=True):
        ids = tokens[p]
        report.instances.append(
            InstanceReport(
                position=p,
                instance=loc.index,
                path=loc.path,
                token_offset=loc.token_offset,
                token_ids=ids,
                label_mask=masks[p] if masks is not None else None,
                source=loc.source,
                documents=docs.lookup(
                    loc.path, loc.token_offset, loc.token_offset + L, source.files[loc.file_index].metadata_path
                ),
                text=decoder.decode(ids.tolist()) if decoder is not None else None,
            )
        )
    return report


def _run_steps(cfg: dict[str, Any], gbs: int, sequence_length: int, batches_per_epoch: int) -> int | None:
    """How many steps the config's run trains (its max_duration), or None when the config does not say."""
    from olmo_data.stats import duration_steps

    duration = cfg.get("max_duration")
    if duration is None:
        return None
    try:
        return duration_steps(
            duration, global_batch_size=gbs, sequence_length=sequence_length, batches_per_epoch=batches_per_epoch
        )
    except DataError:
        return None


def _recorded_tokenizer(source: InstanceSource) -> tuple[dict[str, Any], str] | None:
    """The tokenizer identity the token files' manifests record, and the manifest it came from; None without
    one. Files tokenized with different tokenizers cannot be decoded with one, so that is refused."""
    found: dict[str, tuple[dict[str, Any], str]] = {}
    for directory in dict.fromkeys(f.path.rpartition("/")[0] or "." for f in source.files):
        identity = ((read_manifest(directory) or {}).get("tokenizer")) or {}
        if identity.get("sha256"):
            found.setdefault(str(identity["sha256"]), (identity, f"{directory}/manifest.json"))
    if len(found) > 1:
        names = "; ".join(f"{m}: {i.get('name')!r} sha256 {sha[:16]}..." for sha, (i, m) in found.items())
        raise DataError(
            f"the token files were tokenized with different tokenizers ({names}); inspect them one source at a time"
        )
    return next(iter(found.values()), None)


def data_tokenizer(tokenizer: str | None, source: InstanceSource, purpose: str = "--decode") -> Any:
    """The tokenizer `source` was tokenized with, to decode it (or, for `trace --text`, to encode a passage the
    way the data was): another vocabulary prints plausible but wrong text, or finds nothing. The manifest's sha256
    is the judge. `purpose` names the option that needs it in the errors."""
    from olmo_data.tokenizer import load_tokenizer

    def load(spec: str) -> Any:
        return load_tokenizer(spec, "auto" if spec.endswith(".tiktoken") else "hf")

    recorded = _recorded_tokenizer(source)
    identity, manifest = recorded if recorded is not None else ({}, "")
    expected = identity.get("sha256")
    if tokenizer is not None:
        tok = load(tokenizer)
        if expected and tok.sha256 != expected:
            raise DataError(
                f"--tokenizer {tokenizer} has sha256 {tok.sha256}, but {manifest} records that the data was "
                f"tokenized with {identity.get('name')!r} (sha256 {expected}); decoding with another tokenizer "
                "gives wrong text: pass --tokenizer with the tokenizer the data was tokenized with"
            )
        return tok
    if not identity:
        raise DataError(
            f"{purpose} needs the tokenizer: the token files have no manifest naming one; pass --tokenizer PATH "
            "(a tokenizer.json or .tiktoken file)"
        )
    name = identity.get("name")
    spec = identity.get("path") or (name if name and os.path.exists(str(name)) else None)
    if not spec:
        raise DataError(
            f"{purpose} needs the tokenizer: {manifest} names {name!r} but records no path to it, and no file of "
            "that name is here; pass --tokenizer PATH (a tokenizer.json or .tiktoken file)"
        )
    try:
        tok = load(str(spec))
    except DataError as e:
        raise DataError(
            f"{purpose} needs the tokenizer: {manifest} records {str(spec)!r}, which cannot be loaded here ({e}); "
            "pass --tokenizer PATH (a tokenizer.json or .tiktoken file)"
        ) from e
    if expected and tok.sha256 != expected:
        raise DataError(
            f"{purpose}: the tokenizer at {spec} has sha256 {tok.sha256}, but {manifest} records sha256 {expected} "
            f"for {name!r}: it is not the tokenizer the data was tokenized with (changed since?); pass "
            "--tokenizer PATH with the original tokenizer"
        )
    return tok


def format_report(report: BatchReport, *, max_tokens: int = 16) -> str:
    """The human-readable form `olmo-data inspect-batch` prints."""
    r = report
    lines = [
        f"step {r.step} = global batch {r.global_batch} (epoch {r.epoch}, batch {r.batch_in_epoch} of "
        f"{r.batches_per_epoch} per epoch); global batch size {r.global_batch_size}, sequence length "
        f"{r.sequence_length}, seed {r.seed}, {r.num_instances:,} instances",
        f"order: {r.order_path}",
        f"data fingerprint: {r.data_fingerprint}",
        f"batch fingerprint: {r.batch_fingerprint}",
    ]
    if r.run_steps is not None and r.step > r.run_steps:
        lines.append(
            f"note: the run trains {r.run_steps} steps (its max_duration), so it never trained step {r.step}: this is "
            "the batch the order holds for that step, had the run gone on"
        )
    if r.rank is not None:
        lines.append(
            f"rank {r.rank} of world size {r.world_size}: positions {r.rank}, {r.rank}+{r.world_size}, ... "
            f"({len(r.instances)} instances)"
        )
    for inst in r.instances:
        src = f" (source {inst.source})" if inst.source else ""
        lines.append(f"[{inst.position}] instance {inst.instance}: {inst.path} @ token {inst.token_offset}{src}")
        shown = " ".join(map(str, inst.token_ids[:max_tokens].tolist()))
        more = f" ... ({len(inst.token_ids)} tokens)" if len(inst.token_ids) > max_tokens else ""
        lines.append(f"    tokens: {shown}{more}")
        if inst.label_mask is not None:
            lines.append(f"    label mask: {int(inst.label_mask.sum())} of {len(inst.label_mask)} tokens are targets")
        if inst.documents is None:
            lines.append("    documents: (no metadata beside the token file)")
        for d in inst.documents or []:
            lines.append(
                f"    doc {d.id!r} from {d.src} line {d.loc}: instance tokens [{d.instance_start}, "
                f"{d.instance_end}) = document tokens [{d.document_start}, "
                f"{d.document_start + d.instance_end - d.instance_start}) of {d.end - d.start}"
            )
        if inst.text is not None:
            lines.append("    text: " + json.dumps(inst.text, ensure_ascii=False))
    return "\n".join(lines)
