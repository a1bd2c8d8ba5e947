"""The device path: PyTorch CUDA tensors into a layer opened with device="cuda" run the whole layer
(router, routing, experts, shared expert) on the GPU through cuda::CudaLayer — read in place,
outputs allocated by torch on the same device, the work queued on the caller's current stream, no
host synchronisation (proved by capturing it in a CUDA graph, where a synchronisation or a host copy
is an error). Skipped without torch, a CUDA build of qmoe, or a GPU.

Tolerances: the case's tolerance_rel_l2_fp32 for the output (the CUDA kernels are fp32-accurate,
test_cuda's CudaLayerConformance holds them to it as well); routing ids identical, weights within
4e-6 relative (device softmax order and expf, as tests/cuda/test_routing.cc)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import qmoe
from conftest import CASES, case_json, list_cases, read_safetensors, rel_l2

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not (qmoe.has_cuda and qmoe.cuda_available() and torch.cuda.is_available()),
    reason="needs a CUDA build of qmoe and a GPU")

OK = list_cases(include_error_cases=False)
WEIGHT_REL = 4e-6


def device_inputs(io, dtype=torch.bfloat16):
    x = torch.from_numpy(np.asarray(io["hidden_states"]).astype(np.float32)).to(dtype).cuda()
    lg = torch.from_numpy(io["router_logits"]).cuda()
    return x, lg


def check_routing(out, io):
    np.testing.assert_array_equal(out.topk_ids.cpu().numpy(), io["topk_ids"])
    np.testing.assert_allclose(out.topk_weights.cpu().numpy(), io["topk_weights"], rtol=WEIGHT_REL, atol=0)


@pytest.mark.parametrize("name", OK)
def test_case_on_device(name):
    c = case_json(name)
    io = read_safetensors(CASES / name / "io.safetensors")
    layer = qmoe.open(CASES / name).layer(0, device="cuda")
    x, lg = device_inputs(io)
    out = layer(x, lg)
    assert out.output.is_cuda and out.output.dtype == torch.float32 and out.output.shape == (c["T"], c["H"])
    assert out.topk_ids.is_cuda and out.topk_ids.dtype == torch.int32 and out.topk_ids.shape == (c["T"], c["K"])
    assert out.topk_weights.is_cuda and out.topk_weights.dtype == torch.float32
    check_routing(out, io)
    tol = c["tolerance_rel_l2_fp32"]
    err = rel_l2(out.output.cpu().numpy(), io["expected"])
    assert err <= tol, f"{name}: rel_l2 {err} > {tol}"
    # bf16 / f16 / f32 inputs of the same values: the same output, bit for bit.
    out32 = layer(x.float(), lg)
    torch.testing.assert_close(out32.output, out.output, rtol=0, atol=0)
    # The router on the device (from the hidden states) picks the case's experts.
    if layer.has_router:
        r = layer(x)
        check_routing(r, io)
        assert rel_l2(r.output.cpu().numpy(), io["expected"]) <= tol
    # Host tensors on the same layer: the same routing, the same output within the tolerance.
    h = layer(x.cpu(), lg.cpu())
    assert isinstance(h.output, torch.Tensor) and h.output.device.type == "cpu"
    np.testing.assert_array_equal(h.topk_ids.numpy(), out.topk_ids.cpu().numpy())
    assert rel_l2(h.output.numpy(), out.output.cpu().numpy()) <= tol


@pytest.fixture(scope="module")
def qwen3():
    d = CASES / "qwen3_w_mxfp4_a_mxfp4"
    return d, read_safetensors(d / "io.safetensors")


def test_side_stream_is_used(qwen3):
    d, io = qwen3
    layer = qmoe.open(d).layer(0, device="cuda")
    x, lg = device_inputs(io)
    want = layer(x, lg).output
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        # x2 is written on s after a long wait there; the layer must read it on s (its current
        # stream), after the write — read on another stream it would see x2 before it is written.
        for _ in range(3):
            torch.cuda._sleep(20_000_000)
            x2 = x * 1.0
            got = layer(x2, lg).output
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # An explicit stream argument (an int cudaStream_t) works the same.
    got2 = layer(x, lg, stream=torch.cuda.current_stream().cuda_stream).output
    torch.testing.assert_close(got2, want, rtol=0, atol=0)


@pytest.mark.parametrize("with_logits", [True, False])
def test_cuda_graph_capture_and_replay(qwen3, with_logits):
    d, io = qwen3
    layer = qmoe.open(d).layer(0, device="cuda")
    x, lg = device_inputs(io)
    static_x = x.clone()
    static_lg = lg.clone() if with_logits else None
    layer.reserve(x.shape[0])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = layer(static_x, static_lg)
    gen = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(3):
        new_x = torch.randn(x.shape, device="cuda", generator=gen).to(x.dtype)
        static_x.copy_(new_x)
        if with_logits:
            static_lg.copy_(torch.randn(lg.shape, device="cuda", generator=gen))
        g.replay()
        eager = layer(static_x, static_lg)
        torch.testing.assert_close(static_out.output, eager.output, rtol=0, atol=0)
        torch.testing.assert_close(static_out.topk_ids, eager.topk_ids, rtol=0, atol=0)


def test_threads_on_their_own_streams(qwen3):
    d, io = qwen3
    layer = qmoe.open(d).layer(0, device="cuda")
    x, lg = device_inputs(io)
    want = layer(x, lg).output.clone()
    errors = []

    def work():
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for _ in range(5):
                    got = layer(x, lg).output
                s.synchronize()
                if not torch.equal(got, want):
                    errors.append("mismatch")
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_device_input_errors(qwen3):
    d, io = qwen3
    ckpt = qmoe.open(d)
    layer = ckpt.layer(0, device="cuda")
    x, lg = device_inputs(io)
    with pytest.raises(qmoe.Error, match="device='cuda:0'"):
        ckpt.layer(0)(x, lg)  # a CPU layer
    with pytest.raises(qmoe.Error, match="one device"):
        layer(x, lg.cpu())
    with pytest.raises(qmoe.Error, match="contiguous"):
        layer(x.t().contiguous().t(), lg)
    with pytest.raises(qmoe.Error, match="dtype"):
        layer(x.to(torch.int32), lg)
    with pytest.raises(qmoe.Error, match="detach"):
        layer(x.float().requires_grad_(), lg)
    with pytest.raises(qmoe.Error, match="hidden size"):
        layer(x[:, :-1].contiguous(), lg)
    with pytest.raises(qmoe.Error, match="router_logits"):
        layer(x, lg[:, :-1].contiguous())
    with pytest.raises(qmoe.Error, match="stream"):
        layer(x.cpu(), lg.cpu(), stream=0)


def test_torch_module_on_device(qwen3):
    import qmoe.torch

    d, io = qwen3
    moe = qmoe.torch.MoE(qmoe.open(d), 0, device="cuda")
    x, lg = device_inputs(io)
    want = moe.layer(x, lg)
    y, ids, w = moe(x, lg, return_routing=True)
    assert y.is_cuda and ids.is_cuda
    torch.testing.assert_close(y, want.output, rtol=0, atol=0)
    torch.testing.assert_close(ids, want.topk_ids, rtol=0, atol=0)
    # The custom op inside a captured graph.
    static_x = x.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = moe(static_x, lg)
    static_x.copy_(x * 0.5)
    g.replay()
    torch.testing.assert_close(static_y, moe(static_x, lg), rtol=0, atol=0)
    # torch.compile traces the op as one node.
    compiled = torch.compile(lambda a, b: moe(a, b) * 2.0, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, lg), want.output * 2.0, rtol=0, atol=0)
