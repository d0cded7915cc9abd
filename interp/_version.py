"""The library version (one place; pyproject reads it too)."""

__version__ = "0.2.0.dev0"
