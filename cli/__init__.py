"""The `olmo-data` and `olmo-train` command lines: thin click commands over the libraries.

This folder installs as the package `olmo_cli`. Before anything else, it makes sure that the `olmo_data` Python
would import is this project's (OLMo's distribution ships a package of that name).
"""

from olmo_cli.own_packages import exit_if_shadowed

exit_if_shadowed()

__all__: list[str] = []  # the commands are reached through the entry points, `olmo_cli.main` and `olmo_cli.train_main`
