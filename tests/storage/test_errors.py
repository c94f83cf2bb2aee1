"""Foreign storage exceptions translated at the boundary (``r3store/storage/_errors.py``): credentials masked."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

import r3store
from r3store.errors import R3StoreError, StorageError
from r3store.storage import open_backend

SPEC_2X8 = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


@pytest.mark.s3
def test_credentials_in_the_url_never_reach_a_message(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    """Item 10: the prefix was masked but the same StorageError quoted botocore's
    ``Invalid bucket name "KEY:SECRET@bucket"``, and the traceback its cause."""
    url = f"s3://AKIAKEYID:{SECRET}@{s3_bucket}/store"
    calls = [lambda: r3store.open_store(url, storage_options=s3_storage_options),
             lambda: r3store.RouteWriter(url, SPEC_2X8, storage_options=s3_storage_options),
             lambda: open_backend(url, s3_storage_options).get("r3store.json"),
             lambda: open_backend(url, s3_storage_options).list_prefix("index/")]
    for call in calls:
        with pytest.raises(R3StoreError) as info:
            call()
        text = "".join(traceback.format_exception(info.value))
        assert SECRET not in text
        assert "AKIAKEYID" not in text
        assert "***@" in str(info.value)


def test_masking_of_foreign_messages() -> None:
    from r3store.storage import map_storage_errors

    with pytest.raises(StorageError) as info, map_storage_errors("s3://***@bucket/x"):
        raise OSError(f'Invalid bucket name "KEY:{SECRET}@bucket": must match; see http://u:{SECRET}@proxy:8080/')
    assert SECRET not in str(info.value)
    assert str(info.value).count("***@") == 3
    assert info.value.__cause__ is None  # the cause's own text held them
    with pytest.raises(StorageError) as info, map_storage_errors("s3://bucket/x"):
        raise OSError("slow down at 10:30, user@example")
    assert "10:30, user@example" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
