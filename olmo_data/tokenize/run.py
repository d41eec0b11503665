"""The tokenize driver: `tokenize` and `merge_shards`. It checks the destination against the run it holds (a
rerun reuses finished inputs, another run is refused), hands the inputs not done to the workers, keeps a progress
record per input, and writes the manifest once every input is done (see `olmo_data.tokenize` for the layout)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

from olmo_data import __version__
from olmo_data.dataset import MANIFEST_NAME, MANIFEST_VERSION
from olmo_data.errors import DataError, is_disk_full
from olmo_data.io import expand_patterns, file_size, remove_stale_temporaries, write_json_atomic
from olmo_data.tokenize.options import (
    InputResult,
    ResolvedOptions,
    Shard,
    TokenizeOptions,
    TokenizeSummary,
    recorded_options,
    resolve_options,
)
from olmo_data.tokenize.workers import run_tasks
from olmo_data.tokenizer import Tokenizer, load_tokenizer

PROGRESS_DIR = ".progress"


def tokenize(
    documents: Sequence[str],
    destination: str | os.PathLike[str],
    options: TokenizeOptions,
    *,
    processes: int = 1,
    progress: bool | None = None,
    shard: Shard | None = None,
) -> TokenizeSummary:
    """Tokenize every document of the input files into `destination`; see `olmo_data.tokenize` for the layout.

    A rerun into the same destination with the same inputs and options reuses the inputs already done. Different
    inputs or options are refused, so one directory never mixes two runs. On bad input, this call's own outputs
    are removed (earlier complete inputs are kept for a rerun) and `DataError` names the file and line. On any
    other failure (an interrupt; a full disk, reported as a DataError naming the destination) the inputs finished
    are kept too, and only unfinished inputs' files and temporaries are removed.

    With `shard`, only that shard's inputs are tokenized, while other shards may write into the same destination
    at the same time; the manifest is written by the shard that finds every input done when it ends.
    """
    start = time.perf_counter()
    if processes < 1:
        raise DataError(f"--processes must be at least 1, got {processes}")
    run = _Run.open(documents, destination, options, must_exist=False)
    dest, progress_dir, inputs = run.dest, run.dest / PROGRESS_DIR, run.inputs
    mine = [i for i in range(len(inputs)) if shard is None or shard.takes(i)]
    todo: list[tuple[int, str, int, str]] = []
    written_now: list[int] = []
    reused = 0
    tasks = None
    try:
        progress_dir.mkdir(exist_ok=True)
        if shard is None:  # alone in the destination: whatever a killed run left is stale
            remove_stale_temporaries(dest)
        write_json_atomic(progress_dir / "run.json", run.record)  # every shard writes the same bytes
        done = _completed(dest, inputs)
        results = {i: done[i] for i in mine if i in done}
        for i in mine:
            if i not in results:
                _remove_parts_of(dest, i)  # parts (and temporaries) of an unfinished earlier try
                todo.append((i, str(inputs[i]["path"]), int(inputs[i]["size"]), str(dest)))
        reused = len(results)
        sizes = [int(inputs[i]["size"]) for i in mine]
        total, reused_bytes = sum(sizes), sum(int(inputs[i]["size"]) for i in results)
        tasks = run_tasks(todo, run.resolved, run.tok, processes, progress, len(mine), reused, total, reused_bytes)
        for result in tasks:
            write_json_atomic(progress_dir / f"{result.index:05d}.json", asdict(result))
            results[result.index] = result
            written_now.append(result.index)
        if shard is not None:  # the others' inputs too, as their records say now that this shard's are written
            results = {**_completed(dest, inputs), **results}
        pending = len(inputs) - len(results)
        if not pending:
            write_json_atomic(dest / MANIFEST_NAME, run.manifest([results[i] for i in range(len(inputs))]))
    except BaseException as e:
        if tasks is not None:
            with contextlib.suppress(Exception):
                tasks.close()  # the workers stop (a failed input already did this) before their files go
        bad_input = isinstance(e, DataError)
        _clean_up(run, todo, [] if bad_input else written_now, alone=shard is None)
        if is_disk_full(e):
            n = reused + len(written_now)
            kept = f"{n} finished input{' is' if n == 1 else 's are'} kept and reused" if n else "nothing is kept"
            raise DataError(f"{dest}: the disk is full ({e}); free space there and rerun: {kept}") from e
        raise

    summary = run.summary([results[i] for i in mine], reused, start)
    summary.shard, summary.inputs_pending = (None if shard is None else str(shard)), pending
    return summary


def merge_shards(
    documents: Sequence[str], destination: str | os.PathLike[str], options: TokenizeOptions
) -> TokenizeSummary:
    """Write the manifest of a destination that shards (`tokenize(..., shard=...)`) filled, once all are done.

    The last shard to finish does this by itself; this is the step to run after all of them (a job that depends on
    the array, say) when that is not certain: a shard killed after its last input, or a file system whose listings
    lag behind other machines' writes. Tokenizes nothing; refuses, naming them, while inputs are missing.
    """
    start = time.perf_counter()
    run = _Run.open(documents, destination, options, must_exist=True)
    dest, inputs = run.dest, run.inputs
    results = _completed(dest, inputs)
    missing = [i for i in range(len(inputs)) if i not in results]
    if missing:
        named = ", ".join(f"#{i} {inputs[i]['path']}" for i in missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise DataError(
            f"{dest}: {len(missing)} of {len(inputs)} inputs are not tokenized yet ({named}); rerun the shards "
            f"that take them (input #i belongs to shard i mod N of --shard I/N), then --merge again"
        )
    remove_stale_temporaries(dest)  # every input is done: no shard is writing here
    ordered = [results[i] for i in range(len(inputs))]
    write_json_atomic(dest / MANIFEST_NAME, run.manifest(ordered))
    return run.summary(ordered, len(ordered), start)


@dataclass
class _Run:
    """The inputs, tokenizer and options of one tokenize run into `dest`, checked against what `dest` holds."""

    dest: Path
    created: bool
    inputs: list[dict[str, Any]]
    tok: Tokenizer
    resolved: ResolvedOptions
    record: dict[str, Any]

    @classmethod
    def open(
        cls, documents: Sequence[str], destination: str | os.PathLike[str], options: TokenizeOptions, must_exist: bool
    ) -> _Run:
        paths = expand_patterns(documents)
        inputs: list[dict[str, Any]] = [{"path": p, "size": file_size(p)} for p in paths]
        tok = load_tokenizer(options.tokenizer, options.backend)  # type: ignore[arg-type]
        resolved = resolve_options(options, tok)
        dest = Path(destination)
        record = resolved.run_record(inputs)
        if must_exist and not (dest / PROGRESS_DIR / "run.json").is_file():
            raise DataError(f"{dest}: no tokenize run recorded there; run the shards (--shard I/N) first")
        created = not dest.exists()
        dest.mkdir(parents=True, exist_ok=True)
        _check_destination(dest, record)
        return cls(dest, created, inputs, tok, resolved, record)

    def manifest(self, ordered: list[InputResult]) -> dict[str, Any]:
        """What the directory holds, from every input's result in input order: the same bytes however many
        processes or shards produced them."""
        return {
            "format": "olmo-data.tokens",
            "version": MANIFEST_VERSION,
            "tool_version": __version__,
            "dtype": self.resolved.dtype,
            "tokenizer": self.resolved.tokenizer_identity,
            "eos_token_id": self.resolved.eos,
            "bos_token_id": self.resolved.bos,
            "pad_token_id": self.tok.pad_token_id,
            "options": recorded_options(self.resolved.options),
            "inputs": self.inputs,
            "files": [dict(part, input=r.index) for r in ordered for part in r.parts],
            "totals": _totals(ordered),
        }

    def summary(self, results: list[InputResult], reused: int, start: float) -> TokenizeSummary:
        """What this call did (`results`: the inputs it was given, `reused` of them done before it)."""
        return TokenizeSummary(
            destination=str(self.dest),
            files=sum(len(r.parts) for r in results),
            inputs=len(results),
            inputs_reused=reused,
            seconds=time.perf_counter() - start,
            dtype=self.resolved.dtype,
            backend=self.tok.backend,
            bad_examples=[m for r in results for m in r.bad_examples][:5],
            **_totals(results),
        )


class _Totals(TypedDict):
    documents: int
    tokens: int
    skipped_empty: int
    skipped_bad: int


def _totals(results: list[InputResult]) -> _Totals:
    return {
        "documents": sum(r.documents for r in results),
        "tokens": sum(r.tokens for r in results),
        "skipped_empty": sum(r.skipped_empty for r in results),
        "skipped_bad": sum(r.skipped_bad for r in results),
    }


def _check_destination(dest: Path, record: dict[str, Any]) -> None:
    """Refuse a destination that holds output of a different run, saying what differs (inputs, options or
    tokenizer, and which)."""
    run_file = dest / PROGRESS_DIR / "run.json"
    # listed before looking for the run record: a shard starting beside others may see their parts appear, but
    # those come only after the record, which is then found
    leftovers = [p.name for p in dest.iterdir() if p.name.startswith("part-") or p.name == MANIFEST_NAME]
    if run_file.exists():
        try:
            previous = json.loads(run_file.read_text())
            key = previous.get("run_key")
        except (json.JSONDecodeError, AttributeError) as e:
            raise DataError(f"{run_file}: damaged ({e}); delete {dest / PROGRESS_DIR} to start over") from e
        if key != record["run_key"]:
            raise DataError(
                f"{dest}: holds tokenized output of a different run ({_what_differs(previous, record)}); "
                "use an empty destination, or delete this one to start over"
            )
        return
    if leftovers:
        raise DataError(
            f"{dest}: already holds token files ({leftovers[0]}, ...) that this tool did not record; "
            "use an empty destination"
        )


def _what_differs(previous: dict[str, Any], record: dict[str, Any]) -> str:
    before, now = previous.get("parts"), record["parts"]
    if not isinstance(before, dict):  # written by an older version, which recorded only a digest
        return "other inputs, options or tokenizer"
    found = []
    if before.get("inputs") != now["inputs"]:
        gone = [p for p in before.get("inputs", []) if p not in now["inputs"]]
        new = [p for p in now["inputs"] if p not in before.get("inputs", [])]
        detail = "; ".join(
            x for x in (f"not given now: {gone[:2]}" if gone else "", f"new: {new[:2]}" if new else "") if x
        )
        found.append(f"inputs ({detail or 'another order'})")
    for key in ("options", "dtype", "eos", "bos"):
        if before.get(key) != now[key]:
            if isinstance(now[key], dict):
                keys = sorted(
                    k
                    for k in set(before.get(key) or {}) | set(now[key])
                    if (before.get(key) or {}).get(k) != now[key].get(k)
                )
                found.append(f"options {', '.join(keys)}")
            else:
                found.append(f"{key} {before.get(key)} -> {now[key]}")
    if before.get("tokenizer") != now["tokenizer"]:
        found.append(f"tokenizer (sha256 {str(before.get('tokenizer'))[:12]}... -> {now['tokenizer'][:12]}...)")
    return "; ".join(found) or "other inputs, options or tokenizer"


def _completed(dest: Path, inputs: list[dict[str, Any]]) -> dict[int, InputResult]:
    """The inputs done (by this process, an earlier run or another shard): a progress record for the same file
    and size, and all the parts it names."""
    done = {}
    for i, inp in enumerate(inputs):
        result = _load_done(dest / PROGRESS_DIR, i, inp)
        if result is not None and all((dest / p["path"]).exists() for p in result.parts):
            done[i] = result
    return done


def _load_done(progress_dir: Path, index: int, inp: dict[str, Any]) -> InputResult | None:
    record = progress_dir / f"{index:05d}.json"
    if not record.exists():
        return None
    data = json.loads(record.read_text())
    if data.get("path") != inp["path"] or data.get("size") != inp["size"]:
        return None
    return InputResult(**data)


def _clean_up(run: _Run, todo: list[tuple[int, str, int, str]], keep: list[int], alone: bool) -> None:
    """What a failed call leaves in the destination: the inputs in `keep` (finished and recorded, so that a rerun
    reuses them), and what was there before it. After bad input `keep` is empty; after a full disk or an interrupt
    it holds what this call finished. A call alone in the destination that leaves no finished input removes its
    progress folder too (and the destination, if it made it); a shard keeps them, as others may be writing there.

    Never raises: it runs while an error is on its way up, and that error is the one to report.
    """
    dest, progress_dir = run.dest, run.dest / PROGRESS_DIR
    with contextlib.suppress(OSError):
        for index, *_ in todo:
            if index not in keep:
                _remove_parts_of(dest, index)  # its parts, and the temporaries of a worker cut off mid-write
                (progress_dir / f"{index:05d}.json").unlink(missing_ok=True)
        if alone:
            remove_stale_temporaries(dest)
            remove_stale_temporaries(progress_dir)  # a progress record cut off mid-write
            if not any(progress_dir.glob("[0-9]*.json")):  # nothing finished here: nothing to resume
                shutil.rmtree(dest if run.created else progress_dir, ignore_errors=True)


def _remove_parts_of(dest: Path, index: int) -> None:
    """One input's parts, and the temporaries of a killed try at it (only its own: shards may be writing theirs)."""
    for pattern in (f"part-{index:05d}-*", f".tmp-part-{index:05d}-*"):
        for p in dest.glob(pattern):
            p.unlink(missing_ok=True)
