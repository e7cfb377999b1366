"""The CPU shims of rlvr.workers.megatron.cpu_shims: the installed megatron-core is one they were
checked on, every site they patch or avoid still looks the way the shims assume (an upgrade that
changes one fails here, loudly, instead of silently running CUDA code paths), and the shims work."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core")

import megatron.core  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax  # noqa: E402
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding  # noqa: E402
from megatron.core.models.common.language_module.language_module import LanguageModule  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.tensor_parallel import random as megatron_random  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.transformer_block import TransformerBlock  # noqa: E402
from megatron.core.tensor_parallel import mappings as megatron_mappings  # noqa: E402
from megatron.core.transformer.moe import moe_utils as megatron_moe_utils  # noqa: E402
from megatron.core.transformer.moe.moe_utils import RouterGatingLinearFunction  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402
from megatron.core.transformer.moe.token_dispatcher import (  # noqa: E402
    MoEAllGatherTokenDispatcher,
    MoEAlltoAllTokenDispatcher,
)
from megatron.core.utils import GlobalMemoryBuffer  # noqa: E402

from rlvr.workers.megatron.cpu_shims import (  # noqa: E402
    MODEL_PARALLEL_RNG,
    SUPPORTED_VERSIONS,
    CpuMemoryBuffer,
    CpuRNGStatesTracker,
    apply_cpu_shims,
    apply_te_absent_shim,
    gather_along_first_dim,
    reduce_scatter_along_first_dim,
)

UPGRADE = "megatron-core changed a site that rlvr's CPU shims rely on: re-check rlvr/workers/megatron/cpu_shims.py"


def _source(obj) -> str:
    return inspect.getsource(obj)


def _file_source(module, name: str) -> str:
    """The module-level function ``name`` as ``module``'s file defines it (the installed shims replace
    the module's attribute, so the function object in it may be rlvr's)."""
    text = inspect.getsource(module)
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node)


def test_the_installed_version_is_one_the_shims_were_checked_on():
    assert megatron.core.__version__ in SpecifierSet(SUPPORTED_VERSIONS), UPGRADE
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    assert f'"megatron-core{SUPPORTED_VERSIONS}"' in pyproject.read_text()  # the rlvr[megatron] pin is this range


def test_the_patched_sites_still_assume_cuda():
    """Shim 1: the tracker's add/fork use CUDA generator states; shim 2: the buffer allocates on
    CUDA; both objects are module globals that attention reaches on every forward."""
    tracker = megatron_random.CudaRNGStatesTracker
    assert "torch.cuda.manual_seed" in _source(tracker.add), UPGRADE
    assert "_get_cuda_rng_state" in _source(tracker.fork) and "_set_cuda_rng_state" in _source(tracker.fork), UPGRADE
    assert "torch.cuda.current_device()" in _source(GlobalMemoryBuffer.get_tensor), UPGRADE
    assert {"_CUDA_RNG_STATE_TRACKER", "_CUDA_RNG_STATE_TRACKER_INITIALIZED"} <= set(vars(megatron_random)), UPGRADE
    assert "_GLOBAL_MEMORY_BUFFER" in vars(parallel_state), UPGRADE
    attention = _source(DotProductAttention.forward)
    assert "get_cuda_rng_tracker().fork()" in attention and "get_global_memory_buffer()" in attention, UPGRADE
    assert "if _CUDA_RNG_STATE_TRACKER_INITIALIZED:\n        return" in _source(megatron_random.initialize_rng_tracker)


def test_the_avoided_sites_are_still_avoided():
    """Avoided site 6: RoPE's CUDA ``inv_freq`` is only built for position_embedding_type rope/yarn/mrope;
    site 7: the default causal mask only without a mask; site 8: the ``.cuda()`` copy of a tied
    embedding only for tied embeddings over several stages; a later stage reads its input from
    ``set_input_tensor``."""
    assert "torch.cuda.current_device()" in _source(RotaryEmbedding.__init__), UPGRADE
    model_init = _source(GPTModel.__init__)
    assert "if self.position_embedding_type == 'rope'" in model_init, UPGRADE
    assert "self.position_embedding_type == 'none'" not in model_init, UPGRADE
    softmax = _source(FusedScaleMaskSoftmax.forward_torch_softmax)
    assert "mask is None and sq > 1" in softmax and "get_default_causal_mask" in softmax, UPGRADE
    tied = _source(LanguageModule.setup_embeddings_and_output_layer)
    assert "weight.data.cuda()" in tied and "pipeline_model_parallel_size == 1" in tied, UPGRADE
    assert "hidden_states = self.input_tensor" in _source(TransformerBlock.forward), UPGRADE


def test_the_cpu_rng_tracker_forks_the_cpu_generator():
    tracker = CpuRNGStatesTracker()
    tracker.add(MODEL_PARALLEL_RNG, 1234)
    torch.manual_seed(0)
    outer = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer)  # the caller's stream is untouched
    with tracker.fork():
        second = torch.rand(3)
    expected = torch.rand(6, generator=torch.Generator().manual_seed(1234))
    assert torch.equal(torch.cat([first, second]), expected)  # the forked stream continues
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add("other", 1234)


def test_the_moe_sites_still_need_the_shims():
    """Shim 4: the first-dimension all-gather / reduce-scatter allocate on CUDA and the allgather
    dispatcher calls them; shim 6: moe_utils leaves te_general_gemm undefined without transformer-engine
    and the router's gating reads it; the router's gating moves its weight to CUDA (rlvr's router
    subclass overrides it); the alltoall dispatcher needs CUDA streams (why rlvr uses allgather)."""
    for name in ("_gather_along_first_dim", "_reduce_scatter_along_first_dim"):  # as the file has them: once
        assert "device=torch.cuda.current_device()" in _file_source(megatron_mappings, name), UPGRADE  # shimmed
    dispatch = _source(MoEAllGatherTokenDispatcher)
    assert "gather_from_sequence_parallel_region" in dispatch and "reduce_scatter_to_sequence_parallel_region" in dispatch
    assert "te_general_gemm" in _source(RouterGatingLinearFunction.forward), UPGRADE
    assert "HAVE_TE = False" in inspect.getsource(megatron_moe_utils) and "te_general_gemm = None" not in \
        inspect.getsource(megatron_moe_utils), UPGRADE
    assert "torch.cuda.current_device()" in _source(TopKRouter.gating), UPGRADE
    assert "torch.cuda.Stream()" in _source(MoEAlltoAllTokenDispatcher.__init__), UPGRADE
    assert "torch.cuda.stream(" in _source(MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize), UPGRADE


def test_the_moe_shims_gather_and_reduce_scatter_on_cpu(tmp_path):
    """Shim 4's collectives on a gloo group of one rank (the sizes pass through) and of the world."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        group = dist.new_group([0])
        x = torch.arange(6.0).view(3, 2)
        assert gather_along_first_dim(x, group) is x and reduce_scatter_along_first_dim(x, group) is x
    finally:
        dist.destroy_process_group()
    saved = getattr(megatron_moe_utils, "te_general_gemm", "absent")
    try:
        apply_te_absent_shim()
        assert megatron_moe_utils.HAVE_TE or megatron_moe_utils.te_general_gemm is None
    finally:
        if saved == "absent":
            del megatron_moe_utils.te_general_gemm


def test_apply_cpu_shims_installs_cpu_objects():
    saved = (megatron_random._CUDA_RNG_STATE_TRACKER, megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED,
             parallel_state._GLOBAL_MEMORY_BUFFER)
    try:
        apply_cpu_shims(99)
        assert isinstance(megatron_random.get_cuda_rng_tracker(), CpuRNGStatesTracker)
        buffer = parallel_state.get_global_memory_buffer()
        assert isinstance(buffer, CpuMemoryBuffer)
        view = buffer.get_tensor((2, 3), torch.float32, "mpu")
        assert view.device.type == "cpu" and view.shape == (2, 3)
        assert buffer.get_tensor((1, 2), torch.float32, "mpu").data_ptr() == view.data_ptr()  # reused
    finally:
        (megatron_random._CUDA_RNG_STATE_TRACKER, megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED,
         parallel_state._GLOBAL_MEMORY_BUFFER) = saved
