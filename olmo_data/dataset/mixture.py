"""Mixtures: several tokenized sources combined at instance level into one dataset, by share or token budget.

A mixture spec (YAML) names sources, each a token directory or a list of token files, with either a `share` of
the mix's tokens or an absolute `tokens` budget. Each source is cut into instances exactly like an unmixed
dataset, then down-sampled (instances drawn without replacement) or repeated (whole copies, plus a draw for
the remainder) to its target. Selection is by instance so a mix never splits an instance; it is deterministic
given the seed, and the random stream of a source depends on the seed and its position only.

`olmo-data mix SPEC --destination DIR` writes `DIR/mix.json` (the mix manifest) and, per source, its selected
instance ids as `DIR/<source>.ids.npy` (sorted int64, a standard .npy so it memory-maps). The instance index,
the trainer and `inspect-batch` all open a mix through `olmo_data.dataset.open_dataset(mix=DIR)`, which reads
it back with `load_mix`; the mixed dataset's instances are the selections, source after source, so a data order
over it works exactly as over plain token files.

Spec keys:
  seed:            int (default 0)
  sequence_length: int (instances are cut at this length; the trainer's model.max_sequence_length must match)
  total_tokens:    optional: the mix's size in tokens when sources give shares (default: the largest mix in
  which
                   no source is repeated)
  dtype:           optional, for token files without a manifest
  sources:         [{name, paths: [dir or file, ...], share: float | tokens: int, label_mask_paths: [...]}]
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from olmo_data import __version__
from olmo_data.dataset.token_files import TokenFile, token_file, token_files
from olmo_data.errors import DataError
from olmo_data.io import atomic_path, is_remote, read_yaml, sha256_file, write_json_atomic

MIX_FORMAT = "olmo-data.mix"
MIX_VERSION = 1
MIX_MANIFEST = "mix.json"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class SourceSpec:
    name: str
    paths: list[str]
    share: float | None
    tokens: int | None
    label_mask_paths: list[str] | None


@dataclass(frozen=True)
class MixSpec:
    seed: int
    sequence_length: int
    sources: list[SourceSpec]
    total_tokens: int | None = None
    dtype: str | None = None


def _number(value: Any, where: str, kind: type) -> Any:
    try:
        number = float(value) if kind is float else int(float(value))  # YAML reads 1e9 as a string
    except (TypeError, ValueError) as e:
        raise DataError(f"{where}: expected a number, got {value!r}") from e
    if number <= 0:
        raise DataError(f"{where}: must be positive, got {value!r}")
    return number


def _path_list(value: Any, where: str) -> list[str]:
    """A YAML value that lists paths: one string or a list of strings (anything else would be misread)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise DataError(f"{where}: expected a path or a list of paths (strings), got {value!r}")
    return list(value)


def _seed(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"{where}: seed: expected a non-negative integer, got {value!r}")
    return value


def parse_spec(spec: dict[str, Any], where: str = "mix spec") -> MixSpec:
    """Validate a mixture spec (a dict as read from YAML) and name the key at fault in any error."""
    if not isinstance(spec, dict):
        raise DataError(f"{where}: expected a mapping with keys seed, sequence_length, sources")
    unknown = set(spec) - {"seed", "sequence_length", "sources", "total_tokens", "dtype"}
    if unknown:
        raise DataError(
            f"{where}: unknown keys {sorted(unknown)}; expected seed, sequence_length, sources, total_tokens, dtype"
        )
    if "sequence_length" not in spec:
        raise DataError(f"{where}: sequence_length is missing (the trainer's model.max_sequence_length)")
    raw_sources = spec.get("sources")
    if not isinstance(raw_sources, list) or not raw_sources:
        raise DataError(f"{where}: sources must be a non-empty list of {{name, paths, share | tokens}}")
    sources: list[SourceSpec] = []
    for i, s in enumerate(raw_sources):
        here = f"{where}: sources[{i}]"
        if not isinstance(s, dict):
            raise DataError(f"{here}: expected a mapping with name, paths, and share or tokens")
        unknown = set(s) - {"name", "paths", "share", "tokens", "label_mask_paths"}
        if unknown:
            raise DataError(
                f"{here}: unknown keys {sorted(unknown)}; expected name, paths, share | tokens, label_mask_paths"
            )
        name = str(s.get("name", ""))
        if not _NAME_RE.match(name):
            raise DataError(f"{here}: name {name!r} must be letters, digits, '_', '-' or '.' (it names a file)")
        if name in {src.name for src in sources}:
            raise DataError(f"{here}: source name {name!r} is used twice")
        if not s.get("paths"):
            raise DataError(f"{here} ({name}): paths is missing or empty; list token directories or files")
        paths = _path_list(s["paths"], f"{here} ({name}).paths")
        if ("share" in s) == ("tokens" in s):
            raise DataError(f"{here} ({name}): give exactly one of share (fraction of the mix) or tokens (a budget)")
        share = _number(s["share"], f"{here} ({name}).share", float) if "share" in s else None
        tokens = _number(s["tokens"], f"{here} ({name}).tokens", int) if "tokens" in s else None
        masks = s.get("label_mask_paths")
        masks = _path_list(masks, f"{here} ({name}).label_mask_paths") if masks else None
        sources.append(SourceSpec(name, paths, share, tokens, masks))
    kinds = {s.share is None for s in sources}
    if len(kinds) > 1:
        raise DataError(
            f"{where}: some sources give a share and others a token budget; use one kind for all "
            "(shares with total_tokens give budgets)"
        )
    if sources[0].share is not None:
        total_share = sum(s.share or 0.0 for s in sources)
        if abs(total_share - 1.0) > 1e-6:
            raise DataError(f"{where}: the shares add up to {total_share:g}, not 1; fix the sources' share values")
    elif "total_tokens" in spec:
        raise DataError(f"{where}: total_tokens only applies to shares; the token budgets already set the size")
    total = _number(spec["total_tokens"], f"{where}: total_tokens", int) if "total_tokens" in spec else None
    dtype = spec.get("dtype")
    if dtype is not None and dtype not in ("uint16", "uint32"):
        raise DataError(f"{where}: dtype: expected uint16 or uint32, got {dtype!r}")
    return MixSpec(
        seed=_seed(spec.get("seed", 0), where),
        sequence_length=_number(spec["sequence_length"], f"{where}: sequence_length", int),
        sources=sources,
        total_tokens=total,
        dtype=dtype,
    )


def load_spec(path: str) -> MixSpec:
    return parse_spec(read_yaml(path, "mix spec"), where=path)


def select_instances(available: int, target: int, rng: np.random.Generator) -> np.ndarray:
    """`target` instance ids out of `available`: sorted, each id used floor(target/available) times, plus a
    draw without replacement for the remainder, so a repeated source is repeated as evenly as possible."""
    copies, rest = divmod(target, available)
    extra = rng.choice(available, size=rest, replace=False) if rest else np.zeros(0, dtype=np.int64)
    ids = np.concatenate([np.repeat(np.arange(available, dtype=np.int64), copies), extra.astype(np.int64)])
    ids.sort(kind="stable")
    return ids


def _targets(spec: MixSpec, available: list[int]) -> list[int]:
    L = spec.sequence_length
    if spec.sources[0].tokens is not None:
        return [max(1, round((s.tokens or 0) / L)) for s in spec.sources]
    shares = [s.share or 0.0 for s in spec.sources]
    if spec.total_tokens is not None:
        total_instances = spec.total_tokens / L
    else:  # the largest mix that repeats nothing: the scarcest source (relative to its share) is used whole
        total_instances = min(n / sh for n, sh in zip(available, shares, strict=True))
    targets = [max(1, round(sh * total_instances)) for sh in shares]
    if spec.total_tokens is None:
        targets = [min(t, n) for t, n in zip(targets, available, strict=True)]
    return targets


def build_mix(spec: MixSpec | str, destination: str) -> dict[str, Any]:
    """Select each source's instances and write the mix manifest and selections; return the manifest. `spec` is a
    checked `MixSpec`, or the path of a YAML spec (read with `load_spec`).

    The old manifest is removed first, the selections are written next and the manifest last, so a directory
    with `mix.json` is complete: an interrupted rebuild leaves no manifest rather than the old one describing
    new selections (`load_mix` also checks each selection against its recorded sha256).
    """
    if isinstance(spec, str):
        spec = load_spec(spec)
    if is_remote(destination):
        raise DataError(f"{destination}: write the mix to a local directory (copy it to remote storage after)")
    dest = Path(destination)
    L = spec.sequence_length
    files_per_source: list[list[TokenFile]] = []
    available: list[int] = []
    for s in spec.sources:
        try:
            files = token_files(s.paths, s.label_mask_paths, spec.dtype, spec.sequence_length)
        except DataError as e:
            raise DataError(f"source {s.name}: {e}") from e
        n = sum(f.num_tokens // L for f in files)
        if n == 0:
            raise DataError(
                f"source {s.name}: its files hold no complete instance of {L} tokens; add data or drop the source"
            )
        files_per_source.append(files)
        available.append(n)
    targets = _targets(spec, available)
    realized_total = sum(targets) * L
    requested_total = (
        (spec.total_tokens or realized_total)
        if spec.sources[0].share is not None
        else sum(s.tokens or 0 for s in spec.sources)
    )
    (dest / MIX_MANIFEST).unlink(missing_ok=True)
    sources_out = []
    for i, (s, files, n, k) in enumerate(zip(spec.sources, files_per_source, available, targets, strict=True)):
        ids = select_instances(n, k, np.random.default_rng([spec.seed, i]))
        name = f"{s.name}.ids.npy"
        with atomic_path(dest / name) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, ids)
            digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        requested_tokens = s.tokens if s.tokens is not None else round((s.share or 0.0) * requested_total)
        sources_out.append(
            {
                "name": s.name,
                "paths": s.paths,
                "files": [
                    {"path": f.path, "dtype": f.dtype, "tokens": f.num_tokens}
                    | ({"label_mask": f.label_mask_path} if f.label_mask_path else {})
                    | ({"metadata": f.metadata_path} if f.metadata_path else {})
                    for f in files
                ],
                "available_instances": n,
                "available_tokens": n * L,
                "selected_instances": k,
                "selection": name,
                "selection_sha256": digest,
                "repeats": round(k / n, 6),
                "requested_tokens": int(requested_tokens),
                "requested_share": round(s.share if s.share is not None else requested_tokens / requested_total, 6),
                "realized_tokens": k * L,
                "realized_share": round(k * L / realized_total, 6),
            }
        )
    manifest = {
        "format": MIX_FORMAT,
        "version": MIX_VERSION,
        "tool_version": __version__,
        "seed": spec.seed,
        "sequence_length": L,
        "total_tokens": spec.total_tokens,
        "sources": sources_out,
        "totals": {"instances": sum(targets), "tokens": realized_total},
    }
    write_json_atomic(dest / MIX_MANIFEST, manifest)
    return manifest


def mix_report(manifest: dict[str, Any]) -> str:
    """A table of requested vs realized shares and tokens, and how often each source is repeated."""
    rows = [("source", "requested", "realized", "tokens", "available", "repeats")]
    for s in manifest["sources"]:
        rows.append(
            (
                s["name"],
                f"{s['requested_share']:.2%}",
                f"{s['realized_share']:.2%}",
                f"{s['realized_tokens']:,}",
                f"{s['available_tokens']:,}",
                f"{s['repeats']:.3f}x",
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(v.ljust(w) if c == 0 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    t = manifest["totals"]
    lines.append(
        f"total: {t['instances']:,} instances of {manifest['sequence_length']} tokens = {t['tokens']:,} tokens"
    )
    return "\n".join(lines)


def read_mix_manifest(path: str) -> tuple[dict[str, Any], str]:
    """(manifest, directory) of a mix given its directory or its mix.json."""
    path = os.path.expanduser(str(path))
    if is_remote(path):
        raise DataError(f"{path}: mix manifests are read from local disk; copy the mix directory here first")
    file = path if path.endswith(".json") and not os.path.isdir(path) else os.path.join(path, MIX_MANIFEST)
    if not os.path.exists(file):
        raise DataError(f"{file}: mix manifest not found; write it with `olmo-data mix SPEC --destination DIR`")
    try:
        with open(file) as f:
            manifest = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{file}: not valid JSON ({e}); re-run `olmo-data mix`") from e
    if not isinstance(manifest, dict) or manifest.get("format") != MIX_FORMAT:
        raise DataError(f"{file}: not an olmo-data mix manifest (format != {MIX_FORMAT!r})")
    if manifest.get("version", 0) > MIX_VERSION:
        raise DataError(f"{file}: mix manifest version {manifest['version']} is newer than this tool; upgrade")
    return manifest, os.path.dirname(os.path.abspath(file))


@functools.lru_cache(maxsize=256)
def _selection_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a selection file, hashed once per version of it (the trainer and inspect-batch reopen mixes)."""
    return sha256_file(path)


@dataclass(frozen=True)
class LoadedMix:
    """A mix read back and checked, as the instance index needs it (`olmo_data.dataset.instances.open_mix`)."""

    files: list[TokenFile]  # every source's token files, source after source
    selections: list[np.ndarray]  # per source: its selected instance ids within its files (sorted, memory-mapped)
    file_ranges: list[tuple[int, int]]  # per source: its files, [lo, hi) in `files`
    identity: dict[str, Any]  # what the data fingerprint covers: the seed and each selection's sha256
    manifest_path: str


def load_mix(path: str, *, sequence_length: int, dtype: str | None = None) -> LoadedMix:
    """A mix's token files and selections, checked against its manifest: the sequence length it was cut at, the
    dtypes, and each selection's sha256, length and range (so a rebuilt or changed source is refused, not misread).
    """
    manifest, directory = read_mix_manifest(path)
    file = os.path.join(directory, MIX_MANIFEST)
    if int(manifest["sequence_length"]) != int(sequence_length):
        raise DataError(
            f"{file}: the mix was built for sequence_length {manifest['sequence_length']} but "
            f"{sequence_length} was asked for; set model.max_sequence_length to "
            f"{manifest['sequence_length']} or "
            "re-run `olmo-data mix` with the new length"
        )
    files: list[TokenFile] = []
    selections: list[np.ndarray] = []
    ranges: list[tuple[int, int]] = []
    for s in manifest["sources"]:
        lo = len(files)
        for f in s["files"]:
            if dtype is not None and dtype != f["dtype"]:
                raise DataError(
                    f"{f['path']}: dtype {dtype} was requested but the mix manifest {file} says "
                    f"{f['dtype']}; drop data.dtype or fix it to {f['dtype']}"
                )
            files.append(token_file(f["path"], f["dtype"], int(f["tokens"]), f.get("label_mask"), f.get("metadata")))
        ranges.append((lo, len(files)))
        sel_path = os.path.join(directory, s["selection"])
        try:
            sel = np.load(sel_path, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise DataError(
                f"{sel_path}: cannot read the selection of source {s['name']} ({e}); re-run `olmo-data mix`"
            ) from e
        st = os.stat(sel_path)
        digest = _selection_sha256(sel_path, st.st_size, st.st_mtime_ns)
        if digest != s["selection_sha256"]:
            raise DataError(
                f"{sel_path}: the selection of source {s['name']} has sha256 {digest[:16]}..., not the "
                f"{str(s['selection_sha256'])[:16]}... that {file} records; it was rewritten after the mix was "
                "built (an interrupted rebuild?): rebuild the mix with `olmo-data mix SPEC --destination DIR`"
            )
        if len(sel) != int(s["selected_instances"]):
            raise DataError(
                f"{sel_path}: holds {len(sel)} ids but {file} says {s['selected_instances']}; re-run `olmo-data mix`"
            )
        if sel.ndim != 1 or sel.dtype.kind not in "iu":
            raise DataError(f"{sel_path}: a selection is a 1-D array of instance ids, not {sel.dtype} {sel.shape}")
        if len(sel) and (int(sel[0]) < 0 or bool(np.any(sel[1:] < sel[:-1]))):
            raise DataError(
                f"{sel_path}: the selection of source {s['name']} is not sorted instance ids from 0 (an id "
                "below 0 or out of order would read another source's instances); re-run `olmo-data mix`"
            )
        source_instances = sum(f.num_tokens // sequence_length for f in files[lo:])
        if len(sel) and int(sel[-1]) >= source_instances:
            raise DataError(
                f"{sel_path}: selects instance {int(sel[-1])} but source {s['name']} now has "
                f"{source_instances}; its token files changed since the mix was built: re-run "
                "`olmo-data mix`"
            )
        selections.append(sel)
    identity = {
        "seed": manifest["seed"],
        "sources": [{"name": s["name"], "selection_sha256": s["selection_sha256"]} for s in manifest["sources"]],
    }
    return LoadedMix(files, selections, ranges, identity, file)
