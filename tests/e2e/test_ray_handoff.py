"""The rollout-to-trainer hand-off on a local Ray cluster.

Rollout actors write routes with ``RouteWriter`` and send the trainers only their sample
ids, token ids and commit names (through the object store, as actor-call arguments);
trainer actors, DP x CP = 2 x 2 ranks, read their rank-local batches with ``assemble``
(from a reader of the step's commits) or stream them with ``RouteDataset``. Every rank's
routes are checked against ``store.get`` laid out with the same options, the CP ranks'
rows must cover every route row of every sample exactly once, and the bytes that cross
the object store are compared with sending int32 routes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.batch import assemble
from r3store.layout import LayoutOptions, apply_plan, apply_routes, plan_layout
from r3store.testing.faults import distinct_routes
from r3store.testing.ray_cluster import pickle_by_value

ray = pytest.importorskip("ray")
import r3store.ray as r3ray  # noqa: E402 - after the importorskip

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]
pickle_by_value(__name__)

SPEC = r3store.ModelSpec(num_layers=6, num_experts=32, top_k=4, moe_layers=[1, 2, 3, 4, 5])
DP, CP = 2, 2
PROMPTS = 6


def engine(step: int, prompt: int, worker: int) -> tuple[np.ndarray, np.ndarray]:
    """A stand-in inference engine: token ids and their routes (all decoder layers, dense as zeros,
    as SGLang returns them), a function of the request only."""
    rng = np.random.default_rng([step, prompt, worker])
    num_tokens = int(rng.integers(20, 90))
    routes = np.zeros((num_tokens - 1, SPEC.num_layers, SPEC.top_k), np.int32)
    routes[:, 1:] = distinct_routes(rng, num_tokens - 1, SPEC.num_moe_layers, SPEC.num_experts, SPEC.top_k)
    return rng.integers(0, 150_000, num_tokens), routes


@ray.remote(num_cpus=0)
class Rollout:
    """Generates, writes the routes to the store, and returns only what the trainer needs to ask for them."""

    def __init__(self, url: str, worker: int) -> None:
        self.worker = worker
        self.writer = r3store.RouteWriter(url, SPEC, writer_id=f"rollout-{worker}")

    def generate(self, step: int) -> dict[str, Any]:
        first = len(self.writer.commits)
        ids, tokens = [], []
        for prompt in range(PROMPTS):
            toks, routes = engine(step, prompt, self.worker)
            sid = f"step{step}/prompt{prompt}/w{self.worker}"
            self.writer.append(sid, routes, tokens=toks, metadata={"step": step})
            ids.append(sid)
            tokens.append(toks.astype(np.int32))
        self.writer.flush()  # the writer may also have committed on its own when its buffer filled
        return {"commits": self.writer.commits[first:], "sample_ids": ids, "tokens": tokens}

    def routes_message(self, step: int) -> dict[str, Any]:
        """What frameworks send today for the same step: the int32 routes themselves."""
        out: dict[str, Any] = {"sample_ids": [], "tokens": [], "routes": []}
        for prompt in range(PROMPTS):
            toks, routes = engine(step, prompt, self.worker)
            out["sample_ids"].append(f"step{step}/prompt{prompt}/w{self.worker}")
            out["tokens"].append(toks.astype(np.int32))
            out["routes"].append(routes)
        return out

    def close(self) -> None:
        self.writer.close()


@ray.remote(num_cpus=0)
class Trainer:
    """One (DP, CP) rank: reads only its batch, laid out for its rank."""

    def __init__(self, url: str, dp_rank: int, cp_rank: int) -> None:
        self.url = url
        self.dp_rank = dp_rank
        self.options = LayoutOptions(cp_size=CP, cp_rank=cp_rank)

    def train_step(self, *messages: dict[str, Any]) -> dict[str, Any]:
        commits = [c for m in messages for c in m["commits"]]
        reader = r3store.open_reader(self.url, commits=commits)  # this step's sample tables only
        ids = [sid for m in messages for sid in m["sample_ids"]][self.dp_rank :: DP]
        tokens = {sid: t for m in messages for sid, t in zip(m["sample_ids"], m["tokens"], strict=True)}
        batch = assemble(reader, ids, self.options, tokens=[tokens[s] for s in ids])  # checks the token hashes
        return {key: batch[key] for key in ("sample_ids", "routes", "replay_mask", "tokens")}

    def stream(self, commits: list[str], cp_rank: int) -> list[dict[str, Any]]:
        """RouteDataset over a reader of the step's commits (here as the rank ``(dp_rank, cp_rank)``)."""
        options = LayoutOptions(cp_size=CP, cp_rank=cp_rank)
        ds = r3store.RouteDataset(r3store.open_reader(self.url, commits=commits), max_tokens_per_batch=200,
                                  dp_rank=self.dp_rank, dp_size=DP, options=options)
        return [{"sample_ids": b["sample_ids"], "routes": b["routes"].numpy(), "replay_mask": b["replay_mask"].numpy()}
                for b in ds]


def expected(store: r3store.RouteStore, ids: list[str], cp_rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``store.get`` of each sample laid out with the rank's options, and the global row each local row holds."""
    plan = plan_layout([store.num_tokens(s) for s in ids], LayoutOptions(cp_size=CP, cp_rank=cp_rank))
    routes, mask = apply_routes(plan, np.concatenate([store.get(s) for s in ids]), num_experts=SPEC.num_experts)
    position = apply_plan(plan, np.arange(sum(store.num_tokens(s) for s in ids)), fill_value=-1)
    return routes, mask, position


def test_rollout_actors_hand_sample_ids_to_trainer_ranks(tmp_path: Path, ray_cluster: str) -> None:
    url = str(tmp_path / "routes")
    rollouts = [Rollout.remote(url, w) for w in range(2)]
    ranks = [(dp, cp) for dp in range(DP) for cp in range(CP)]
    trainers = {rank: Trainer.remote(url, *rank) for rank in ranks}
    for step in range(2):
        messages = [r.generate.remote(step) for r in rollouts]  # ObjectRefs: trainers fetch the messages
        results = dict(zip(ranks, ray.get([trainers[rank].train_step.remote(*messages) for rank in ranks]),
                           strict=True))
        store = r3store.open_store(url)
        for (dp, cp), got in results.items():
            ids = got["sample_ids"]
            assert ids == [f"step{step}/prompt{p}/w{w}" for w in range(2) for p in range(PROMPTS)][dp::DP]
            routes, mask, _ = expected(store, ids, cp)
            np.testing.assert_array_equal(got["routes"], routes)
            np.testing.assert_array_equal(got["replay_mask"], mask)
        for dp in range(DP):  # the CP ranks of one DP rank hold every route row of their samples exactly once
            ids = results[(dp, 0)]["sample_ids"]
            flat = np.concatenate([engine(step, int(s.split("prompt")[1].split("/")[0]), int(s[-1]))[1][:, 1:]
                                   for s in ids])  # the engines' own routes, MoE layers
            starts = np.cumsum([0] + [store.num_tokens(s) for s in ids])
            seen = np.zeros(len(flat), int)
            for cp in range(CP):
                got = results[(dp, cp)]
                _, _, position = expected(store, ids, cp)
                rows = position[got["replay_mask"]]
                sample = np.searchsorted(starts, rows, side="right") - 1
                route_row = rows - sample  # a sample of n tokens owns n - 1 route rows
                np.testing.assert_array_equal(got["routes"][got["replay_mask"]], flat[route_row])
                np.add.at(seen, route_row, 1)
            assert (seen == 1).all()
    ray.get([r.close.remote() for r in rollouts])


def test_trainer_ranks_stream_a_step_with_route_dataset(tmp_path: Path, ray_cluster: str) -> None:
    pytest.importorskip("torch")
    url = str(tmp_path / "routes")
    rollouts = [Rollout.remote(url, w) for w in range(2)]
    messages = ray.get([r.generate.remote(0) for r in rollouts])
    commits = [c for m in messages for c in m["commits"]]
    store = r3store.open_store(url)
    seen: list[str] = []
    trainers = [Trainer.remote(url, dp, 0) for dp in range(DP)]  # one process per DP rank, both CP views
    streams = {(dp, cp): trainers[dp].stream.remote(commits, cp) for dp in range(DP) for cp in range(CP)}
    for (_, cp), ref in streams.items():
        batches = ray.get(ref)
        assert batches
        for b in batches:
            routes, mask, _ = expected(store, b["sample_ids"], cp)
            np.testing.assert_array_equal(b["routes"], routes)
            np.testing.assert_array_equal(b["replay_mask"], mask)
            if cp == 0:
                seen += b["sample_ids"]
    assert sorted(seen) == sorted(store.sample_ids)  # every sample once over the DP ranks


def test_the_hand_off_moves_a_fraction_of_the_int32_bytes(tmp_path: Path, ray_cluster: str) -> None:
    rollout = Rollout.remote(str(tmp_path / "routes"), 0)
    message = ray.get(rollout.generate.remote(0))
    routes_message = ray.get(rollout.routes_message.remote(0))
    ids_bytes = r3ray.object_store_bytes(message)
    routes_bytes = r3ray.object_store_bytes(routes_message)
    int32_bytes = sum(r.nbytes for r in routes_message["routes"])
    assert routes_bytes > int32_bytes  # the routes themselves, plus the same ids and tokens
    assert ids_bytes < routes_bytes / 10
    assert ids_bytes > sum(t.nbytes for t in message["tokens"])  # it does carry the token ids
    assert r3ray.object_store_bytes(b"x" * 1000) >= 1000
