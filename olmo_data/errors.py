"""The one exception type the data library raises for bad input.

Every message names the file (and line, row or key) and says what was expected, so that a user can fix the input
without reading our code. The CLI prints these messages without a traceback.
"""


class DataError(Exception):
    """Bad input or a mismatch between what a directory holds and what was asked."""
