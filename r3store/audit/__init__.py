"""Audits of stores, returning plain data (the CLI only renders it)."""

from r3store.audit._summary import summarize

__all__ = ["summarize"]
