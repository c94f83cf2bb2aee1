"""The store manifest ``r3store.json`` and the zarr group documents beside it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import Any

import jsonschema

from r3store._spec import ModelSpec
from r3store._version import __version__
from r3store.errors import FormatError, FormatVersionError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_ROWS",
    "load_schema",
    "make_manifest",
    "parse_manifest",
    "zarr_group_json",
]

FORMAT_NAME = "r3store"
FORMAT_VERSION = 1
MAX_ROWS = 1 << 40
"""Readers reject route arrays, samples and row offsets of this many rows or more."""


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Load a JSON Schema shipped with r3store (``manifest``, ``sample_table``, ...)."""
    text = files("r3store._schema").joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


@cache
def _validator(name: str) -> Any:
    """A JSON Schema validator built once per schema (checking the schema itself each call costs ms)."""
    schema = load_schema(name)
    return jsonschema.validators.validator_for(schema)(schema)


def make_manifest(spec: ModelSpec) -> dict[str, Any]:
    """The manifest document for a new store."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "spec": dict(spec.to_dict()),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "created_by": f"r3store {__version__}",
    }


def parse_manifest(doc: Any, path: str) -> ModelSpec:
    """Validate a manifest against ``manifest.schema.json`` and return its spec.

    Raises
    ------
    r3store.errors.FormatVersionError
        ``format`` is not ``"r3store"`` or ``version`` is unknown.
    r3store.errors.FormatError
        The document does not validate.
    """
    if not isinstance(doc, dict):
        raise FormatError(path, "manifest is not a JSON object")
    if doc.get("format") != FORMAT_NAME or doc.get("version") != FORMAT_VERSION:
        raise FormatVersionError(
            path,
            f"format {doc.get('format')!r} version {doc.get('version')!r} is not readable "
            f"by this release (reads {FORMAT_NAME!r} version {FORMAT_VERSION})",
        )
    error = jsonschema.exceptions.best_match(_validator("manifest").iter_errors(doc))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(root)"
        raise FormatError(path, f"manifest invalid at {where}: {error.message}")
    return ModelSpec.from_dict(doc["spec"])


def zarr_group_json(attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A zarr v3 group ``zarr.json`` (so zarr tools can browse a store)."""
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}
