"""`olmo-data index`: suffix arrays over a run's token files, built in resumable shards (`index`, its files named
by `layout`) and queried (`query`), sorted by divsufsort or a numpy fallback (`sort`), searched by bounded binary
search (`search`), its files checked against their build's checksums (`integrity`: samples at each query, whole
by `verify`): exact counts and positions of token sequences, and the longest match at each start of a text,
without a scan.
"""

from olmo_data.suffix_index.index import build_index
from olmo_data.suffix_index.layout import token_array
from olmo_data.suffix_index.query import RunIndex, open_index
from olmo_data.suffix_index.search import common_prefix
from olmo_data.suffix_index.verify import VerifySummary, verify_index

__all__ = [
    "RunIndex",
    "VerifySummary",
    "build_index",
    "common_prefix",
    "open_index",
    "token_array",
    "verify_index",
]
