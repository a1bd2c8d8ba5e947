"""PyTorch tensors in (CPU): torch out, the same values as NumPy; qmoe.torch.MoE. Skipped
without torch. CUDA tests skip without a GPU (and without a CUDA build)."""

from __future__ import annotations

import numpy as np
import pytest

import qmoe
from conftest import read_safetensors

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def case(qwen3_case):
    return qwen3_case, read_safetensors(qwen3_case / "io.safetensors")


def test_torch_in_torch_out(case):
    d, io = case
    layer = qmoe.open(d).layer(0)
    x = torch.from_numpy(io["hidden_states"].astype(np.float32))
    lg = torch.from_numpy(io["router_logits"])
    want = layer(x.numpy(), lg.numpy())
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        out = layer(x.to(dt), lg)
        assert isinstance(out.output, torch.Tensor) and out.output.dtype == torch.float32
        assert out.topk_ids.dtype == torch.int32 and out.topk_weights.dtype == torch.float32
        assert out.output.device.type == "cpu"
        np.testing.assert_array_equal(out.output.numpy(), want.output)
        np.testing.assert_array_equal(out.topk_ids.numpy(), want.topk_ids)


def test_torch_non_contiguous(case):
    d, io = case
    layer = qmoe.open(d).layer(0)
    x = torch.from_numpy(io["hidden_states"].astype(np.float32))
    with pytest.raises(qmoe.Error, match="contiguous"):
        layer(x.t().contiguous().t(), torch.from_numpy(io["router_logits"]))
    assert layer(x.t().contiguous().t().contiguous(), torch.from_numpy(io["router_logits"])).output.shape == x.shape


def test_torch_requires_grad_input(case):
    d, io = case
    layer = qmoe.open(d).layer(0)
    x = torch.from_numpy(io["hidden_states"].astype(np.float32)).requires_grad_()
    # DLPack refuses tensors that require grad; qmoe.torch.MoE is the autograd-aware path.
    with pytest.raises(qmoe.Error, match="detach"):
        layer(x, torch.from_numpy(io["router_logits"]))


cuda_ok = qmoe.has_cuda and qmoe.cuda_available() and torch.cuda.is_available()


@pytest.mark.skipif(not cuda_ok, reason="needs a CUDA build of qmoe and a GPU")
def test_cuda_device_matches_cpu(case):
    d, io = case
    ckpt = qmoe.open(d)
    x = io["hidden_states"].astype(np.float32)
    want = ckpt.layer(0, kernel="reference")(x, io["router_logits"])
    got = ckpt.layer(0, device="cuda")(x, io["router_logits"])
    np.testing.assert_array_equal(got.topk_ids, want.topk_ids)
    err = float(np.linalg.norm(got.output - want.output) / np.linalg.norm(want.output))
    assert err < 2e-2


# ---- qmoe.torch ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moe(case):
    import qmoe.torch

    return qmoe.torch.MoE(qmoe.open(case[0]), 0, threads=2)


def test_module_forward(moe, case):
    d, io = case
    x = torch.from_numpy(io["hidden_states"].astype(np.float32))
    lg = torch.from_numpy(io["router_logits"])
    want = qmoe.open(d).layer(0)(x, lg)
    y = moe(x, lg)
    assert isinstance(moe, torch.nn.Module) and y.dtype == torch.float32
    torch.testing.assert_close(y, want.output, rtol=0, atol=0)
    y3, ids, w = moe(x.reshape(1, *x.shape).to(torch.bfloat16), lg.reshape(1, *lg.shape), return_routing=True)
    assert y3.shape == (1, *x.shape) and ids.shape == (1, x.shape[0], moe.top_k) and ids.dtype == torch.int32
    torch.testing.assert_close(y3[0], want.output, rtol=0, atol=0)
    # Any layout and requires_grad are fine through the op (it detaches and makes contiguous).
    xt = x.t().contiguous().t().requires_grad_()
    torch.testing.assert_close(moe(xt, lg).detach(), want.output, rtol=0, atol=0)
    # Without logits: the checkpoint's router.
    torch.testing.assert_close(moe(x), qmoe.open(d).layer(0)(x).output, rtol=0, atol=0)
    assert "w_mxfp4" in repr(moe)


def test_module_from_path(case):
    import qmoe.torch

    m = qmoe.torch.MoE(str(case[0]))
    assert m.hidden_size == case[1]["hidden_states"].shape[1]


def test_opcheck(moe, case):
    _, io = case
    x = torch.from_numpy(io["hidden_states"].astype(np.float32))
    lg = torch.from_numpy(io["router_logits"])
    torch.library.opcheck(torch.ops.qmoe.moe.default, (x, lg, moe.handle),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile(moe, case):
    _, io = case
    x = torch.from_numpy(io["hidden_states"].astype(np.float32))
    lg = torch.from_numpy(io["router_logits"])

    def f(x, lg):
        return moe(x, lg) * 2.0

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, lg), f(x, lg), rtol=0, atol=0)
