"""An example team package with one pipeline step (``python -m mysteps.report``)."""
