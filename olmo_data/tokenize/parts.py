"""Writing one input's token files: `part-IIIII-KKKKK.npy` and its `.csv.gz` document metadata, as `dolma tokens`
writes them, each under a temporary name until complete."""

from __future__ import annotations

import array
import contextlib
import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from olmo_data.documents import Document
from olmo_data.io import gzip_text_writer


class PartWriter:
    """Appends documents to `part-IIIII-KKKKK.npy` files, starting a new part when the next would overflow.

    Files are written under `.tmp-` names and renamed when each part is complete. A document is never split: one
    larger than `max_tokens` gets a part of its own.
    """

    def __init__(self, dest: Path, input_index: int, dtype: str, max_tokens: int):
        self.dest, self.input_index, self.dtype, self.max_tokens = dest, input_index, dtype, max_tokens
        self.parts: list[dict[str, Any]] = []
        self.tokens = 0
        self.documents = 0
        self._npy: Any = None
        self._csv: io.TextIOWrapper | None = None
        self._writer: Any = None
        self._names: tuple[str, str] = ("", "")

    def _open(self) -> None:
        stem = f"part-{self.input_index:05d}-{len(self.parts):05d}"
        self._names = (f"{stem}.npy", f"{stem}.csv.gz")
        self._npy = open(self.dest / f".tmp-{self._names[0]}", "wb")  # noqa: SIM115
        self._csv = gzip_text_writer(self.dest / f".tmp-{self._names[1]}")
        self._writer = csv.writer(self._csv, lineterminator="\n")
        self.tokens = self.documents = 0

    def close_part(self) -> None:
        if self._npy is None:
            return
        self._npy.close()
        assert self._csv is not None
        self._csv.close()
        for name in self._names:
            os.replace(self.dest / f".tmp-{name}", self.dest / name)
        self.parts.append(
            {"path": self._names[0], "metadata": self._names[1], "documents": self.documents, "tokens": self.tokens}
        )
        self._npy = self._csv = None

    def abort(self) -> None:
        """Drop the open part's temporaries. Never raises: it runs while an error is on its way up (most often a
        full disk, which makes closing fail too, as the buffered bytes cannot be written), and that error is the
        one to report."""
        for f in (self._npy, self._csv):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()  # the file descriptor is released even when the final flush fails
        for name in self._names:
            with contextlib.suppress(OSError):
                (self.dest / f".tmp-{name}").unlink(missing_ok=True)
        self._npy = self._csv = None

    def write(self, flat: array.array[int], lengths: Sequence[int], docs: Sequence[Document], src: str) -> None:
        """Append a batch: `flat` holds the documents' tokens back to back, `lengths[i]` tokens each, in the part's
        dtype (an `array` of its typecode, or any one-dimensional buffer of it: a numpy array too)."""
        with memoryview(flat) as view:  # slices written as they are, without a copy
            pos = 0
            run_start = 0  # start in `flat` of the run of documents not yet written to the open part
            for doc, n in zip(docs, lengths, strict=True):
                if self._npy is None or (self.tokens > 0 and self.tokens + n > self.max_tokens):
                    if self._npy is not None:
                        self._npy.write(view[run_start:pos])
                        self.close_part()
                    self._open()
                    run_start = pos
                self._writer.writerow((self.tokens, self.tokens + n, doc.id, src, doc.line))
                self.tokens += n
                self.documents += 1
                pos += n
            if self._npy is not None and pos > run_start:
                self._npy.write(view[run_start:pos])
