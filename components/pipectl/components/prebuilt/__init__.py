"""The ``shards`` step: check pre-built shards and hand them to train and evaluate."""
