"""olmo_data: the data library of the toolkit (documents, tokenizers, token files, instances, orders, mixes).

It imports and works without torch and without click, so that data jobs run on machines that only need numpy.
Each concept is a module (or a package: `tokenizer`, `tokenize`, `chat`), imported by its own name; this package
only names the version and the one error every module raises.
"""

__version__ = "0.1.0"
from olmo_data.errors import DataError

TOOLKIT = "olmo-data"  # tells this package from others named olmo_data (cli/own_packages.py)

__all__ = ["TOOLKIT", "DataError", "__version__"]
