"""Example datasets that ship inside installed packages (no download at run time)."""

from pipectl.components.data.digits import EXAMPLES, write_example

__all__ = ["EXAMPLES", "write_example"]
