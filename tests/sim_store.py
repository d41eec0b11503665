"""A simulated object store: OLMo 3's pretraining data at any scale, its bytes computed, never stored.

Why: the runs users ask about read ~6e12 tokens from thousands of remote token files; no disk here holds that, and
a user's laptop never holds it either (the data stays remote). This store serves such a corpus from a loopback
server whose every byte is a pure function of (object name, offset), so tests and benchmarks meet the scale, and
check every answer by computing it again from the same functions, without the toolkit's code.

What it holds (`SimSpec` sets the scale; `SimSpec()` is tiny, `SimSpec.olmo3()` is OLMo 3 7B's ~6e12 tokens):

* `tokens/part-NNNNN.npy`: `files` headerless uint32 token files (dolma2 ids) of uneven sizes (log-normal
  weights summing to `total_tokens`; file 1 is shorter than one sequence, as stray small files are). Their tokens
  are hashes of (seed, file, position) below the EOS id, and the EOS id ends every document.
* `tokens/part-NNNNN.csv.gz`: that file's document metadata in tokenize's format (rows `start,end,id,src,loc`), for
  files whose number is not 3 mod 4 (none with `metadata=False`); the others have none (404), as files tokenized
  without metadata. Documents
  come in pairs of lengths `A + d` and `A - d` (`A` per file, `d` hashed per pair), so any row is computed in O(1).
  Numbers are zero-padded to fixed widths and the gzip stream is made of stored (uncompressed) deflate blocks, so
  the size and any byte range of the `.csv.gz` are computed without the rest of it (only the gzip trailer's CRC
  needs the whole text; it is computed once when asked). Stored blocks make the file ~3x its real, compressed size.
* `tokens/part-NNNNN.docs.idx` (when `doc_index`): beside every metadata file, the range-readable document index
  that `olmo-data index-documents` writes, as if it had been run once (`sim_doc_index`: computed, its sha256 of
  the metadata zeros).
* `orders/global_indices_dataset_size{N}_epoch{e}_seed{s}_v1.npy` (when `with_order`): OLMo-core's order of
  epoch `e` of the run's NumpyFSLDataset (`sequence_length`, loader seed `order_seed`), by OLMo-core's rule:
  `np.random.Generator(np.random.PCG64(seed + epoch))` shuffling `np.arange(N, dtype=uint32)`. This one is built
  (once, on first use; at full scale ~150 s and 2.9 GB, kept in `order_cache` when given), not computed per byte.
* `olmo/train_data/global_indices.npy` (when `with_order`): the order of the same instances for an OLMo-form
  YAML over the same files (`olmo_config`, seed `olmo_seed`), as OLMo's trainer writes it in
  `save_folder/train_data`: epoch 0's `np.random.Generator(np.random.PCG64(olmo_seed + 0))` shuffling
  `np.arange(N, dtype=uint32)`, N the same instances (OLMo's MemMapDataset also cuts each file into
  `tokens // max_sequence_length` instances, file after file). With the default `olmo_seed = order_seed + 1` it is
  the same permutation as OLMo-core's epoch 1, built once for both.

`SimServer` serves it over HTTP/1.1 (HEAD, GET with `Range`) at `{url}/{bucket}/{key}`, which is also the path an
S3 client sends for `s3://{bucket}/{key}` with `AWS_ENDPOINT_URL={url}` (path-style): HEAD object, ranged GET
object and ListObjectsV2 (prefix, delimiter, pages of `list_page` keys) answer as S3 does, through the same code
path (boto3) the toolkit uses for s3://. Every request waits `latency_s`; bodies go at `bandwidth` bytes/s. It
counts what it was asked (`stats()`, or `GET /_stats` from another process), among them whole GETs by key: no
command should download a whole token file.

`python -m tests.sim_store --scale olmo3 --latency 0.05` serves until killed, printing its URL first (benchmarks run
it in a process of its own, so that it does not share the client's GIL).
"""

from __future__ import annotations

import functools
import http.server
import json
import math
import os
import re
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import numpy as np

VOCAB, EOS, PAD = 100278, 100257, 100277  # dolma2 (OLMo 3): uint32 token files
CLUSTER_WORK_DIR = "/weka/oe-training-default/ai2-llm/checkpoints/OLMo3-7B-sim"  # absent here, as on a laptop
BLOCK = 65535  # csv bytes per stored deflate block (its most)
GZ_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no name, mtime 0, unknown OS
LAST_MODIFIED = "Wed, 01 Jan 2025 00:00:00 GMT"


@dataclass(frozen=True)
class SimSpec:
    """The simulated corpus and run. Every field changes the bytes (and the objects' ETags)."""

    files: int = 24
    total_tokens: int = 400_000
    seed: int = 0
    doc_tokens: int = 120  # mean document length (per file it is 0.5x..1.5x this)
    spread: float = 0.6  # sigma of the log-normal file-size weights
    sequence_length: int = 64  # the OLMo-core run's (instances, and so the order's length)
    instances_per_batch: int = 8  # global batch, in instances
    order_seed: int = 34521  # data_loader.seed
    order_epochs: tuple[int, ...] = (1,)
    with_order: bool = True
    olmo_seed: int = 34522  # the OLMo-form YAML's seed (default: order_seed + 1, OLMo-core's epoch 1 permutation)
    metadata: bool = True  # False: no file has metadata (a corpus tokenized without it)
    doc_index: bool = False  # True: a range-readable `.docs.idx` beside every metadata file (sim_doc_index)
    bucket: str = "sim"

    @classmethod
    def olmo3(cls, **changes: Any) -> SimSpec:
        """OLMo 3 7B's pretraining at full scale: 4,000 files, 6e12 tokens, batches of 512 x 8,192 tokens."""
        full = cls(files=4000, total_tokens=6 * 10**12, doc_tokens=2048, sequence_length=8192, instances_per_batch=512)
        spec = replace(full, **changes)
        if "order_epochs" not in changes and dataset_size(spec) % spec.instances_per_batch:
            # max_duration is one epoch's instance tokens, and a dropped tail leaves it short by part of a batch: the
            # run trains one step of epoch 2, so OLMo-core wrote that epoch's order into its work_dir too
            spec = replace(spec, order_epochs=(1, 2))
        return spec

    def tag(self) -> str:
        """A short digest of the spec: the objects' ETags (another spec, other bytes)."""
        return f"{zlib.crc32(repr(self).encode()):08x}"


# -- hashing ---------------------------------------------------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)  # a new array: the rest works in place
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z ^= z >> np.uint64(shift)
        z *= np.uint64(factor)
    z ^= z >> np.uint64(31)
    return z


def _key(spec: SimSpec, what: int, i: Any) -> np.ndarray:
    return _mix((np.uint64(spec.seed) << np.uint64(32)) | (np.uint64(what) << np.uint64(24)) | np.asarray(i, np.uint64))


def _uniform(h: np.ndarray) -> np.ndarray:
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


# -- token files -----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def token_counts(spec: SimSpec) -> np.ndarray:
    """Tokens in each file (int64), uneven, summing to `total_tokens`."""
    i = np.arange(spec.files, dtype=np.uint64)
    u1, u2 = _uniform(_key(spec, 1, i)), _uniform(_key(spec, 2, i))
    weights = np.exp(spec.spread * np.sqrt(-2 * np.log1p(-u1)) * np.cos(2 * np.pi * u2))
    n = np.maximum(1, np.floor(weights / weights.sum() * spec.total_tokens)).astype(np.int64)
    if spec.files > 2:
        n[1] = max(1, spec.sequence_length // 2 + 3)  # a stray small file: no instance of its own
    n[-1] = max(1, n[-1] + spec.total_tokens - int(n.sum()))
    return n


def _pair(spec: SimSpec, i: int) -> tuple[int, int]:
    """(A, D) of file i: documents in pairs of A + d and A - d tokens, |d| <= D."""
    a = max(2, round(spec.doc_tokens * (0.5 + float(_uniform(_key(spec, 3, [i]))[0]))))
    return a, a // 2


def _pair_ends(spec: SimSpec, i: int, k: np.ndarray) -> np.ndarray:
    """Ends of the two documents of each pair k (shape (len(k), 2)), before the file's end cuts them."""
    a, d = _pair(spec, i)
    h = _mix(_key(spec, 4, [i])[0] + np.asarray(k, np.uint64))
    delta = (h % np.uint64(2 * d + 1)).astype(np.int64) - d
    base = 2 * a * np.asarray(k, np.int64)
    return np.stack([base + a + delta, base + 2 * a], axis=1)


def document_count(spec: SimSpec, i: int) -> int:
    n = int(token_counts(spec)[i])
    a, _ = _pair(spec, i)
    k = (n - 1) // (2 * a)
    first_end = int(_pair_ends(spec, i, np.array([k]))[0, 0])
    return 2 * k + 1 + (first_end < n)


def document_bounds(spec: SimSpec, i: int, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of documents `j` of file i (each below `document_count`); the last ends at the file's end."""
    j = np.asarray(j, np.int64)
    n = int(token_counts(spec)[i])
    a, _ = _pair(spec, i)
    ends = _pair_ends(spec, i, j // 2)
    odd = (j % 2).astype(bool)
    start = np.where(odd, ends[:, 0], 2 * a * (j // 2))
    end = np.minimum(np.where(odd, ends[:, 1], ends[:, 0]), n)
    return start, np.where(j == document_count(spec, i) - 1, n, end)


def documents(spec: SimSpec, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every document of file i."""
    return document_bounds(spec, i, np.arange(document_count(spec, i)))


def document_id(spec: SimSpec, i: int, j: int) -> str:
    return f"sim-{i:05d}-{j:09d}"


def tokens(spec: SimSpec, i: int, start: int, stop: int) -> np.ndarray:
    """Tokens start..stop of file i (uint32): hashes below EOS, EOS at the last token of every document."""
    n = int(token_counts(spec)[i])
    stop = min(stop, n)
    if start >= stop:
        return np.zeros(0, np.uint32)
    t = np.arange(start, stop, dtype=np.uint64)
    out = (_mix(_key(spec, 5, [i])[0] + t) % np.uint64(min(EOS, PAD))).astype(np.uint32)
    a, _ = _pair(spec, i)
    ends = _pair_ends(spec, i, np.arange(max(0, start // (2 * a) - 1), (stop - 1) // (2 * a) + 2)).ravel()
    eos = np.append(ends[ends < n], n) - 1
    out[eos[(eos >= start) & (eos < stop)] - start] = EOS
    return out


# -- metadata (.csv.gz of stored deflate blocks) -----------------------------------------------------------------


def has_metadata(spec: SimSpec, i: int) -> bool:
    return spec.metadata and i % 4 != 3


def _source(i: int) -> str:
    return f"s3://sim-docs/part-{i:05d}.jsonl.gz"


def _row_bytes(spec: SimSpec) -> int:
    return len(_rows(spec, 0, np.array([0])))


def _rows(spec: SimSpec, i: int, j: np.ndarray) -> bytes:
    starts, ends = document_bounds(spec, i, j)
    src = _source(i)
    return "".join(
        f"{s:011d},{e:011d},{document_id(spec, i, k)},{src},{k + 1:09d}\n"
        for s, e, k in zip(starts.tolist(), ends.tolist(), j.tolist(), strict=True)
    ).encode()


def csv_size(spec: SimSpec, i: int) -> int:
    return document_count(spec, i) * _row_bytes(spec)


def csv_bytes(spec: SimSpec, i: int, start: int, stop: int) -> bytes:
    """Bytes start..stop of file i's metadata text (before gzip)."""
    stop = min(stop, csv_size(spec, i))
    if start >= stop:
        return b""
    r = _row_bytes(spec)
    first, last = start // r, (stop - 1) // r
    return _rows(spec, i, np.arange(first, last + 1))[start - first * r : stop - first * r]


@functools.lru_cache(maxsize=8192)
def _crc(spec: SimSpec, i: int) -> int:
    crc, size, step = 0, csv_size(spec, i), 64 * _row_bytes(spec) * 1024
    for lo in range(0, size, step):
        crc = zlib.crc32(csv_bytes(spec, i, lo, lo + step), crc)
    return crc


def gz_size(spec: SimSpec, i: int) -> int:
    c = csv_size(spec, i)
    return len(GZ_HEADER) + 5 * max(1, math.ceil(c / BLOCK)) + c + 8


def gz_bytes(spec: SimSpec, i: int, start: int, stop: int) -> bytes:
    """Bytes start..stop of file i's `.csv.gz`: header, stored blocks (5-byte header, then their csv), trailer."""
    c, size = csv_size(spec, i), gz_size(spec, i)
    stop = min(stop, size)
    blocks = max(1, math.ceil(c / BLOCK))
    out, pos = [], start
    while pos < stop:
        if pos < len(GZ_HEADER):
            out.append(GZ_HEADER[pos:stop])
            pos = min(stop, len(GZ_HEADER))
            continue
        if pos >= size - 8:
            trailer = struct.pack("<II", _crc(spec, i), c & 0xFFFFFFFF)
            out.append(trailer[pos - (size - 8) : stop - (size - 8)])
            break
        b, at = divmod(pos - len(GZ_HEADER), BLOCK + 5)
        n = min(BLOCK, c - b * BLOCK)
        if at < 5:
            head = struct.pack("<BHH", int(b == blocks - 1), n, n ^ 0xFFFF)
            out.append(head[at : at + stop - pos])
            pos += min(5 - at, stop - pos)
            continue
        lo = b * BLOCK + at - 5
        hi = min(b * BLOCK + n, lo + stop - pos)
        out.append(csv_bytes(spec, i, lo, hi))
        pos += hi - lo
    return b"".join(out)


# -- the run: instances and its order --------------------------------------------------------------------------


def instance_counts(spec: SimSpec) -> np.ndarray:
    """OLMo-core's NumpyFSLDataset: each file holds `tokens // sequence_length` instances, file after file."""
    return token_counts(spec) // spec.sequence_length


def dataset_size(spec: SimSpec) -> int:
    return int(instance_counts(spec).sum())


def instance_location(spec: SimSpec, instance: int) -> tuple[int, int]:
    """(file, first token) of instance `instance`."""
    bounds = np.cumsum(instance_counts(spec))
    i = int(np.searchsorted(bounds, instance, side="right"))
    before = int(bounds[i - 1]) if i else 0
    return i, (instance - before) * spec.sequence_length


def instance_tokens(spec: SimSpec, instance: int) -> np.ndarray:
    i, start = instance_location(spec, instance)
    return tokens(spec, i, start, start + spec.sequence_length)


def order_name(spec: SimSpec, epoch: int) -> str:
    """OLMo-core's name of an epoch's order file (its fields sorted, no chunk)."""
    return f"global_indices_dataset_size{dataset_size(spec)}_epoch{epoch}_seed{spec.order_seed}_v1.npy"


def permutation(spec: SimSpec, pcg_seed: int) -> np.ndarray:
    """`np.arange(N, dtype=uint32)` over the dataset's N instances, shuffled by PCG64(pcg_seed): both trainers'
    orders are such permutations."""
    order = np.arange(dataset_size(spec), dtype=np.uint32)
    np.random.Generator(np.random.PCG64(pcg_seed)).shuffle(order)
    return order


def build_order(spec: SimSpec, epoch: int) -> np.ndarray:
    """OLMo-core's order of `epoch` (1-based) over the dataset's instances."""
    return permutation(spec, spec.order_seed + epoch)


def step_instances(spec: SimSpec, step: int, order: np.ndarray | None = None) -> np.ndarray:
    """The instances of training step `step` (1-based): OLMo-core's batch `(step-1) % per_epoch` of epoch
    `1 + (step-1) // per_epoch`, the epoch's tail that does not fill a batch dropped."""
    per_batch = spec.instances_per_batch
    per_epoch = dataset_size(spec) // per_batch
    epoch, batch = 1 + (step - 1) // per_epoch, (step - 1) % per_epoch
    whole = build_order(spec, epoch) if order is None else order
    return np.asarray(whole[batch * per_batch : (batch + 1) * per_batch], dtype=np.int64)


OLMO_ORDER_KEY = "olmo/train_data/global_indices.npy"  # where OLMo's trainer writes epoch 0's order, copied here


def olmo_step_instances(spec: SimSpec, step: int, order: np.ndarray | None = None) -> np.ndarray:
    """The instances of step `step` (1-based) of the OLMo-form run (`olmo_config`): OLMo's global batch `step - 1`
    of `instances_per_batch` instances, epochs counted from 0 (`(step-1) // per_epoch`), each epoch's order
    PCG64(olmo_seed + epoch), its tail that does not fill a batch dropped."""
    per_batch = spec.instances_per_batch
    per_epoch = dataset_size(spec) // per_batch
    epoch, batch = (step - 1) // per_epoch, (step - 1) % per_epoch
    whole = permutation(spec, spec.olmo_seed + epoch) if order is None else order
    return np.asarray(whole[batch * per_batch : (batch + 1) * per_batch], dtype=np.int64)


def olmo_config(spec: SimSpec, paths: list[str], save_folder: str = f"{CLUSTER_WORK_DIR}-olmo") -> dict[str, Any]:
    """An OLMo-form training YAML's keys (allenai/OLMo's TrainConfig, as its official OLMo 2 configs write them)
    for the run over `paths`: a 7B-shaped model over dolma2 ids (`data.memmap_dtype: uint32`, headerless files
    without a manifest), `max_sequence_length` and `global_train_batch_size` the spec's, seed `olmo_seed`, one
    epoch; `save_folder` (where OLMo keeps its order, `train_data/global_indices.npy`) is the training cluster's
    folder, absent here."""
    model = {
        "d_model": 4096,
        "n_heads": 32,
        "n_layers": 32,
        "mlp_hidden_size": 22016,
        "weight_tying": False,
        "alibi": False,
        "rope": True,
        "rope_theta": 500000,
        "flash_attention": True,
        "attention_dropout": 0.0,
        "include_bias": False,
        "block_type": "sequential",
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "layer_norm_eps": 1e-6,
        "bias_for_layer_norm": False,
        "attention_layer_norm": True,
        "attention_layer_norm_with_affine": True,
        "norm_after": True,
        "activation_type": "swiglu",
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "max_sequence_length": spec.sequence_length,
        "vocab_size": VOCAB,
        "embedding_size": 100352,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "init_device": "meta",
        "init_fn": "normal",
        "init_std": 0.02,
        "init_cutoff_factor": 3,
    }
    return {
        "run_name": "OLMo-7B-sim",
        "seed": spec.olmo_seed,
        "dry_run": False,
        "model": model,
        "optimizer": {"name": "adamw", "learning_rate": 3.0e-4, "weight_decay": 0.1, "betas": [0.9, 0.95]},
        "scheduler": {"name": "cosine_with_warmup", "units": "tokens", "t_warmup": 8388608000, "alpha_f": 0.1},
        "tokenizer": {"identifier": "allenai/dolma2-tokenizer", "truncate_direction": "right"},
        "save_folder": save_folder,
        "remote_save_folder": "s3://ai2-llm/checkpoints/OLMo-7B-sim",
        "save_overwrite": False,
        "max_duration": "1ep",
        "global_train_batch_size": spec.instances_per_batch,
        "device_train_microbatch_size": 2,
        "precision": "amp_bf16",
        "max_grad_norm": 1.0,
        "data": {
            "pad_direction": "right",
            "num_workers": 32,
            "drop_last": True,
            "pin_memory": True,
            "prefetch_factor": 8,
            "persistent_workers": True,
            "memmap_dtype": "uint32",
            "timeout": 0,
            "paths": list(paths),
        },
    }


def write_olmo_yaml(spec: SimSpec, paths: list[str], path: str | os.PathLike[str], **changes: Any) -> Path:
    """`olmo_config(spec, paths, **changes)` written as YAML at `path` (returned)."""
    import yaml

    out = Path(path)
    out.write_text(yaml.safe_dump(olmo_config(spec, paths, **changes), sort_keys=False))
    return out


def olmo_core_config(spec: SimSpec, paths: list[str], work_dir: str = CLUSTER_WORK_DIR) -> dict[str, Any]:
    """The data side of the run's config.json, as OLMo-core's classes write it (`as_config_dict`): its
    NumpyFSLDatasetConfig over `paths`, NumpyDataLoaderConfig and trainer max_duration (one epoch's tokens);
    both work_dirs are the training cluster's folder (absent here)."""
    tokenizer = {
        "vocab_size": VOCAB,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "identifier": "allenai/dolma2-tokenizer",
        "_CLASS_": "olmo_core.data.tokenizer.TokenizerConfig",
    }
    dataset = {
        "tokenizer": tokenizer,
        "paths": list(paths),
        "expand_glob": False,
        "include_instance_metadata": True,
        "work_dir": f"{work_dir}/dataset-cache",
        "ignore_fingerprint_mismatch": False,
        "sequence_length": spec.sequence_length,
        "generate_doc_lengths": False,
        "_CLASS_": "olmo_core.data.numpy_dataset.NumpyFSLDatasetConfig",
    }
    loader = {
        "global_batch_size": spec.instances_per_batch * spec.sequence_length,
        "seed": spec.order_seed,
        "work_dir": f"{work_dir}/dataset-cache",
        "num_workers": 0,
        "ignore_fingerprint_mismatch": False,
        "_CLASS_": "olmo_core.data.data_loader.NumpyDataLoaderConfig",
        "type": "numpy",
    }
    tokens_per_epoch = dataset_size(spec) * spec.sequence_length
    duration = {"value": tokens_per_epoch, "unit": "tokens", "_CLASS_": "olmo_core.train.common.Duration"}
    return {"dataset": dataset, "data_loader": loader, "trainer": {"max_duration": duration}}


# -- objects ---------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"tokens/part-(\d{5})\.(npy|csv\.gz|docs\.idx)")


@dataclass
class Orders:
    """The order files' arrays, each built once (in `cache`, a folder, when given: mapped on later runs)."""

    spec: SimSpec
    cache: str | None = None
    _built: dict[int, np.ndarray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, epoch: int) -> np.ndarray:
        """OLMo-core's order of `epoch`."""
        return self.permutation(self.spec.order_seed + epoch)

    def olmo(self) -> np.ndarray:
        """The OLMo-form run's epoch-0 order (`OLMO_ORDER_KEY`)."""
        return self.permutation(self.spec.olmo_seed)

    def permutation(self, pcg_seed: int) -> np.ndarray:
        with self._lock:
            if pcg_seed not in self._built:
                self._built[pcg_seed] = self._make(pcg_seed)
            return self._built[pcg_seed]

    def _make(self, pcg_seed: int) -> np.ndarray:
        if self.cache is None:
            return permutation(self.spec, pcg_seed)
        sp = self.spec  # what the order depends on (not the metadata, nor the bucket); named as OLMo-core's epoch
        name = order_name(sp, pcg_seed - sp.order_seed)
        path = Path(self.cache) / f"{sp.files}-{sp.total_tokens}-{sp.seed}-{sp.spread}-{name}"
        if not path.is_file() or path.stat().st_size != 4 * dataset_size(self.spec):
            path.parent.mkdir(parents=True, exist_ok=True)
            permutation(self.spec, pcg_seed).tofile(f"{path}.tmp")
            os.replace(f"{path}.tmp", path)
        return np.memmap(path, dtype="<u4", mode="r")


def object_keys(spec: SimSpec) -> list[str]:
    """Every key of the store, sorted (as S3 lists them)."""
    keys = [f"tokens/part-{i:05d}.npy" for i in range(spec.files)]
    keys += [f"tokens/part-{i:05d}.csv.gz" for i in range(spec.files) if has_metadata(spec, i)]
    if spec.doc_index:
        keys += [f"tokens/part-{i:05d}.docs.idx" for i in range(spec.files) if has_metadata(spec, i)]
    if spec.with_order:
        keys += [f"orders/{order_name(spec, e)}" for e in spec.order_epochs] + [OLMO_ORDER_KEY]
    return sorted(keys)


def _parse(spec: SimSpec, key: str) -> tuple[str, int] | None:
    """(kind, number) of a key: ("tokens", file), ("metadata", file), ("docindex", file), ("order", epoch) or
    ("order", -1): the OLMo-form run's; None: no such object."""
    if m := _TOKEN.fullmatch(key):
        i, ext = int(m.group(1)), m.group(2)
        if (
            i >= spec.files
            or (ext != "npy" and not has_metadata(spec, i))
            or (ext == "docs.idx" and not spec.doc_index)
        ):
            return None
        return {"npy": "tokens", "csv.gz": "metadata", "docs.idx": "docindex"}[ext], i
    if spec.with_order and key == OLMO_ORDER_KEY:
        return "order", -1
    if spec.with_order and key.startswith("orders/"):
        for e in spec.order_epochs:
            if key == f"orders/{order_name(spec, e)}":
                return "order", e
    return None


@functools.lru_cache(maxsize=16)
def _default_indexes(spec: SimSpec) -> Any:
    from tests.sim_doc_index import DocIndexes

    return DocIndexes(spec)


def object_size(spec: SimSpec, key: str, indexes: Any = None) -> int | None:
    """Size in bytes of object `key`, None when the store has none by that name (`indexes`: the server's
    `sim_doc_index.DocIndexes`, for `.docs.idx` objects)."""
    what = _parse(spec, key)
    if what is None:
        return None
    kind, n = what
    if kind == "tokens":
        return 4 * int(token_counts(spec)[n])
    if kind == "metadata":
        return gz_size(spec, n)
    if kind == "docindex":
        from tests.sim_doc_index import index_size

        return index_size(spec, n, indexes or _default_indexes(spec))
    return 4 * dataset_size(spec)


def object_bytes(
    spec: SimSpec, key: str, start: int, stop: int, orders: Orders | None = None, indexes: Any = None
) -> bytes:
    """Bytes start..stop of object `key` (which must exist)."""
    kind, n = _parse(spec, key) or ("", 0)
    if kind == "docindex":
        from tests.sim_doc_index import index_bytes

        return index_bytes(spec, n, start, stop, indexes or _default_indexes(spec))
    if kind == "tokens":
        lo, hi = start // 4, -(-stop // 4)
        return tokens(spec, n, lo, hi).astype("<u4").tobytes()[start - 4 * lo : stop - 4 * lo]
    if kind == "metadata":
        return gz_bytes(spec, n, start, stop)
    if kind == "order":
        orders = orders or Orders(spec)
        order = orders.olmo() if n == -1 else orders.get(n)
        lo, hi = start // 4, -(-stop // 4)
        return np.asarray(order[lo:hi], dtype="<u4").tobytes()[start - 4 * lo : stop - 4 * lo]
    raise KeyError(key)


def etag(spec: SimSpec, key: str) -> str:
    return f'"{spec.tag()}-{zlib.crc32(key.encode()):08x}"'


# -- the server ------------------------------------------------------------------------------------------------


class SimServer:
    """`with SimServer(spec, latency_s=0.05) as store:` serves the store at `store.url` (`store.base`: the
    bucket's HTTP folder; `store.endpoint`: AWS_ENDPOINT_URL for `s3://{bucket}/...`)."""

    def __init__(
        self,
        spec: SimSpec | None = None,
        *,
        latency_s: float = 0.0,
        bandwidth: float | None = None,
        list_page: int = 1000,
        order_cache: str | None = None,
        index_cache: str | None = None,
        port: int = 0,
    ) -> None:
        from tests.sim_doc_index import DocIndexes

        self.spec = spec or SimSpec()
        self.latency_s, self.bandwidth, self.list_page = latency_s, bandwidth, list_page
        self.orders = Orders(self.spec, order_cache)
        self.indexes = DocIndexes(self.spec, index_cache)
        self._lock = threading.Lock()
        self.reset()
        handler = type("Handler", (_Handler,), {"sim": self})
        self._server = _Server(("127.0.0.1", port), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.endpoint = self.url
        self.base = f"{self.url}/{self.spec.bucket}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def reset(self) -> None:
        """Counters back to zero (a benchmark's next call)."""
        with self._lock:
            self.requests = self.heads = self.gets = self.lists = self.bytes_sent = 0
            self.in_flight = self.max_in_flight = 0
            self.by_kind: Counter[str] = Counter()  # GETs by kind: tokens, metadata, order
            self.bytes_by_kind: Counter[str] = Counter()
            self.whole_gets: Counter[str] = Counter()  # GETs without Range, by key
            self.largest: Counter[str] = Counter()  # the largest range asked, by kind

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "heads": self.heads,
                "gets": self.gets,
                "lists": self.lists,
                "bytes_sent": self.bytes_sent,
                "max_in_flight": self.max_in_flight,
                "gets_by_kind": dict(self.by_kind),
                "bytes_by_kind": dict(self.bytes_by_kind),
                "whole_gets": dict(self.whole_gets),
                "largest_range": dict(self.largest),
            }

    def __enter__(self) -> SimServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def http_urls(self) -> list[str]:
        return [f"{self.base}/tokens/part-{i:05d}.npy" for i in range(self.spec.files)]

    def s3_urls(self) -> list[str]:
        return [f"s3://{self.spec.bucket}/tokens/part-{i:05d}.npy" for i in range(self.spec.files)]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of concurrent connects must not be dropped by the kernel

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    sim: SimServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._counted(body=False)

    def do_GET(self) -> None:
        self._counted(body=True)

    def _counted(self, body: bool) -> None:
        sim = self.sim
        with sim._lock:
            sim.in_flight += 1
            sim.max_in_flight = max(sim.max_in_flight, sim.in_flight)
        try:
            self._serve(body)
        finally:
            with sim._lock:
                sim.in_flight -= 1

    def _serve(self, body: bool) -> None:
        sim, spec = self.sim, self.sim.spec
        path, _, query = self.path.partition("?")
        if path == "/_stats":
            self._send(200, json.dumps(sim.stats()).encode(), {"Content-Type": "application/json"}, body)
            return
        with sim._lock:
            sim.requests += 1
            sim.heads += not body
        if sim.latency_s:
            time.sleep(sim.latency_s)
        bucket, _, key = path.lstrip("/").partition("/")
        if bucket != spec.bucket:
            self._error(404, "NoSuchBucket", body)
            return
        params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
        if not key and "list-type" in params:
            with sim._lock:
                sim.lists += 1
            self._send(200, self._listing(params), {"Content-Type": "application/xml"}, body)
            return
        size = object_size(spec, key, sim.indexes)
        if size is None:
            self._error(404, "NoSuchKey", body)
            return
        headers = {"ETag": etag(spec, key), "Last-Modified": LAST_MODIFIED, "Accept-Ranges": "bytes"}
        start, stop, status = 0, size, 200
        if (header := self.headers.get("Range")) is not None:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
            if m is None or m.group(1) == m.group(2) == "":
                self._error(416, "InvalidRange", body, {"Content-Range": f"bytes */{size}"})
                return
            if m.group(1):
                start, stop = int(m.group(1)), min(size, int(m.group(2) or size - 1) + 1)
            else:  # a suffix: the last n bytes
                start, stop = max(0, size - int(m.group(2))), size
            if start >= size or stop <= start:
                self._error(416, "InvalidRange", body, {"Content-Range": f"bytes */{size}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        if body:
            kind = _parse(spec, key)[0]  # type: ignore[index]
            with sim._lock:
                sim.gets += 1
                sim.by_kind[kind] += 1
                sim.largest[kind] = max(sim.largest[kind], stop - start)
                if status == 200:
                    sim.whole_gets[key] += 1
                sim.bytes_by_kind[kind] += stop - start
        self.send_response(status)
        headers["Content-Length"] = str(stop - start)
        headers["Content-Type"] = "application/octet-stream"
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not body:
            return
        chunk = 4 * 2**20
        for lo in range(start, stop, chunk):
            self._write(object_bytes(spec, key, lo, min(stop, lo + chunk), sim.orders, sim.indexes))

    def _listing(self, params: dict[str, str]) -> bytes:
        """ListObjectsV2: keys after the continuation token (or start-after) under the prefix, a page at a time;
        with a delimiter, the keys past it folded into common prefixes."""
        sim, spec = self.sim, self.sim.spec
        prefix, delimiter = params.get("prefix", ""), params.get("delimiter", "")
        token = params.get("continuation-token")
        after = bytes.fromhex(token).decode() if token else params.get("start-after", "")
        page = min(sim.list_page, int(params.get("max-keys") or 1000))
        entries: list[tuple[str, bool]] = []  # (key or common prefix, is a prefix)
        for key in object_keys(spec):
            if not key.startswith(prefix) or key <= after:
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            item = (key[: cut + len(delimiter)], True) if cut >= 0 else (key, False)
            if entries and entries[-1] == item:
                continue
            if item[1] and item[0] <= after:
                continue
            entries.append(item)
        shown, truncated = entries[:page], len(entries) > page
        url = params.get("encoding-type") == "url"

        def enc(s: str) -> str:
            return quote(s, safe="/") if url else s.replace("&", "&amp;").replace("<", "&lt;")

        parts = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
            f"<Name>{spec.bucket}</Name><Prefix>{enc(prefix)}</Prefix><KeyCount>{len(shown)}</KeyCount>",
            f"<MaxKeys>{page}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>",
        ]
        if delimiter:
            parts.append(f"<Delimiter>{enc(delimiter)}</Delimiter>")
        if url:
            parts.append("<EncodingType>url</EncodingType>")
        if params.get("continuation-token"):
            parts.append(f"<ContinuationToken>{params['continuation-token']}</ContinuationToken>")
        for name, is_prefix in shown:
            if is_prefix:
                parts.append(f"<CommonPrefixes><Prefix>{enc(name)}</Prefix></CommonPrefixes>")
            else:
                parts.append(
                    f"<Contents><Key>{enc(name)}</Key><LastModified>2025-01-01T00:00:00.000Z</LastModified>"
                    f"<ETag>{etag(spec, name).replace(chr(34), '&quot;')}</ETag>"
                    f"<Size>{object_size(spec, name, sim.indexes)}</Size>"
                    "<StorageClass>STANDARD</StorageClass></Contents>"
                )
        if truncated:
            last = shown[-1][0]
            parts.append(f"<NextContinuationToken>{last.encode().hex()}</NextContinuationToken>")
        parts.append("</ListBucketResult>")
        return "".join(parts).encode()

    def _error(self, status: int, code: str, body: bool, headers: dict[str, str] | None = None) -> None:
        xml = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{code}</Message></Error>'
        self._send(status, xml.encode(), {"Content-Type": "application/xml", **(headers or {})}, body)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self._write(data)

    def _write(self, data: bytes) -> None:
        sim = self.sim
        with sim._lock:
            sim.bytes_sent += len(data)
        if sim.bandwidth is None:
            self.wfile.write(data)
            return
        step = 64 * 1024
        for i in range(0, len(data), step):
            self.wfile.write(data[i : i + step])
            time.sleep(min(step, len(data) - i) / sim.bandwidth)


def fetch_stats(url: str) -> dict[str, Any]:
    """The counters of a store served by another process (`GET {url}/_stats`)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/_stats", timeout=30) as r:
        return dict(json.loads(r.read()))


def main() -> None:
    """`python -m tests.sim_store --scale olmo3 --latency 0.05 [--no-order] [--order-cache DIR]`: serve the store
    until killed, printing its URL once it answers (the order, when served, is built first)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--scale", choices=("tiny", "olmo3"), default="tiny")
    ap.add_argument("--files", type=int, default=None)
    ap.add_argument("--tokens", type=float, default=None, help="total tokens (e.g. 6e12)")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes per second per response")
    ap.add_argument("--no-order", action="store_true", help="serve no order file")
    ap.add_argument("--no-metadata", action="store_true", help="serve no .csv.gz metadata")
    ap.add_argument("--order-cache", default=None, help="folder keeping the built order between runs")
    ap.add_argument("--doc-index", action="store_true", help="serve a .docs.idx beside every metadata file")
    ap.add_argument("--index-cache", default=None, help="folder keeping the indexes' sorted id hashes")
    ap.add_argument("--prepare-indexes", type=int, default=0, metavar="N", help="compute them first, N processes")
    args = ap.parse_args()
    spec = SimSpec.olmo3() if args.scale == "olmo3" else SimSpec()
    if args.files is not None:
        spec = replace(spec, files=args.files)
    if args.tokens is not None:
        spec = replace(spec, total_tokens=int(args.tokens))
    spec = replace(spec, with_order=not args.no_order, metadata=not args.no_metadata, doc_index=args.doc_index)
    kwargs = {"order_cache": args.order_cache, "index_cache": args.index_cache}
    with SimServer(spec, latency_s=args.latency, bandwidth=args.bandwidth, **kwargs) as s:
        if args.prepare_indexes and spec.doc_index:
            s.indexes.prepare(args.prepare_indexes)
        if spec.with_order:
            for e in spec.order_epochs:
                s.orders.get(e)
            s.orders.olmo()
        print(s.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
