"""Engine payloads: SGLang's compact wire dtypes, and errors that name the real fault.

SGLang ``meta_info`` carries ``routed_experts`` (base64, flattened ``[rows, num_layers,
top_k]``), ``prompt_tokens``, ``completion_tokens``, ``routed_experts_start_len`` (multi-turn)
and, with an open SGLang change, ``routed_experts_dtype`` (uint8/uint16/int16/int32).
"""

from __future__ import annotations

import base64
import io
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.errors import (
    ContinuationError,
    ExpertIdError,
    PayloadDecodeError,
    RouteShapeError,
    RouteValidationError,
    RowCountError,
)
from tests.routes import SPEC_4X16

SPEC = r3store.ModelSpec(num_layers=4, num_experts=60, top_k=4, moe_layers=[1, 2, 3])  # layer 0 dense


def moe_routes(rng: np.random.Generator, rows: int, layers: int = 3, top_k: int = 4) -> np.ndarray:
    return np.argsort(rng.random((rows, layers, 60)), axis=-1)[..., :top_k].astype(np.int32)


def all_layers(moe: np.ndarray) -> np.ndarray:
    """As SGLang sends them: every decoder layer, the dense one as zeros."""
    out = np.zeros((moe.shape[0], SPEC.num_layers, moe.shape[2]), dtype=np.int32)
    out[:, 1:] = moe
    return out


def b64(routes: np.ndarray, dtype: str = "<i4") -> str:
    return base64.b64encode(np.ascontiguousarray(routes, dtype=dtype).tobytes()).decode("ascii")


def meta(routes: np.ndarray, *, dtype: str | None = None, prompt: int | None = None, completion: int | None = None,
         start_len: int | None = None) -> dict[str, Any]:
    codes = {"uint8": "<u1", "uint16": "<u2", "int16": "<i2", "int32": "<i4", None: "<i4"}
    info: dict[str, Any] = {"routed_experts": b64(routes, codes[dtype]), "e2e_latency": 0.5}
    if dtype is not None:
        info["routed_experts_dtype"] = dtype
    if prompt is not None:
        info["prompt_tokens"] = prompt
    if completion is not None:
        info["completion_tokens"] = completion
    if start_len is not None:
        info["routed_experts_start_len"] = start_len
    return info


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(13)


# -- item 12: SGLang's compact wire dtypes ---------------------------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "int32"])
def test_routed_experts_dtype_is_honoured(tmp_path: Path, rng: np.random.Generator, dtype: str) -> None:
    moe = moe_routes(rng, 9)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append_sglang("s", {"meta_info": meta(all_layers(moe), dtype=dtype, prompt=4, completion=6)})
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("s"), moe)
    assert store.num_tokens("s") == 10


def test_decode_sglang_reads_the_named_dtype(rng: np.random.Generator) -> None:
    full = all_layers(moe_routes(rng, 5))
    got = r3store.decode_sglang("s", meta(full, dtype="uint16"), SPEC)
    np.testing.assert_array_equal(got, full)
    np.testing.assert_array_equal(r3store.decode_sglang("s", {**meta(full, dtype="int16"),
                                                              "routed_experts_dtype": "torch.int16"}, SPEC), full)


def test_payload_size_that_does_not_fit_the_dtype_names_it(tmp_path: Path, rng: np.random.Generator) -> None:
    full = all_layers(moe_routes(rng, 5))
    odd = base64.b64encode(full.astype("<u2").tobytes()[:-1]).decode()
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(PayloadDecodeError, match=r"not a whole number of uint16"):
            w.append_sglang("a", {"routed_experts": odd, "routed_experts_dtype": "uint16"})
        short = base64.b64encode(full.astype("<u1").tobytes()[:-2]).decode()
        with pytest.raises(PayloadDecodeError, match=r"do not divide.*routed_experts_dtype is uint8"):
            w.append_sglang("b", {"routed_experts": short, "routed_experts_dtype": "uint8"})
        with pytest.raises(PayloadDecodeError, match=r"routed_experts_dtype: is 'float32'; expected one of uint8"):
            w.append_sglang("c", meta(full) | {"routed_experts_dtype": "float32"})
        # a compact payload sent without its dtype: the int32 reading fails and the error says which dtype fits
        no_dtype = base64.b64encode(full.astype("<u2").tobytes()).decode()  # 5 rows: 80 uint16, 40 int32
        with pytest.raises(PayloadDecodeError, match=r"uint16.*routed_experts_dtype"):
            w.append_sglang("d", {"routed_experts": no_dtype})
    assert len(r3store.open_store(tmp_path)) == 0


# -- item 13: messages that name the real fault ----------------------------------------------


def test_none_routes_say_the_engine_returned_none(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w, pytest.raises(RouteShapeError, match="engine returned no routes"):
        w.append("a", None)
    with pytest.raises(PayloadDecodeError, match="engine returned no routes"):
        r3store.decode_vllm("a", None)


def test_missing_routed_experts_key_hints_at_capture(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w, \
            pytest.raises(PayloadDecodeError, match=r"no 'routed_experts' key.*engine returned no routes.*"
                                                    r"--enable-return-routed-experts"):
        w.append_sglang("a", {"meta_info": {"prompt_tokens": 3, "completion_tokens": 4}})


def test_empty_payload_is_an_error_not_a_one_token_sample(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(PayloadDecodeError, match="is empty: the engine returned no routes"):
            w.append_sglang("a", {"routed_experts": ""})
        with pytest.raises(PayloadDecodeError, match="is empty"):
            w.append_sglang("b", {"routed_experts": "", "prompt_tokens": 5, "completion_tokens": 3})
        w.append_sglang("one-token", {"routed_experts": ""}, num_tokens=1)  # a 1-token sample has no rows
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["one-token"]
    assert store.get("one-token").shape == (0, 3, 4)


def test_token_counts_from_meta_info_catch_an_off_by_one(tmp_path: Path, rng: np.random.Generator) -> None:
    full = all_layers(moe_routes(rng, 9))
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(RowCountError, match=r"holds 9 rows.*expected num_tokens - 1 - start = 10"):
            w.append_sglang("long", meta(full, prompt=5, completion=6))  # 11 tokens: 10 rows expected
        with pytest.raises(RowCountError, match=r"holds 9 rows.*= 8"):
            w.append_sglang("short", meta(full, prompt=5, completion=4))
        w.append_sglang("ok", meta(full, prompt=5, completion=5))
        w.append_sglang("explicit", meta(full, prompt=5, completion=6), num_tokens=10)  # the caller's count wins
    store = r3store.open_store(tmp_path)
    assert sorted(store.sample_ids) == ["explicit", "ok"]
    assert store.num_tokens("ok") == 10


def test_routed_experts_start_len_is_used_as_start(tmp_path: Path, rng: np.random.Generator) -> None:
    whole = moe_routes(rng, 20)
    turn1 = meta(all_layers(whole[:7]), prompt=5, completion=3, start_len=0)
    turn2 = meta(all_layers(whole[7:]), prompt=15, completion=6, start_len=7)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append_sglang("chat", {"meta_info": turn1}, final=False)
        with pytest.raises(RouteValidationError, match=r"start: is 8 but meta_info routed_experts_start_len is 7"):
            w.append_sglang("chat", {"meta_info": turn2}, start=8)
        w.append_sglang("chat", {"meta_info": turn2})
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("chat"), whole)
    assert store.num_tokens("chat") == 21


def test_start_len_gap_is_still_a_continuation_error(tmp_path: Path, rng: np.random.Generator) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append_sglang("chat", meta(all_layers(moe_routes(rng, 4))), final=False)
        with pytest.raises(ContinuationError, match=r"\[0, 4\)"):
            w.append_sglang("chat", meta(all_layers(moe_routes(rng, 3)), start_len=5, prompt=6, completion=3))
        w.append_sglang("chat", meta(all_layers(moe_routes(rng, 3)), start_len=4, prompt=5, completion=3))


def test_wrong_top_k_whose_size_divides_is_named(tmp_path: Path, rng: np.random.Generator) -> None:
    """Routes of top-2 sent to a top-4 spec: 10 rows of top-2 reshape into 5 rows of top-4."""
    full = all_layers(moe_routes(rng, 10, top_k=2))
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(PayloadDecodeError, match=r"is top_k 2, not the ModelSpec's top_k=4\?"):
            w.append_sglang("a", meta(full, prompt=6, completion=5))
        with pytest.raises(ExpertIdError, match=r"moe_layers may be wrong.*top_k"):
            w.append_sglang("b", b64(full))  # no token count: the dense-layer check fires, naming top_k too


def test_forgotten_moe_layers_hint_that_layer_0_may_be_dense(tmp_path: Path, rng: np.random.Generator) -> None:
    all_moe = r3store.ModelSpec(num_layers=4, num_experts=60, top_k=4)  # moe_layers forgotten
    with r3store.RouteWriter(tmp_path, all_moe) as w, \
            pytest.raises(ExpertIdError, match=r"repeated.*decoder layer 0.*is decoder layer 0 dense.*moe_layers"):
        w.append_sglang("a", meta(all_layers(moe_routes(rng, 6)), prompt=3, completion=4))


@pytest.mark.parametrize("payload", [[], {"routed_experts": []}, np.zeros((0, 4, 4))])
def test_empty_list_payload_is_no_routes_not_a_float_array(payload: Any) -> None:
    # Found by the ingest fuzz target: json `[]` decoded to a float64 array of 0 rows.
    with pytest.raises(PayloadDecodeError, match="engine returned no routes"):
        r3store.decode_sglang("s", payload, SPEC)
    assert r3store.decode_sglang("s", [], SPEC, num_rows=0).dtype.kind == "i"


@pytest.mark.parametrize("payload", [[1.5] * 16, np.ones(16, dtype=bool), np.ones((1, 4, 4), dtype=np.float32)])
def test_non_integer_payload_is_refused_at_decode(payload: Any) -> None:
    with pytest.raises(PayloadDecodeError, match="expert ids must be integers"):
        r3store.decode_sglang("s", payload, SPEC)


@pytest.mark.parametrize("entries", [
    "'descr': (0, 32 ,), 'fortran_order': False, 'shape': (0, 3, 3)",  # found by the ingest fuzz target
    "'descr': '<i4', 'fortran_order': (1,), 'shape': (0, 3, 3)",
    "'descr': '<i4', 'fortran_order': False, 'shape': '<i4'",
    "'descr': True, 'fortran_order': False, 'shape': (0, 3, 3)",
])
def test_npy_header_entries_of_the_wrong_kind_are_payload_errors(entries: str) -> None:
    header = ("{" + entries + ", }").encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    blob = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    with pytest.raises(PayloadDecodeError, match="not of the form numpy writes"):
        r3store.decode_vllm("s", base64.b64encode(blob))


DENSE0 = r3store.ModelSpec(num_layers=6, num_experts=16, top_k=4, moe_layers=range(1, 6))


def _rows(n: int) -> np.ndarray:
    routes = np.tile(np.arange(4, dtype=np.int32), (n, 6, 1))
    routes[:, 0] = 0
    return routes


def test_partial_minus_one_with_allow_missing_does_not_advise_allow_missing(tmp_path: Path) -> None:
    routes = _rows(3)
    routes[0, 2] = -1
    with r3store.RouteWriter(tmp_path, DENSE0) as w:
        with pytest.raises(ExpertIdError, match="some layers only") as info:
            w.append("m2", routes, allow_missing=True)
        assert "pass allow_missing" not in str(info.value)
        with pytest.raises(ExpertIdError, match="pass allow_missing=True"):
            w.append("m2", routes)


def test_an_all_minus_one_row_with_dense_minus_one_hints_allow_missing(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, DENSE0) as w:
        with pytest.raises(ExpertIdError, match="pass allow_missing=True") as info:
            w.append("m1", np.full((4, 6, 4), -1, np.int32))
        assert "moe_layers may be wrong" not in str(info.value)
        assert str(info.value).startswith("sample 'm1': routes: row 0 is -1 in every MoE layer")  # the cause first
        w.append("m1", np.full((4, 6, 4), -1, np.int32), allow_missing=True)
    assert r3store.open_store(tmp_path).missing_rows("m1") == [(0, 4)]


def test_a_payload_labelled_with_the_wrong_dtype_names_the_dtype_that_fits() -> None:
    spec = r3store.ModelSpec(num_layers=6, num_experts=16, top_k=4)
    payload = base64.b64encode(np.tile(np.arange(4, dtype=np.uint8), (16, 6, 1)).tobytes()).decode()
    with pytest.raises(PayloadDecodeError, match="is the payload uint8, not int32"):
        r3store.decode_sglang("s", {"routed_experts": payload, "routed_experts_dtype": "int32"}, spec, num_rows=16)


def _npy_v1(header: str, body: bytes) -> bytes:
    header = header + " " * (63 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + body


@pytest.mark.parametrize("shape", ["(1000000000000, 4, 2)", "(3, 4, 2)"])
def test_decode_vllm_header_claims_more_than_present(shape: str) -> None:
    blob = _npy_v1(f"{{'descr': '<i4', 'fortran_order': False, 'shape': {shape}, }}", b"\x00" * 16)
    with pytest.raises(PayloadDecodeError, match="only 16 bytes follow"):
        r3store.decode_vllm("x", base64.b64encode(blob))


def test_decode_vllm_still_reads_npy() -> None:
    buf = io.BytesIO()
    np.save(buf, np.arange(24, dtype=np.uint16).reshape(3, 4, 2))
    decoded = r3store.decode_vllm("x", base64.b64encode(buf.getvalue()))
    assert decoded.tolist() == np.arange(24).reshape(3, 4, 2).tolist()


def test_decode_vllm_reads_raw_npy_bytes_and_refuses_routes_that_are_not_3d() -> None:
    """New-user findings: raw ``np.save`` bytes were refused as "not base64"; a 2-D array
    came back unchanged although the result is documented as (rows, L, top_k)."""
    buf = io.BytesIO()
    np.save(buf, np.arange(24, dtype=np.int16).reshape(3, 4, 2))
    for raw in (buf.getvalue(), bytearray(buf.getvalue()), memoryview(buf.getvalue())):
        decoded = r3store.decode_vllm("x", raw)
        assert decoded.dtype == np.int16
        assert decoded.tolist() == np.arange(24).reshape(3, 4, 2).tolist()
    flat = io.BytesIO()
    np.save(flat, np.zeros((30, 8), np.int16))
    for payload in (np.zeros((30, 8), np.int16), flat.getvalue(), base64.b64encode(flat.getvalue()),
                    {"routed_experts": np.zeros(5, np.int32)}):
        with pytest.raises(PayloadDecodeError, match=r"'x'.*routed_experts.*has shape \((30, 8|5,)\)"):
            r3store.decode_vllm("x", payload)
    with pytest.raises(PayloadDecodeError, match=r"neither \.npy bytes nor a base64"):
        r3store.decode_vllm("x", b"\x00\x01 not base64")


@pytest.mark.parametrize("payload", [None, {"routed_experts": None}, {"text": "hi"}])
def test_decode_vllm_without_routes_names_vllm_not_sglang(payload: Any) -> None:
    with pytest.raises(PayloadDecodeError, match="capture enabled in vLLM") as info:
        r3store.decode_vllm("x", payload)
    assert "SGLang" not in str(info.value)


def _npy(header: str, body: bytes = b"\x00" * 96, version: bytes = b"\x01\x00") -> bytes:
    text = header + " " * (63 - len(header) % 64) + "\n"
    size = struct.pack("<H" if version == b"\x01\x00" else "<I", len(text))
    return b"\x93NUMPY" + version + size + text.encode("latin-1") + body


@pytest.mark.parametrize("header", [
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4, 2), ",  # TokenError (EOF in multi-line statement)
    "{'descr': '<i4' 'fortran_order': False, 'shape': (3, 4, 2)}",  # SyntaxError
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4sn, 2), }",
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4, 2), 'x': __import__('os').getpid()}",
    "{'descr': '<i4', 'fortran_order': False, 'shape': [3, 4, 2]}",
    "{'descr': '<i4', 'descr': '<i4', 'shape': (3, 4, 2)}",
    "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4, 1), }",
    "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (3,), }",
    "{'descr': '<i4', 'fortran_order': 0, 'shape': (3, 4, 2), }",
    "{'descr': '<i4', 'fortran_order': False, 'shape': (-3, 4, 2), }",
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4, 2), }\udcff",
    "",
])
def test_malformed_npy_header_is_a_payload_error(header: str) -> None:
    """Item 7: numpy's header parser (``ast``/``tokenize``) raised TokenError or SyntaxError out of
    ``decode_vllm``; the header is now parsed with a whitelist and refused as a PayloadDecodeError."""
    blob = _npy(header.encode("utf-8", "surrogateescape").decode("latin-1"))
    with pytest.raises(PayloadDecodeError, match="routed_experts") as info:
        r3store.decode_vllm("s7", base64.b64encode(blob))
    assert info.value.sample_id == "s7"


@pytest.mark.parametrize("raw", [b"", b"\x93NUMPY", b"\x93NUMPY\x01\x00\xff\xff{", b"\x93NUMPY\x03\x00\x10\x00\x00\x00",
                                 b"PK\x03\x04 a zip, as np.load would open"])
def test_truncated_or_foreign_npy_blob_is_a_payload_error(raw: bytes) -> None:
    with pytest.raises(PayloadDecodeError):
        r3store.decode_vllm("s", base64.b64encode(raw))


@pytest.mark.parametrize(("dtype", "order"), [("<i4", "C"), ("<u2", "C"), ("|u1", "C"), ("<i8", "F"), (">i2", "C")])
def test_npy_headers_numpy_writes_still_decode(dtype: str, order: str) -> None:
    routes = np.arange(24).reshape(3, 4, 2).astype(dtype)
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(routes) if order == "F" else routes)
    for version in ((1, 0), (2, 0)):
        blob = buf.getvalue() if version == (1, 0) else _v2(buf.getvalue())
        got = r3store.decode_vllm("s", base64.b64encode(blob))
        np.testing.assert_array_equal(got, routes)


def _v2(blob: bytes) -> bytes:
    """A format 1.0 ``.npy`` rewritten as format 2.0 (a 4-byte header length)."""
    (length,) = struct.unpack_from("<H", blob, 8)
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", length) + blob[10:]


def test_sglang_none_and_int64_payloads(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC_4X16) as w:
        with pytest.raises(PayloadDecodeError, match=r"is None.*capture"):
            w.append_sglang("a", {"routed_experts": None})
        routes = np.tile(np.array([3, 7]), (6, 4, 1))
        as_int64 = base64.b64encode(routes.astype("<i8").tobytes()).decode()
        with pytest.raises(PayloadDecodeError, match="int64"):
            w.append_sglang("a", {"routed_experts": as_int64})
        w.append_sglang("a", {"routed_experts": r3store.encode_sglang(routes)})
    np.testing.assert_array_equal(r3store.open_store(tmp_path).get("a"), routes)
