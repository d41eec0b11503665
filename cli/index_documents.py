"""`olmo-data index-documents`: the range-readable document index of token files' metadata, written once."""

from __future__ import annotations

from typing import Any

import click

from olmo_cli.options import Command, progress_option


@click.command("index-documents", cls=Command)
@click.argument("paths", nargs=-1, required=True)
@click.option("--cache", "to_cache", is_flag=True, help="Write into the local cache instead of beside the metadata.")
@click.option(
    "--out",
    "out_dir",
    default=None,
    metavar="DIR",
    help="Write into the local directory DIR instead (part-N.docs.idx: to upload beside remote metadata).",
)
@click.option("--force", is_flag=True, help="Rewrite indexes that are there and current.")
@click.option(
    "--sample-every",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Sample every K-th document in the index's head (a larger K: a smaller head, larger blocks per lookup).",
)
@progress_option
def index_documents(
    paths: tuple[str, ...], to_cache: bool, out_dir: str | None, force: bool, sample_every: int, progress: bool | None
) -> None:
    """Write the document index of each token file's tokenize metadata (`part-N.csv.gz` -> `part-N.docs.idx`), so
    that finding an instance's documents reads a few byte ranges of it instead of downloading the whole metadata.

    PATHS are metadata files (.csv.gz), token files (.npy: their metadata beside them or in their manifest),
    globs, or s3:// and http(s):// URLs. Local metadata gets its index beside it. Remote storage is only read by
    this toolkit: a remote file's index goes into the local cache ($OLMO_DATA_CACHE: lookups on this machine find
    it), or with --out DIR into DIR, to upload beside the metadata (`aws s3 cp DIR/ s3://bucket/tokens/
    --recursive`). An index that records the metadata's current size is kept (--force rewrites it). Lookups use
    an index wherever they find one, and the whole metadata where there is none.

    \b
    Examples:
      olmo-data index-documents runs/demo/tokens/*.csv.gz
      olmo-data index-documents 's3://bucket/tokens/*.npy' --out indexes/
      olmo-data index-documents https://host/tokens/part-00000-00000.csv.gz --cache
    """
    from olmo_data.dataset import DocIndex
    from olmo_data.display import progress_bar
    from olmo_data.errors import DataError
    from olmo_data.io import expand_patterns, is_remote

    if to_cache and out_dir:
        raise DataError("--cache and --out DIR: choose one place to write the indexes")
    docs = DocIndex()
    metadata = []
    for pattern in paths:
        globbed = any(c in pattern for c in "*?[")
        for path in expand_patterns([pattern]):
            if path.endswith(".npy"):
                found = docs.metadata_of(path)
                if found is None and not globbed:
                    raise DataError(f"{path}: a token file without metadata (no .csv.gz beside it or in its manifest)")
                metadata.extend([found] if found else [])
            elif path.endswith(".csv.gz") or (is_remote(path) and not globbed):
                metadata.append(path)
            elif not globbed:  # (a glob's other files, manifest.json and the like: not asked for)
                raise DataError(f"{path}: neither tokenize metadata (.csv.gz) nor a token file (.npy)")
    if not metadata:
        raise DataError(f"{' '.join(paths)}: no tokenize metadata (.csv.gz) among these files")
    metadata = list(dict.fromkeys(metadata))
    remote = [m for m in metadata if is_remote(m)]
    where = out_dir or ("cache" if to_cache else "beside")
    if remote and where == "beside":
        click.echo(
            f"note: {len(remote)} remote metadata file(s): remote storage is only read, so their indexes go into the "
            "local cache (found by lookups on this machine); --out DIR writes them to upload beside the metadata",
            err=True,
        )
    written = skipped = total = 0
    with progress_bar(desc="indexing documents", total=len(metadata), unit=" files", progress=progress) as bar:

        def done(w: Any) -> None:  # a WrittenIndex
            nonlocal written, skipped, total
            skipped, written, total = skipped + w.skipped, written + (not w.skipped), total + w.bytes
            bar.update(1)

        if where == "beside":
            docs.write_files([m for m in metadata if not is_remote(m)], "beside", force=force,
                             sample_every=sample_every, on_done=done)  # fmt: skip
            docs.write_files(remote, "cache", force=force, sample_every=sample_every, on_done=done)
        else:
            docs.write_files(metadata, where, force=force, sample_every=sample_every, on_done=done)
    place = "the local cache" if where == "cache" else out_dir if out_dir else "beside the metadata"
    if remote and where == "beside":
        place += " (remote ones: the local cache)"
    click.echo(f"{written} index file(s) written, {skipped} current already kept ({total / 1e6:.1f} MB), {place}")
