"""The `olmo-data` command line: thin click commands over the `olmo_data` library."""
