"""The ``r3store`` command line (thin: parse, call library functions, render)."""

from r3store.cli._main import main

__all__ = ["main"]
