"""``r3store.megatron`` drives megatron-core's own routers: real ``TopKRouter``, ``RouterReplay``,
``TransformerLayer`` layer numbering and ``CheckpointFunction`` recompute (megatron-core 0.16 on CPU).

What runs and what is simulated (one process, world size 1, gloo process group):

- **PP=2 x VPP=2 is simulated in one process.** The four model chunks (pipeline rank,
  virtual stage) are built with Megatron's own block spec
  (``get_gpt_decoder_block_spec(config, vp_stage=, pp_rank=)``) and Megatron's own layer
  offsets (``get_transformer_layer_offset``): a ``TransformerLayer`` takes its pipeline rank
  from the ``pp`` group of its process-group collection, so each chunk gets a stand-in
  ``pp`` group that only reports that rank and size 2 (world size 1 has no rank 1, and
  Megatron's P2P pipeline schedules need CUDA). The chunks then run in pipeline order,
  hidden states handed on with Megatron's ``set_input_tensor``, and each micro-batch's
  backward runs through all of them, in forward order, as the 1F1B schedule does.
- **CPU shims** for CUDA-only paths megatron-core takes unconditionally (nothing under
  test is replaced): ``torch.cuda.current_device()`` answers ``"cpu"`` (the router moves
  its weight there on its first call); the CUDA RNG state get/set used by
  ``CheckpointFunction`` and the RNG tracker's ``fork`` are no-ops, the tracker's named
  states placeholders (the CPU RNG state is still saved and restored; dropout is 0); the
  global attention buffer allocates on the CPU; ``moe_utils.te_general_gemm``, referenced
  but undefined in 0.16.1 without Transformer Engine, is ``None`` (its own ``torch.mm``
  fallback runs); ``torch.compile`` (Megatron's ``jit_fuser``) is disabled; the causal
  attention mask is passed in (the default one is built on ``"cuda"``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import r3store
from r3store.errors import ReplayError
from r3store.megatron import _replay, clear_replay_routes, moe_layers, set_replay_routes
from r3store.testing.faults import distinct_routes
from r3store.testing.moe import one_thread

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # megatron-core warns on import that Transformer Engine and Apex are absent
    pytest.importorskip("megatron.core", reason="megatron-core is not installed: pip install 'r3store[megatron]'")
    import megatron.core.tensor_parallel.random as mcore_random
    import megatron.core.transformer.moe.moe_utils as mcore_moe_utils
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.moe.router_replay import RouterReplay
    from megatron.core.transformer.transformer_config import TransformerConfig

pytestmark = pytest.mark.filterwarnings(
    # megatron-core 0.16's own specs call its own deprecated signatures (MLP without ffn_hidden_size, ...)
    "ignore::DeprecationWarning:megatron.*",
)

NUM_EXPERTS, TOP_K, VOCAB = 8, 2, 64
PIPELINE_ORDER = [(0, 0), (1, 0), (0, 1), (1, 1)]
"""(pipeline rank, virtual stage) in the order a micro-batch passes them (interleaved schedule)."""


class _StageGroup:
    """Stand-in ``pp`` process group: reports one pipeline rank of a pipeline of ``size`` ranks."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


class _CpuBuffer:
    def get_tensor(self, shape: Any, dtype: Any, name: str, mem_alloc_context: Any = None) -> Any:
        return torch.empty(shape, dtype=dtype)


@pytest.fixture(scope="module")
def megatron_cpu() -> Iterator[None]:
    """gloo world of one rank, Megatron's model-parallel state, the CPU shims of the module docstring;
    torch on one thread (tiny models on a busy shared CPU)."""
    import torch._dynamo

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # torch._dynamo.config.patch, not monkeypatch: undoing a monkeypatch of `disable` leaves it hidden
    # ("torch._dynamo.config.disable does not exist"), which breaks every later torch.compile in the process
    with pytest.MonkeyPatch.context() as mp, one_thread(), torch._dynamo.config.patch(disable=True):
        mp.setattr(torch.cuda, "current_device", lambda: "cpu")
        mp.setattr(mcore_random, "_get_cuda_rng_state", lambda *a, **k: None)
        mp.setattr(mcore_random, "_set_cuda_rng_state", lambda *a, **k: None)
        mp.setattr(mcore_moe_utils, "te_general_gemm", None, raising=False)
        mp.setattr(parallel_state, "get_global_memory_buffer", lambda: _CpuBuffer())
        parallel_state.initialize_model_parallel(1, 1)
        tracker = mcore_random.get_cuda_rng_tracker()
        for name in ("model-parallel-rng", "expert-parallel-rng", "data-parallel-rng"):
            tracker.states_[name] = torch.get_rng_state()
        try:
            yield
        finally:
            tracker.reset()
            parallel_state.destroy_model_parallel()
            RouterReplay.clear_global_router_replay_instances()
            if started:
                dist.destroy_process_group()


def _config(num_layers: int, dense: int, *, pp: int = 1, vpp: int | None = None, **extra: Any) -> Any:
    return TransformerConfig(
        num_layers=num_layers, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32,
        num_moe_experts=NUM_EXPERTS, moe_router_topk=TOP_K, moe_ffn_hidden_size=16,
        moe_layer_freq=[0] * dense + [1] * (num_layers - dense), moe_router_load_balancing_type="none",
        moe_token_dispatcher_type="allgather", moe_enable_routing_replay=extra.pop("replay", True),
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
        pipeline_dtype=torch.float32 if pp > 1 else None, use_cpu_initialization=True, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, cuda_graph_scope=[], **extra)


def _chunk(config: Any, pp_rank: int = 0, vp_stage: int | None = None, seed: int = 0) -> Any:
    """One model chunk built by Megatron's own spec for (pp_rank, vp_stage)."""
    torch.manual_seed(seed)
    pgc = ProcessGroupCollection.use_mpu_process_groups()
    pp_size = config.pipeline_model_parallel_size
    pgc.pp = _StageGroup(pp_rank, pp_size)
    last_vp = (config.virtual_pipeline_model_parallel_size or 1) - 1
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=vp_stage, pp_rank=pp_rank)
    return GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=64, share_embeddings_and_output_weights=False,
                    pre_process=pp_rank == 0 and (vp_stage or 0) == 0,
                    post_process=pp_rank == pp_size - 1 and (vp_stage or 0) == last_vp,
                    pg_collection=pgc, vp_stage=vp_stage)


def _store(path: Path, num_layers: int, dense: int, lengths: dict[str, int],
           seed: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    """A store of random distinct routes for samples of ``lengths`` tokens, and their token ids."""
    spec = r3store.ModelSpec(num_layers=num_layers, num_experts=NUM_EXPERTS, top_k=TOP_K,
                             moe_layers=range(dense, num_layers))
    rng = np.random.default_rng(seed)
    tokens = {sid: rng.integers(0, VOCAB, n) for sid, n in lengths.items()}
    with r3store.RouteWriter(str(path), spec) as writer:
        for sid, n in lengths.items():
            writer.append(sid, distinct_routes(rng, n - 1, spec.num_moe_layers, NUM_EXPERTS, TOP_K),
                          tokens=tokens[sid])
    return r3store.open_store(str(path)), tokens


class _Maps:
    """Routing maps (bool [tokens, experts]) every TopKRouter of the chunks produced, per decoder layer."""

    def __init__(self, chunks: list[Any]) -> None:
        self.calls: dict[int, list[Any]] = {}
        self.handles = []
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    self.handles.append(module.register_forward_hook(self._hook))

    def _hook(self, module: Any, args: Any, output: Any) -> None:
        self.calls.setdefault(module.layer_number - 1, []).append(output[1].detach().clone())

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _expected_map(routes: np.ndarray) -> Any:
    """Dense bool [N, experts] from (N, top_k) ids."""
    dense = torch.zeros(routes.shape[0], NUM_EXPERTS, dtype=torch.bool)
    dense[torch.arange(routes.shape[0]).unsqueeze(1), torch.from_numpy(routes.astype(np.int64))] = True
    return dense


def _causal(n: int) -> Any:
    return torch.triu(torch.ones(n, n), 1).bool()[None, None]


def _run_pipeline(chunks: dict[tuple[int, int], Any], tokens: Any) -> Any:
    """One micro-batch through the four chunks in pipeline order; the summed per-token loss."""
    b, s = tokens.shape
    pos = torch.arange(s).expand(b, s)
    hidden = None
    for key in PIPELINE_ORDER:
        model = chunks[key]
        if hidden is not None:
            model.set_input_tensor(hidden)
        hidden = model(tokens if key == PIPELINE_ORDER[0] else None, pos, _causal(s),
                       labels=tokens if key == PIPELINE_ORDER[-1] else None)
    return hidden.sum()


MICRO_BATCHES = [(["a", "b"], "uint8"), (["c", "d"], "int16"), (["e", "f"], "int32")]
"""Three micro-batches of 12 tokens each, each assembled in another stored dtype."""


def test_pp2_vpp2_routers_replay_the_batch_in_forward_and_in_recompute(megatron_cpu: None, tmp_path: Path) -> None:
    """Each stage's real TopKRouters route exactly as its batch says, uint8/int16/int32 alike, also when
    full activation recompute runs them again in backward (three micro-batches: Megatron's FIFO)."""
    config = _config(8, 3, pp=2, vpp=2, recompute_granularity="full", recompute_method="uniform",
                     recompute_num_layers=1)
    chunks = {(pp, vp): _chunk(config, pp, vp, seed=10 * pp + vp) for pp in range(2) for vp in range(2)}
    stages = [[chunks[pp, 0], chunks[pp, 1]] for pp in range(2)]
    # Megatron's own numbering: layers 1-2 | 3-4 | 5-6 | 7-8 on (0,0) (1,0) (0,1) (1,1), first three dense
    assert [moe_layers(stage) for stage in stages] == [[4, 5], [3, 6, 7]]
    assert moe_layers(chunks[0, 0]) == []
    lengths = {"a": 7, "b": 5, "c": 6, "d": 6, "e": 9, "f": 3}
    store, tokens = _store(tmp_path / "routes", 8, 3, lengths)

    maps = _Maps([c for stage in stages for c in stage])
    expected: dict[int, list[Any]] = {}
    losses = []
    try:
        for ids, dtype in MICRO_BATCHES:
            for pp, stage in enumerate(stages):  # rank 0 reads every MoE layer, rank 1 only its own
                batch = store.assemble(ids, {"layout": "thd", "dtype": dtype},
                                       layers=None if pp == 0 else moe_layers(stage),
                                       tokens=[tokens[s] for s in ids])
                assert batch["routes"].dtype == np.dtype(dtype)
                assert batch["routes"].shape[0] == 12
                given = set_replay_routes(stage, batch)
                assert all(t.dtype == torch.int64 and t.shape == (12, TOP_K) for t in given)
                for layer, routes in zip(moe_layers(stage), given, strict=True):
                    column = batch["routes"][:, batch["layers"].index(layer)]
                    assert torch.equal(routes, torch.from_numpy(column.astype(np.int64)))
                    expected.setdefault(layer, []).append(_expected_map(column))
            losses.append(_run_pipeline(chunks, torch.from_numpy(batch["tokens"]).unsqueeze(0)))
        for loss in losses:  # backward in forward order, as the pipeline schedules run it
            loss.backward()
        for layer in (3, 4, 5, 6, 7):
            calls = maps.calls[layer]
            assert len(calls) == 6, f"layer {layer}: 3 forwards + 3 recomputes, got {len(calls)} router calls"
            want = expected[layer] * 2  # forwards in order, then recomputes in the same order
            for call, (got, exp) in enumerate(zip(calls, want, strict=True)):
                assert torch.equal(got, exp), f"layer {layer}, router call {call}: routing map differs from the batch"
        for stage in stages:
            for module in (m for c in stage for m in c.modules() if isinstance(m, TopKRouter)):
                assert module.weight.grad is not None
                assert module.weight.grad.abs().sum() > 0
                assert module.router_replay.replay_backward_list == []  # every recompute popped its entry
    finally:
        maps.remove()
        for stage in stages:
            clear_replay_routes(stage)
    assert all(m.router_replay.router_replay_action is None
               for stage in stages for c in stage for m in c.modules() if isinstance(m, TopKRouter))



def _forward(model: Any, tokens: Any, *, labels: bool = True) -> Any:
    b, s = tokens.shape
    out = model(tokens, torch.arange(s).expand(b, s), _causal(s), labels=tokens if labels else None)
    return out.sum()


def test_selective_moe_recompute_replays_the_same_routes_and_gradients(megatron_cpu: None, tmp_path: Path) -> None:
    """BSHD batch (transposed to the router's sequence-major order), recompute of the MoE module only
    (recompute_granularity="selective", "moe"): routing maps in forward and in recompute equal the batch,
    and every gradient equals the one of the same model without recompute."""
    plain = _chunk(_config(4, 1), seed=1)
    recomputed = _chunk(_config(4, 1, recompute_granularity="selective", recompute_modules=["moe"]), seed=1)
    recomputed.load_state_dict(plain.state_dict())
    store, tokens = _store(tmp_path / "routes", 4, 1, {"a": 7, "b": 5})
    batch = store.assemble(["a", "b"], {"layout": "bshd", "dtype": "auto"}, tokens=[tokens["a"], tokens["b"]])
    assert batch["routes"].shape == (2, 7, 3, TOP_K)
    assert batch["routes"].dtype == np.uint8
    flat = batch["routes"].transpose(1, 0, 2, 3).reshape(14, 3, TOP_K)  # token (s, b) is row s * B + b
    grads = []
    for model in (plain, recomputed):
        maps = _Maps([model])
        try:
            assert moe_layers(model) == batch["layers"] == [1, 2, 3]
            set_replay_routes(model, batch)
            _forward(model, torch.from_numpy(batch["tokens"])).backward()
        finally:
            maps.remove()
            clear_replay_routes(model)
        for i, layer in enumerate(batch["layers"]):
            calls = maps.calls[layer]
            assert len(calls) == (2 if model is recomputed else 1)
            assert all(torch.equal(c, _expected_map(flat[:, i])) for c in calls), f"layer {layer}"
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    assert any("router" in n for n in grads[0])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("layout", ["thd", "sbhd", "packed"])
def test_every_layout_reaches_the_router_in_its_token_order(megatron_cpu: None, tmp_path: Path, layout: str) -> None:
    model = _chunk(_config(4, 1), seed=2)
    store, tokens = _store(tmp_path / "routes", 4, 1, {"a": 6, "b": 4})
    toks = [tokens["a"], tokens["b"]]
    if layout == "packed":
        batch = store.assemble(["a", "b"], {"layout": "thd", "packed": True}, tokens=toks)
        routes = store.assemble(["a", "b"], {"layout": "thd"}, tokens=toks)["routes"]
        inputs = batch["tokens"][None]
    else:
        batch = store.assemble(["a", "b"], {"layout": layout, "dtype": "int16"}, tokens=toks)
        routes = batch["routes"].reshape(-1, 3, TOP_K)  # THD as is; SBHD (T, B) is already sequence-major
        inputs = batch["tokens"][None] if layout == "thd" else batch["tokens"].T
    maps = _Maps([model])
    try:
        with torch.no_grad():
            set_replay_routes(model, batch)
            _forward(model, torch.from_numpy(np.ascontiguousarray(inputs)), labels=False)
        routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
        assert all(r.router_replay.replay_backward_list == [] for r in routers)  # forward-only: no FIFO entry
    finally:
        maps.remove()
        clear_replay_routes(model)
    for i, layer in enumerate([1, 2, 3]):
        assert torch.equal(maps.calls[layer][0], _expected_map(routes[:, i])), f"layer {layer}"


def test_faults_raise_replay_errors_naming_the_layer(megatron_cpu: None, tmp_path: Path) -> None:
    model = _chunk(_config(4, 1), seed=3)
    store, tokens = _store(tmp_path / "routes", 4, 1, {"a": 6, "b": 4})
    batch = store.assemble(["a", "b"], {"layout": "thd"}, tokens=[tokens["a"], tokens["b"]])
    inputs = torch.from_numpy(batch["tokens"])[None]
    try:
        with pytest.raises(ReplayError, match=r"holds decoder layers \[1, 2\]") as info:
            set_replay_routes(model, store.assemble(["a", "b"], layers=[1, 2]))
        assert info.value.layer == 3
        filled = store.assemble(["a", "b"], {"pad_policy": "fill", "fill_value": -1, "dtype": "int16"})
        with pytest.raises(ReplayError, match="expert id -1, outside") as info:
            set_replay_routes(model, filled)
        assert info.value.layer == 1
        with pytest.raises(ReplayError, match="top_k=1"):
            set_replay_routes(model, batch["routes"][..., :1], layers=[1, 2, 3])
        repeated = batch["routes"].copy()
        repeated[4, 1, 1] = repeated[4, 1, 0]
        with pytest.raises(ReplayError, match="token row 4 repeats") as info:
            set_replay_routes(model, repeated, layers=[1, 2, 3])
        assert info.value.layer == 2
        out_of_range = batch["routes"].copy()
        out_of_range[6, 2, 1] = NUM_EXPERTS
        routers = _replay._routers(model)
        for check in (_replay._check_ids, _replay._check_ids_torch):  # host kernel and device ops agree
            for bad, message, layer in ((repeated, "token row 4 repeats", 2),
                                        (out_of_range, f"token row 6 holds expert id {NUM_EXPERTS}, outside", 3)):
                with pytest.raises(ReplayError, match=message) as info:
                    check(torch.from_numpy(bad), routers, [NUM_EXPERTS] * 3)
                assert info.value.layer == layer
            check(torch.from_numpy(batch["routes"]), routers, [NUM_EXPERTS] * 3)
        with pytest.raises(ReplayError, match="cannot tell BSHD from SBHD"):
            set_replay_routes(model, {"routes": np.zeros((2, 2, 3, TOP_K), np.int32), "layers": [1, 2, 3],
                                      "num_tokens": [2, 2]})
        with pytest.raises(ReplayError, match="integer expert ids"):
            set_replay_routes(model, batch["routes"].astype(np.float32), layers=[1, 2, 3])
        with pytest.raises(ReplayError, match="lists this layer twice"):
            set_replay_routes(model, batch["routes"], layers=[1, 1, 3])
        with pytest.raises(ReplayError, match="names no layers"):
            set_replay_routes(model, batch["routes"])
        set_replay_routes(model, batch)  # 10 rows; the forward below has 8 tokens
        with pytest.raises(ReplayError, match="sees 8 tokens, the batch's routes have 10 rows") as info, \
                torch.no_grad():
            _forward(model, inputs[:, :8], labels=False)
        assert info.value.layer == 1
    finally:
        clear_replay_routes(model)
    with pytest.raises(ReplayError, match="moe_enable_routing_replay=True") as info:
        moe_layers(_chunk(_config(4, 1, replay=False), seed=3))
    assert info.value.layer == 1
    with pytest.raises(TypeError, match="sequence of them"):
        moe_layers([model, "chunk"])


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_the_batch_layout_decides_when_batch_equals_seq(megatron_cpu: None, tmp_path: Path, layout: str) -> None:
    """B == T: shapes cannot tell BSHD from SBHD, store.assemble's batch['layout'] does; a contrary layout= raises."""
    model = _chunk(_config(4, 1), seed=2)
    store, tokens = _store(tmp_path / "routes", 4, 1, {"a": 2, "b": 2})
    batch = store.assemble(["a", "b"], {"layout": layout}, tokens=[tokens["a"], tokens["b"]])
    assert batch["layout"] == layout
    assert batch["routes"].shape[:2] == (2, 2)
    sequence_major = batch["routes"] if layout == "sbhd" else batch["routes"].transpose(1, 0, 2, 3)
    routes = sequence_major.reshape(-1, 3, TOP_K)
    inputs = batch["tokens"].T if layout == "sbhd" else batch["tokens"]
    other = "sbhd" if layout == "bshd" else "bshd"
    maps = _Maps([model])
    try:
        with pytest.raises(ReplayError, match=f"layout='{other}', but the batch was assembled with layout '{layout}'"):
            set_replay_routes(model, batch, layout=other)  # type: ignore[arg-type]
        with torch.no_grad():
            set_replay_routes(model, batch)
            _forward(model, torch.from_numpy(np.ascontiguousarray(inputs)), labels=False)
    finally:
        maps.remove()
        clear_replay_routes(model)
    for i, layer in enumerate([1, 2, 3]):
        assert torch.equal(maps.calls[layer][0], _expected_map(routes[:, i])), f"layer {layer}"
