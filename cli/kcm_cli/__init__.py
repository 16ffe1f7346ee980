"""The `kcm` command line."""
