"""The `astrai` command line: one module per command, imported only when run."""
