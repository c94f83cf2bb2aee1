"""Writer ingest: ``RouteWriter.append_sglang`` on a 32K-token DeepSeek-V3 sample, before/after.

Run from the repository root (r3store installed, e.g. editable, so its C kernels are built)::

    python benchmarks/bench_ingest.py            # 32,768 tokens, median of 7
    python benchmarks/bench_ingest.py --quick    # 8,192 tokens, median of 3

The sample is what SGLang sends for one DeepSeek-V3 rollout (61 decoder layers, the first 3
dense, 256 routed experts, top-8): ``meta_info["routed_experts"]``, base64 of little-endian
int32 ``[rows, 61, 8]`` with the dense layers as zeros, as a ``str``. The ids come from
:func:`r3store.testing.synthetic.synthetic_routes` (skewed loads, correlated layers).

Rows (each timed as the median of ``--repeats`` calls, in one process, one after the other):

* ``append_sglang, numpy kernels`` (**before**): the writer with the numpy twins of the
  kernels forced (``kernels.use("numpy")``, what ``R3STORE_NO_NATIVE=1`` selects): the code
  every writer ran before the C kernels existed (base64 with ``base64.b64decode``,
  validation with numpy);
* ``append_sglang, native kernels`` (**after**): the same call with the C kernels
  (``IMPLEMENTATION`` in the environment table);
* ``append (decoded int32 array)``: the writer's checks alone, numpy vs native;
* ``base64 decode + np.save (status quo)``: what a rollout worker does without r3store:
  ``base64.b64decode`` to int32 and ``np.save`` into a ``BytesIO`` (no validation);
* stage rows: the base64 decode alone (``base64.b64decode(validate=True)`` vs
  ``kernels.b64decode``) and the checks alone (``check_routes`` on either implementation).

``append_sglang`` is timed alone: the writer's buffer is flushed (untimed) between calls, so
no call pays for an earlier sample's commit. Every append is checked to keep every route:
the committed sample is read back and compared at the end.
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

import r3store
from r3store._validate import check_routes
from r3store.codecs import kernels
from r3store.testing.synthetic import synthetic_routes

SPEC = r3store.ModelSpec(num_layers=61, num_experts=256, top_k=8, moe_layers=range(3, 61))


def median_time(repeats: int, fn: Callable[[int], Any], setup: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``fn(i)`` over ``repeats`` calls (``setup()`` untimed before each)."""
    times = []
    for i in range(repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_sample(tokens: int) -> tuple[np.ndarray, str]:
    moe = synthetic_routes(num_tokens=tokens, num_layers=SPEC.num_moe_layers, num_experts=SPEC.num_experts,
                           top_k=SPEC.top_k, seed=0)
    full = np.zeros((tokens - 1, SPEC.num_layers, SPEC.top_k), dtype=np.int32)
    full[:, list(SPEC.moe_layers)] = moe
    return full, r3store.encode_sglang(full)


def bench_append(impl: str, payload: str, full: np.ndarray, repeats: int, where: Path, sglang: bool) -> float:
    tokens = len(full) + 1
    config = {"buffer_bytes": 1 << 34, "writer_id": f"w-{impl}"}
    with kernels.use(impl), r3store.RouteWriter(where, SPEC, config) as writer:
        def one(i: int) -> None:
            sid = f"{impl}-{'sglang' if sglang else 'array'}-{i}"
            if sglang:
                writer.append_sglang(sid, {"routed_experts": payload}, num_tokens=tokens)
            else:
                writer.append(sid, full, num_tokens=tokens)

        return median_time(repeats, one, setup=writer.flush)


def bench_npy(payload: str, repeats: int) -> float:
    def one(_: int) -> None:
        ids = np.frombuffer(base64.b64decode(payload, validate=True), dtype="<i4")
        np.save(io.BytesIO(), ids.reshape(-1, SPEC.num_layers, SPEC.top_k))

    return median_time(repeats, one)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8,192 tokens, median of 3")
    parser.add_argument("--tokens", type=int, help="tokens of the sample (default 32768; 8192 with --quick)")
    parser.add_argument("--repeats", type=int, help="median of N (default 7; 3 with --quick)")
    args = parser.parse_args(argv)
    tokens = args.tokens or (8192 if args.quick else 32768)
    repeats = args.repeats or (3 if args.quick else 7)
    console = Console(width=max(Console().width, 130))
    if kernels.native_module() is None:
        console.print(f"[red]no C kernels: {kernels.NATIVE_UNAVAILABLE}; only the numpy rows are measured[/red]")
    env = Table(title="environment", show_header=False)
    for key, value in [("python", sys.version.split()[0]), ("numpy", np.__version__),
                       ("r3store", r3store.__version__), ("kernels", kernels.IMPLEMENTATION),
                       ("sample", f"{tokens:,} tokens, DeepSeek-V3 (61 layers, 3 dense, 256 experts, top-8)"),
                       ("repeats", f"median of {repeats}")]:
        env.add_row(key, str(value))
    console.print(env)

    full, payload = make_sample(tokens)
    impls = ["numpy"] + (["native"] if kernels.native_module() is not None else [])
    native_name = kernels.IMPLEMENTATION
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="r3store-bench-ingest-") as tmp:
        for impl in impls:
            use = impl if impl == "numpy" else native_name
            label = "numpy kernels (before)" if impl == "numpy" else f"{native_name} kernels (after)"
            rows.append((f"append_sglang, {label}", bench_append(use, payload, full, repeats, Path(tmp) / impl, True)))
        for impl in impls:
            use = impl if impl == "numpy" else native_name
            rows.append((f"append (decoded int32 array), {use}",
                         bench_append(use, payload, full, repeats, Path(tmp) / f"{impl}-arr", False)))
        rows.append(("base64.b64decode + np.save to BytesIO (status quo, no checks)", bench_npy(payload, repeats)))
        rows.append(("stage: base64.b64decode(validate=True)",
                     median_time(repeats, lambda _: base64.b64decode(payload, validate=True))))
        for impl in impls:
            use = impl if impl == "numpy" else native_name
            with kernels.use(use):
                rows.append((f"stage: kernels.b64decode, {use}",
                             median_time(repeats, lambda _: kernels.b64decode(payload))))
                rows.append((f"stage: check_routes, {use}",
                             median_time(repeats, lambda _: check_routes("s", full, SPEC))))
        for impl in impls:  # every appended sample is stored intact
            with r3store.open_store(Path(tmp) / impl) as store:
                for sid in store.sample_ids:
                    if not np.array_equal(store.get(sid), full[:, list(SPEC.moe_layers)]):
                        raise SystemExit(f"{impl}/{sid}: stored routes differ from the sample")

    base = rows[0][1]
    table = Table(title=f"writer ingest, one {tokens:,}-token DeepSeek-V3 sample "
                        f"({len(payload) / 1e6:.1f} MB of base64; ratios vs the first row)")
    for col, justify in [("what", "left"), ("ms / sample", "right"), ("samples/s", "right"),
                         ("tokens/s", "right"), ("speed vs before", "right")]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for name, seconds in rows:
        table.add_row(name, f"{seconds * 1e3:,.1f}", f"{1 / seconds:,.2f}", f"{tokens / seconds:,.0f}",
                      f"{base / seconds:.2f}x")
    console.print(table)
    if len(rows) > 1 and kernels.native_module() is not None:
        ratio = base / rows[1][1]
        console.print(f"append_sglang: {ratio:.1f}x faster with the C kernels (target >= 5x: "
                      f"{'met' if ratio >= 5 else 'MISSED'}); every sample read back intact")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
