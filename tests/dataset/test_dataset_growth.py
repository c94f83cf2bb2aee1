"""RouteDataset on growing stores: the epoch's sample set is fixed at its start and kept in the state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import r3store
from r3store.errors import OptionError, ResumeError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def routes(i: int, rows: int) -> np.ndarray:
    base = (np.arange(rows)[:, None, None] + i + np.arange(SPEC.num_layers)[None, :, None]) % 8
    return (base + np.array([0, 8])).astype(np.int32)


def grow(path: Path, first: int, count: int, writers: int = 2, step: int = 0) -> None:
    """``count`` samples ``s<first>..`` of 8..40 tokens, committed by ``writers`` writers (a few commits each)."""
    per = count // writers
    for w in range(writers):
        with r3store.RouteWriter(path, SPEC, buffer_bytes=1) as writer:  # one commit per sample
            for i in range(first + w * per, first + (w + 1) * per):
                writer.append(f"s{i:03d}", routes(i, 7 + (i * 7) % 33), metadata={"step": step})


def make(path: Path, num_workers: int, epoch: int = 0) -> tuple[r3store.RouteDataset, StatefulDataLoader]:
    ds = r3store.RouteDataset(path, max_tokens_per_batch=80, shuffle=True, seed=3)
    ds.set_epoch(epoch)
    return ds, StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)


def ids(loader: StatefulDataLoader) -> list[list[str]]:
    return [b["sample_ids"] for b in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_after_growth_yields_exactly_the_remaining_batches(tmp_path: Path, num_workers: int) -> None:
    path = tmp_path / "store"
    grow(path, 0, 24)
    _, loader = make(path, num_workers)
    full = ids(loader)
    assert sorted(s for b in full for s in b) == [f"s{i:03d}" for i in range(24)]
    _, loader = make(path, num_workers)
    it = iter(loader)
    head = [next(it)["sample_ids"] for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert head == full[:3]
    del it, loader
    grow(path, 100, 8, step=1)  # writers add samples mid-epoch
    ds, resumed = make(path, num_workers)
    assert len(ds.reader) == 32
    resumed.load_state_dict(state)
    assert ids(resumed) == full[3:]  # exactly the rest of the epoch: the new samples wait
    ds.set_epoch(1)
    epoch1 = ids(resumed)
    assert sorted(s for b in epoch1 for s in b) == sorted([f"s{i:03d}" for i in range(24)] +
                                                          [f"s{i:03d}" for i in range(100, 108)])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_from_the_end_of_an_epoch_then_set_epoch_yields_the_next_epoch(tmp_path: Path,
                                                                             num_workers: int) -> None:
    path = tmp_path / "store"
    grow(path, 0, 24)
    _, loader = make(path, num_workers)
    epoch0 = ids(loader)
    state = loader.state_dict()  # at the very end of epoch 0
    _, fresh = make(path, num_workers, epoch=1)
    epoch1 = ids(fresh)
    assert epoch1 != epoch0
    assert len(epoch1) == len(epoch0)
    ds, resumed = make(path, num_workers)
    resumed.load_state_dict(state)
    ds.set_epoch(1)
    assert ids(resumed) == epoch1


def test_dataset_state_is_compact_and_refresh_joins_at_the_next_epoch(tmp_path: Path) -> None:
    path = tmp_path / "store"
    grow(path, 0, 24)
    ds = r3store.RouteDataset(path, max_tokens_per_batch=80)
    assert len(ds.reader.commits) == 24
    state = ds.state_dict()
    assert state["commits"]["others"] == []
    assert len(state["commits"]["writers"]) == 2
    grow(path, 100, 8, step=1)
    assert ds.refresh() == 8
    assert len(ds.reader) == 32
    assert len(ds.sample_ids) == 24  # this epoch's set is fixed
    ds.set_epoch(1)
    assert len(ds.sample_ids) == 32
    follow = r3store.RouteDataset(path, max_tokens_per_batch=80, refresh_on_epoch=True)
    grow(path, 200, 2, step=2)
    follow.set_epoch(1)
    assert len(follow.sample_ids) == 34
    with pytest.raises(ResumeError, match="commits"):  # a state of commits this store does not have
        ds.load_state_dict({**ds.state_dict(), "commits": {"writers": {"nobody": 3}, "others": []}})


def test_dataset_filter_streams_one_step(tmp_path: Path) -> None:
    path = tmp_path / "store"
    grow(path, 0, 8, step=0)
    grow(path, 100, 6, step=1)
    ds = r3store.RouteDataset(path, max_tokens_per_batch=1000, filter=pc.field("step") == 1)
    got = sorted(s for b in ds for s in b["sample_ids"])
    assert got == [f"s{i:03d}" for i in range(100, 106)]
    with pytest.raises(OptionError, match="filter"):
        r3store.RouteDataset(r3store.open_store(path), filter=pc.field("step") == 1)
