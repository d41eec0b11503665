"""A run config's remote settings applied to this process's reads: `data.remote_concurrency` (requests in flight
at once, and connections per host).

Why a function of its own: the trainer applies the key when it opens its data, but a data command (inspect-batch,
trace, stats, build-order) reads the same config and its remote files through the same process-wide reader, so the
key must mean the same there; each command calls this once it has read the config. A setting already in force
changes nothing (the reader keeps its pool, its connections and its cache of recent ranges), so calling it again
for every config a command opens costs nothing. The key wins over `OLMO_DATA_REMOTE_CONCURRENCY`, as in the
trainer; the reader's other settings (retries, timeouts) stay as the environment made them.
"""

from __future__ import annotations

from olmo_data.errors import DataError
from olmo_data.remote.reader import RemoteReader, configure, remote_reader


def apply_run_settings(concurrency: int | None) -> RemoteReader:
    """This process's reader, with `concurrency` (a run config's `data.remote_concurrency`; None: leave it)."""
    reader = remote_reader()
    if concurrency is None or concurrency == reader.options.concurrency:
        return reader
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise DataError(f"config key 'data.remote_concurrency': must be a positive whole number, got {concurrency!r}")
    return configure(concurrency=concurrency)
