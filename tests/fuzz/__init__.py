"""Fuzzing harness of r3store's parsers and decoders (see README.md in this folder)."""
