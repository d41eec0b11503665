"""Which instances of a composable run hold which tokens of its files: for `trace` and `stats`.

A composable instance is read from file pieces through any tree of sources (slices, samples that repeat tokens,
packed documents), so the way back from a file's tokens to the instances is a table of every instance's pieces,
built once (one pass over the instances) and then searched: `holding` answers trace's question (every instance
holding a token of a span, once per piece), `held_per_file` and `first_files` stats' (the tokens of each file some
instance holds, each once; the instances counted by the file of their first piece).
"""

from __future__ import annotations

import numpy as np

from olmo_data.olmo_core.composable.instances import InstanceSource


class PieceTable:
    """Every piece of every instance, as arrays: instance number, file, start, end, position in the instance."""

    def __init__(self, sources: list[InstanceSource], paths: list[str]) -> None:
        file_of = {p: i for i, p in enumerate(paths)}
        rows: list[tuple[int, int, int, int, int]] = []
        first: list[int] = []
        number = 0
        for source in sources:
            for local in range(len(source)):
                at = 0
                pieces = source.instance(local).pieces
                first.append(file_of[pieces[0].path] if pieces else -1)
                for p in pieces:
                    rows.append((number, file_of[p.path], p.start, p.end, at))
                    at += p.end - p.start
                number += 1
        table = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
        self.instance, self.file, self.start, self.end, self.at = (table[:, i] for i in range(5))
        self.first = np.asarray(first, dtype=np.int64)
        self.n_files = len(paths)

    def holding(self, file: int, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(instance, first file token it holds, tokens held, position of that token in the instance) of every
        piece overlapping tokens [start, end) of file `file`, by instance then position."""
        hit = np.flatnonzero((self.file == file) & (self.start < end) & (self.end > start))
        out = []
        for i in hit.tolist():
            lo, hi = max(int(self.start[i]), start), min(int(self.end[i]), end)
            out.append((int(self.instance[i]), lo, hi - lo, int(self.at[i]) + lo - int(self.start[i])))
        return sorted(out)

    def held_per_file(self) -> list[int]:
        """Per file, the tokens some instance holds (a token held by several instances counted once)."""
        out = []
        for k in range(self.n_files):
            mine = np.flatnonzero(self.file == k)
            spans = sorted(zip(self.start[mine].tolist(), self.end[mine].tolist(), strict=True))
            held, reach = 0, 0
            for a, b in spans:
                a = max(a, reach)
                if b > a:
                    held += b - a
                    reach = b
            out.append(held)
        return out

    def first_files(self) -> np.ndarray:
        """Per instance, the file of its first piece (-1: a random instance, read from no file)."""
        return self.first
