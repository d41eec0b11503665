"""`olmo-data index`: suffix arrays over a run's token files, built in resumable shards (`index`), sorted by
divsufsort or a numpy fallback (`sort`); exact counts and positions of token sequences without a scan.
"""

from olmo_data.suffix_index.index import QUERY_END, RunIndex, build_index, compare_suffixes, open_index, token_array

__all__ = [
    "QUERY_END",
    "RunIndex",
    "build_index",
    "compare_suffixes",
    "open_index",
    "token_array",
]
