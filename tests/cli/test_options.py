"""Options shared by every command (``r3store/cli/_options.py``): layers, rows, storage options."""

from __future__ import annotations

import pytest

from r3store.audit import parse_layers, parse_rows
from tests.clirun import invoke as _cli


def test_parse_layers_and_rows() -> None:
    assert parse_layers("3,0-1") == [3, 0, 1]
    assert parse_rows(":4") == slice(None, 4)
    for text in ("2,1-3", "0-100000"):
        with pytest.raises(ValueError, match="layers="):
            parse_layers(text)


@pytest.mark.parametrize("option", ['config_kwargs="notadict"', "client_kwargs=3", "s3_additional_kwargs=[1]"])
def test_storage_option_that_must_be_a_mapping(option: str) -> None:
    result = _cli("inspect", "s3://bucket/x", "-o", option)
    assert result.exit_code == 2, result.output
    assert "must be a mapping" in " ".join(result.output.split()), result.output
    assert len(result.output.strip().splitlines()) <= 3  # one message (rich wraps long lines)
