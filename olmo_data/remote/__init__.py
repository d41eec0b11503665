"""Remote files read by byte range, concurrently, coalesced, retried and checked (`reader`), with bodies read
under a cap and servers that ignore `Range` streamed once (`body`), and the range arithmetic (`ranges`). Every
remote read of the data library and the trainer (token files, orders, manifests, checkpoints) goes through the one
`remote_reader()` of a process, so its settings (`configure`, `OLMO_DATA_REMOTE_*`) apply everywhere. File sizes
are asked together, once a process, and cached on disk (`sizes`), or learnt with a file's first bytes from the same
request (`starts`). A run config's `data.remote_concurrency` reaches the reader through `apply_run_settings`
(`settings`).
"""

from olmo_data.remote.ranges import coalesce
from olmo_data.remote.reader import RemoteOptions, RemoteReader, configure, remote_reader
from olmo_data.remote.settings import apply_run_settings
from olmo_data.remote.sizes import RemoteStat, clear_memo, stat_many
from olmo_data.remote.starts import stat_and_start_many

__all__ = [
    "RemoteOptions",
    "RemoteReader",
    "RemoteStat",
    "apply_run_settings",
    "clear_memo",
    "coalesce",
    "configure",
    "remote_reader",
    "stat_and_start_many",
    "stat_many",
]
