"""`olmo-data index`: suffix arrays over a run's token files, built in resumable shards (`index`, its files named
by `layout`) and queried (`query`), sorted by divsufsort or a numpy fallback (`sort`), searched by bounded binary
search (`search`): exact counts and positions of token sequences, and the longest match at each start of a text,
without a scan.
"""

from olmo_data.suffix_index.index import build_index
from olmo_data.suffix_index.layout import token_array
from olmo_data.suffix_index.query import RunIndex, open_index
from olmo_data.suffix_index.search import common_prefix

__all__ = [
    "RunIndex",
    "build_index",
    "common_prefix",
    "open_index",
    "token_array",
]
