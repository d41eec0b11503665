"""The one exception type the data library raises for bad input.

Every message names the file (and line, row or key) and says what was expected, so that a user can fix the input
without reading our code. The CLI prints these messages without a traceback.
"""

import errno


class DataError(Exception):
    """Bad input or a mismatch between what a directory holds and what was asked."""


def is_disk_full(e: BaseException) -> bool:
    """Whether `e` is a write refused for want of space (or quota): the user's to fix, so commands turn it into a
    DataError naming the folder, after removing what they had half written."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
