"""The `pipectl` command line."""
