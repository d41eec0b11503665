"""`olmo-train soup`: the weighted mean of the model weights of several checkpoints ("model souping", as OLMo 2
averaged its stage-2 anneals), written as an unsharded checkpoint.

The parents must be one architecture: the same model config and the same tensor names and shapes, else the soup
is refused naming the first key or tensor that differs. They may be sharded or unsharded and saved by any world
size: a sharded parent's tensors are read one at a time by `torch.distributed.checkpoint` from its metadata, an
unsharded one's are memory-mapped (`torch.load(mmap=True)`), so memory holds about two tensors (the mean being
built and the parent tensor being added), not N models.

model.pt is the trainer's own format (a `torch.save` of the state dict, fp32), written without the whole model in
memory: first its structure with the storage bytes skipped (`torch.serialization.skip_data`), then each mean
tensor written into its place in the file. Beside it: config.yaml (the first parent's, with load_path pointing at
the soup and reset_trainer_state, as an import's), the first parent's tokenizer.json if it has one,
checksums.json, and trainer_state.json at step 0 whose lineage names every parent with its weight. So `verify`,
`export-hf`, `generate` and fine-tuning (load_path + reset_trainer_state) take it as any checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from olmo_data.config import ModelConfig, TrainConfig, save_config
from olmo_data.display import progress_bar
from olmo_data.errors import DataError
from olmo_data.io import is_remote
from olmo_train.checkpoint import safety
from olmo_train.checkpoint.fetch import localize
from olmo_train.checkpoint.files import atomic_directory, checkpoint_kind, read_config, refuse_existing
from olmo_train.checkpoint.integrity import Recorder, read_trainer_state
from olmo_train.checkpoint.layout import CONFIG, DCP_METADATA, MODEL_FILE, TOKENIZER_FILE, TRAINER_STATE, TrainerState
from olmo_train.checkpoint.lineage import parent_record
from olmo_train.checkpoint.load import check_files
from olmo_train.distributed import Dist

# model config keys that say how a model runs, not what it is: parents may differ in them
_HOW_IT_RUNS = ("flash_attention", "activation_checkpointing", "activation_checkpointing_policy", "loss_chunk_tokens")
TIED = "lm_head.weight"  # with weight_tying, the embedding under a second name: averaged once, stored shared


@dataclasses.dataclass
class _Parent:
    given: str
    path: Path
    kind: str
    state: TrainerState
    config: TrainConfig
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]]

    def read(self, name: str) -> torch.Tensor:
        """One model tensor, as stored (a sharded parent: read alone; unsharded: memory-mapped, mapped only for
        this read, so the pages read are let go with it)."""
        if self.kind == "unsharded":
            state = torch.load(self.path / MODEL_FILE, map_location="cpu", weights_only=True, mmap=True)
            return state[name]  # type: ignore[no-any-return]
        shape, dtype = self.tensors[name]
        holder = {"model": {name: torch.empty(shape, dtype=dtype)}}
        with warnings.catch_warnings():  # DCP without a process group says it reads in one process: it does
            warnings.simplefilter("ignore", UserWarning)
            safety.load_sharded(self.path, holder)
        return holder["model"][name]


def parse_weights(text: str | None, n: int) -> list[float]:
    """`--weights w1,w2,...` as numbers (equal weights when None), normalised to sum to 1."""
    if text is None:
        return [1.0 / n] * n
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError as e:
        raise DataError(f"--weights {text!r}: expected comma-separated numbers, one per checkpoint ({e})") from e
    return normalise_weights(weights, n, f"--weights {text!r}")


def normalise_weights(weights: list[float], n: int, what: str = "weights") -> list[float]:
    """`weights` checked (one per checkpoint, finite, 0 or more, not all 0) and scaled to sum to 1, so a caller of
    `average_checkpoints` giving [1, 1] gets the mean, not the sum. Divided by the largest first, so huge weights
    (1e308) do not overflow the sum to inf and make every weight 0."""
    if len(weights) != n:
        raise DataError(f"{what}: {len(weights)} weights for {n} checkpoints; give one per checkpoint")
    if any(not math.isfinite(w) or w < 0 for w in weights) or max(weights, default=0.0) <= 0:
        raise DataError(f"{what}: weights must be finite, 0 or more, and not all 0")
    largest = max(weights)
    scaled = [w / largest for w in weights]
    total = sum(scaled)
    return [w / total for w in scaled]


def _open(spec: str) -> _Parent:
    path = localize(spec, Dist(0, 1, 0, torch.device("cpu"))) if is_remote(spec) else Path(spec).expanduser()
    kind = checkpoint_kind(path)
    check_files(path, weights_only=True)  # against checksums.json; a sharded one's metadata read safely
    config = read_config(path)
    if config.relora.rank is not None:
        raise DataError(
            f"{spec}: a ReLoRA run's checkpoint (relora.rank {config.relora.rank}); its adapters are not plain "
            "weights: unshard it first (its model.pt holds the merged weights)"
        )
    if kind == "unsharded":
        state = torch.load(path / MODEL_FILE, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(state, dict):
            raise DataError(f"{path / MODEL_FILE}: expected a dict of tensors, got {type(state).__name__}")
        tensors = {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    else:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        stored = safety.read_metadata(path / DCP_METADATA).state_dict_metadata
        tensors = {
            k.removeprefix("model."): (tuple(m.size), m.properties.dtype)
            for k, m in stored.items()
            if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
        }
    if config.model.weight_tying:
        tensors.pop(TIED, None)
    return _Parent(spec, path, kind, read_trainer_state(path), config, tensors)


def _check_same(first: _Parent, other: _Parent) -> None:
    """Refuse parents of different architectures, naming the first config key or tensor that differs."""
    a, b = dataclasses.asdict(first.config.model), dataclasses.asdict(other.config.model)
    for key in [f.name for f in dataclasses.fields(ModelConfig)]:
        if key in _HOW_IT_RUNS:
            continue
        if a[key] != b[key]:
            raise DataError(
                f"{other.given}: model.{key} is {b[key]!r}, but {first.given} has {a[key]!r}; a soup averages "
                "checkpoints of one architecture"
            )
    missing = sorted(set(first.tensors) - set(other.tensors))
    extra = sorted(set(other.tensors) - set(first.tensors))
    if missing or extra:
        name, where = (missing[0], "lacks") if missing else (extra[0], "has, and the first checkpoint lacks,")
        raise DataError(f"{other.given}: {where} tensor {name}; a soup averages checkpoints of one architecture")
    for name, (shape, _) in first.tensors.items():
        if other.tensors[name][0] != shape:
            raise DataError(
                f"{other.given}: tensor {name} has shape {list(other.tensors[name][0])}, but {first.given}'s has "
                f"{list(shape)}; a soup averages checkpoints of one architecture"
            )


def average_checkpoints(checkpoints: list[str], destination: str | Path, weights: list[float] | None = None) -> Path:
    """Write the weighted mean (`weights`, normalised to sum to 1; equal when None) of the model weights of
    `checkpoints` (directories or URLs) to `destination`, a local unsharded checkpoint; return its path."""
    # a Path collapses s3://b/x to s3:/b/x, so the scheme is matched with one slash or two
    if is_remote(str(destination)) or re.match(r"(s3|gs|gcs|https?):/", str(destination)):
        raise DataError(f"--destination {destination}: a soup is written to a local directory; copy it up after")
    dest = Path(destination).expanduser()
    if len(checkpoints) < 2:
        raise DataError(f"a soup needs two checkpoints or more, got {len(checkpoints)}")
    weights = weights if weights is not None else [1.0] * len(checkpoints)
    weights = normalise_weights(list(weights), len(checkpoints))
    refuse_existing(dest)
    parents = [_open(spec) for spec in checkpoints]
    for other in parents[1:]:
        _check_same(parents[0], other)
    first = parents[0]
    model = first.config.model
    names = list(first.tensors)
    tied = model.weight_tying and "embeddings.weight" in first.tensors
    with atomic_directory(dest) as tmp:
        shapes = {name: torch.Size(first.tensors[name][0]) for name in names}

        def mean_of(name: str) -> torch.Tensor:
            mean = torch.zeros(shapes[name], dtype=torch.float32)
            for parent, w in zip(parents, weights, strict=True):
                mean.add_(parent.read(name).to(torch.float32), alpha=w)
            return mean

        stream_model_file(tmp / MODEL_FILE, shapes, mean_of, tied)
        written = Recorder(tmp)
        written.add_file(MODEL_FILE)
        cfg = dataclasses.replace(
            first.config,
            run_name=dest.name,
            save_folder=f"runs/{dest.name}-finetune",
            load_path=str(dest.resolve()),
            reset_trainer_state=True,
            reset_optimizer_state=None,
            restore_dataloader=True,
        )
        save_config(cfg, tmp / CONFIG)
        written.add_file(CONFIG)
        if (first.path / TOKENIZER_FILE).is_file():
            written.copy(first.path / TOKENIZER_FILE, TOKENIZER_FILE)
        lineage = [
            parent_record("soup", p.given, p.given, p.path, p.state, weight=w)
            for p, w in zip(parents, weights, strict=True)
        ]
        state = TrainerState(step=0, run_name=dest.name, sequence_length=model.max_sequence_length, lineage=lineage)
        written.finish(TRAINER_STATE, state.to_bytes())
    return dest


def stream_model_file(
    path: Path, shapes: dict[str, torch.Size], make: Callable[[str], torch.Tensor], tied: bool = False
) -> None:
    """Write model.pt (a `torch.save` of the fp32 state dict, as the trainer writes it) one tensor at a time:
    `make(name)` gives each tensor when its turn comes and it is dropped once written, so memory holds one
    tensor, not the model. With `tied`, lm_head.weight is stored as embeddings.weight, one tensor."""
    offsets = _write_skeleton(path, shapes, tied)
    bar = progress_bar(desc=path.name, total=len(shapes), unit=" tensors", delay=1.0)
    with open(path, "r+b") as out, bar:
        for name in shapes:
            tensor = make(name).to(torch.float32).contiguous()
            if tensor.shape != shapes[name]:
                raise ValueError(f"{name}: made {list(tensor.shape)}, expected {list(shapes[name])}")
            out.seek(offsets[name])
            out.write(tensor.numpy().data)
            del tensor
            bar.update()


def _write_skeleton(path: Path, shapes: dict[str, torch.Size], tied: bool) -> dict[str, int]:
    """model.pt with every tensor's place but none of its bytes (`skip_data`; `torch.empty` touches no memory),
    and the byte offset of each tensor's storage in the file. The offsets are read back from the zip records
    and checked against a memory-mapped load of the file: each tensor must start at its own record."""
    state: dict[str, torch.Tensor] = {name: torch.empty(shape, dtype=torch.float32) for name, shape in shapes.items()}
    if tied:
        state[TIED] = state["embeddings.weight"]
    with torch.serialization.skip_data():
        torch.save(state, path)
    del state
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        records: list[int] = []
        for info in z.infolist():
            if "/data/" in info.filename and not info.filename.endswith("/"):
                f.seek(info.header_offset)
                name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
                records.append(info.header_offset + 30 + name_len + extra_len)
    loaded = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    pointers = {name: loaded[name].untyped_storage().data_ptr() for name in shapes}
    base = min(pointers.values()) - min(records)
    offsets = {name: ptr - base for name, ptr in pointers.items()}
    if sorted(set(offsets.values())) != sorted(records) or any(loaded[n].storage_offset() for n in shapes):
        raise DataError(f"{path}: this torch's file layout is not the expected one; the soup cannot be written")
    del loaded
    return offsets
