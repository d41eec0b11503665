"""`olmo-data sample`: deterministic document sampling into dolma-format shards.

`fraction` keeps a document when a hash of (seed, document id) falls below the fraction, so the decision depends on
nothing but the document: the same documents are kept whatever the process count, machine or file order, and a
larger fraction keeps a superset of a smaller one. `every` keeps lines 1, K+1, 2K+1, ... of each file (the first
of every K), which is cheap and needs no ids.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from olmo_data.display import progress_bar
from olmo_data.documents import BadDocuments, ReadPosition, file_format, read_documents
from olmo_data.errors import DataError
from olmo_data.io import atomic_path, expand_patterns, file_size, gzip_writer, open_file

_HASH_SPACE = 2**64


@dataclass
class SampleSummary:
    files: int
    documents_read: int
    documents_kept: int
    skipped_bad: int

    def line(self) -> str:
        share = self.documents_kept / self.documents_read if self.documents_read else 0.0
        return (
            f"kept {self.documents_kept:,} of {self.documents_read:,} documents ({share:.2%}) in {self.files} files; "
            f"skipped {self.skipped_bad:,} bad documents"
        )


def keep_by_hash(doc_id: str, seed: int, fraction: float) -> bool:
    """Whether `fraction`-sampling with `seed` keeps the document `doc_id` (BLAKE2b, machine independent)."""
    digest = hashlib.blake2b(f"{seed}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * _HASH_SPACE


def _open_writer(path: Path, name: str) -> Any:
    """A binary writer to `path` compressed as `name` says, with fixed headers so equal content gives equal bytes."""
    if name.endswith(".gz"):
        return gzip_writer(path)
    if name.endswith((".zst", ".zstd")):
        import zstandard

        return zstandard.ZstdCompressor().stream_writer(open(path, "wb"), closefd=True)  # noqa: SIM115
    return open(path, "wb")  # noqa: SIM115


def sample(
    documents: Sequence[str],
    destination: str | os.PathLike[str],
    *,
    fraction: float | None = None,
    every: int | None = None,
    seed: int = 0,
    text_field: str = "text",
    id_field: str = "id",
    skip_bad_documents: bool = False,
    progress: bool | None = None,
) -> SampleSummary:
    """Write the sampled documents of each input to `destination/<input file name>` (same format), with a bar
    over the inputs' bytes (`olmo_data.display`)."""
    if (fraction is None) == (every is None):
        raise DataError("give exactly one of --fraction and --every")
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise DataError(f"--fraction must be in (0, 1], got {fraction}")
    if every is not None and every < 1:
        raise DataError(f"--every must be a positive integer, got {every}")
    paths = expand_patterns(documents)
    names: dict[str, str] = {}
    for p in paths:
        name = p.rstrip("/").rsplit("/", 1)[-1]
        if name in names:
            raise DataError(f"{p} and {names[name]} have the same file name; sample them into different destinations")
        names[name] = p
    dest = Path(destination)
    summary = SampleSummary(files=0, documents_read=0, documents_kept=0, skipped_bad=0)

    def keep(doc_id: str, line: int) -> bool:
        if fraction is not None:
            return keep_by_hash(doc_id, seed, fraction)
        assert every is not None
        return (line - 1) % every == 0

    written: list[Path] = []
    created = not dest.exists()
    try:
        with progress_bar(desc="sample", unit="B", progress=progress) as bar:
            sizes = [file_size(p) for p in paths] if not bar.disable else [0] * len(paths)
            bar.total = sum(sizes) or None
            done = 0
            for path, size in zip(paths, sizes, strict=True):
                _sample_file(path, dest, keep, text_field, id_field, skip_bad_documents, summary, written, bar, done)
                done += size
                bar.update(done - bar.n)
    except BaseException:  # bad input or interruption: remove what this call wrote, so no partial output stays
        for out in written:
            out.unlink(missing_ok=True)
        if created and dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()  # the directory too, when this call made it
        raise
    return summary


def _sample_file(
    path: str,
    dest: Path,
    keep: Any,
    text_field: str,
    id_field: str,
    skip_bad_documents: bool,
    summary: SampleSummary,
    written: list[Path],
    bar: Any = None,
    start: int = 0,
) -> None:
    """Sample one input into `dest/<its name>`, adding to `summary` and recording the output in `written`; the
    bar follows the bytes read (from `start`, the inputs before it), where the reader knows them."""
    bad = BadDocuments() if skip_bad_documents else None
    final = dest / path.rstrip("/").rsplit("/", 1)[-1]
    with atomic_path(final) as tmp:
        if file_format(path) == "parquet":
            read, kept = _sample_parquet(path, tmp, keep, text_field, id_field, bad)
        else:
            read = kept = 0
            position = ReadPosition()
            with _open_writer(tmp, final.name) as out:
                for doc in read_documents(
                    path, text_field=text_field, id_field=id_field, bad=bad, keep_raw=True, position=position
                ):
                    read += 1
                    if bar is not None and read % 4096 == 0 and (at := position.bytes()) is not None:
                        bar.update(start + at - bar.n)
                    if keep(doc.id, doc.line):
                        assert doc.raw is not None
                        out.write(doc.raw if doc.raw.endswith(b"\n") else doc.raw + b"\n")
                        kept += 1
    written.append(final)
    summary.files += 1
    summary.documents_read += read
    summary.documents_kept += kept
    summary.skipped_bad += bad.count if bad else 0


def _sample_parquet(
    path: str, out: Path, keep: Any, text_field: str, id_field: str, bad: BadDocuments | None
) -> tuple[int, int]:
    """Keep whole rows (every column) of a parquet file whose document passes `keep`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keep_rows = [
        doc.line - 1
        for doc in read_documents(path, text_field=text_field, id_field=id_field, bad=bad)
        if keep(doc.id, doc.line)
    ]
    with open_file(path, "rb", compression="disable") as f:
        table = pq.read_table(f)
    pq.write_table(table.take(pa.array(keep_rows, type=pa.int64())), out)
    return table.num_rows, len(keep_rows)
