"""Two GRPO steps of TRL with ``R3GRPOTrainer``: routes captured in generate(), stored, replayed.

Runs ``examples/trl_grpo_r3.py`` (a tiny random Qwen3-MoE, a tokenizer built locally,
CPU). TRL and transformers warn about their own deprecations (``gradient_checkpointing``):
those warnings are theirs, so they are ignored here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip("trl")

from r3store.reader import RouteReader
from r3store.testing.moe import one_thread

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo_r3.py"


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_grpo_r3", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "error::r3store.errors.R3StoreWarning")
def test_two_grpo_steps_store_the_rollout_routes_and_replay_them_in_every_logprob_forward(tmp_path: Path) -> None:
    result = _example().run(str(tmp_path / "out"), steps=2)
    trainer = result["trainer"]
    history = [h for h in result["history"] if "loss" in h]
    assert len(history) == 2
    # one generation batch (2 steps per generation) of 2 prompts x 4 completions, all stored
    store = RouteReader.open(result["routes_url"])
    assert len(store.sample_ids) == 8
    assert store.spec == trainer.routing_replay.spec
    for sid in store.sample_ids:
        routes = store.get(sid)
        assert routes.ndim == 3
        assert routes.shape[1:] == (len(trainer.routing_replay.moe_layers), trainer.routing_replay.top_k)
        assert np.unique(np.sort(routes, -1), axis=-1).shape == routes.shape  # distinct experts per row
    # replayed forwards use exactly the stored ids (old/ref under no_grad and the policy, both steps) ...
    assert all(h["r3/flips"] == 0 for h in history)
    # ... which differ from the policy's own routing once it moved (step 2 trains on step 1's rollout)
    assert history[0]["r3/flips_without_replay"] < history[1]["r3/flips_without_replay"]
    assert history[1]["r3/flips_without_replay"] > 0
    assert trainer.ref_routing_replay is not None  # beta > 0: the reference model replays too


def test_r3store_trl_is_a_drop_in_subclass() -> None:
    import inspect

    from trl import GRPOTrainer

    from r3store.trl import SUPPORTED_TRL, R3GRPOTrainer

    assert issubclass(R3GRPOTrainer, GRPOTrainer)
    assert list(inspect.signature(R3GRPOTrainer.__init__).parameters)[-2:] == ["routes_url", "kwargs"]
    assert str(SUPPORTED_TRL[0]) == "1.16"
