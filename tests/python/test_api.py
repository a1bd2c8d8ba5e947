"""The module surface: schemes, version, checkpoints, layers, argument errors."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import qmoe
from conftest import CASES, REPO, case_json, list_cases, read_safetensors, rel_l2


def test_version():
    assert isinstance(qmoe.__version__, str)
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert f"project(qmoe VERSION {qmoe.__version__}" in cmake


def test_schemes():
    names = qmoe.schemes()
    assert "w_mxfp4_a_mxfp4" in names and "nvfp4" in names and "unquantized" in names
    assert len(names) == len(set(names))
    info = qmoe.scheme_info("mxfp4")  # an alias
    assert info["name"] == "w_mxfp4_a_mxfp4" and info["bits_per_weight"] > 4
    with pytest.raises(qmoe.Error, match="w_mxfp4"):  # lists the known names
        qmoe.scheme_info("no_such_scheme")


def test_open(qwen3_case):
    ckpt = qmoe.open(qwen3_case)
    c = case_json(qwen3_case.name)
    assert ckpt.moe_layers == [0]
    assert (ckpt.hidden_size, ckpt.num_experts, ckpt.top_k) == (c["H"], c["E"], c["K"])
    assert ckpt.quantized
    assert str(qwen3_case) in repr(ckpt)
    assert qmoe.open(str(qwen3_case)).path == str(qwen3_case)


def test_open_errors(tmp_path):
    with pytest.raises(qmoe.Error, match="config.json"):
        qmoe.open(tmp_path / "does_not_exist")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(qmoe.Error):
        qmoe.open(tmp_path)
    with pytest.raises(TypeError):
        qmoe.open(3)


def test_inspect(qwen3_case):
    r = qmoe.open(qwen3_case).inspect()
    c = case_json(qwen3_case.name)
    assert r["architecture"]["hidden_size"] == c["H"]
    (layer,) = r["layers"]
    assert layer["scheme"] == c["scheme"] and layer["num_experts"] == c["E"] and layer["layer"] == 0
    assert qmoe.open(qwen3_case).inspect(0) == r
    with pytest.raises(qmoe.Error, match="layer"):
        qmoe.open(qwen3_case).inspect(7)


def cli_binary():
    p = os.environ.get("QMOE_CLI") or str(REPO / "build" / "qmoe")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


@pytest.mark.skipif(cli_binary() is None, reason="no qmoe CLI binary (set QMOE_CLI or build build/qmoe)")
@pytest.mark.parametrize("name", [c for c in list_cases(False)][:26])
def test_inspect_equals_cli(name):
    d = CASES / name
    cli = subprocess.run([cli_binary(), "inspect", str(d), "--json"], check=True, capture_output=True, text=True)
    assert qmoe.open(d).inspect() == json.loads(cli.stdout)


def test_layer_properties(qwen3_case):
    c = case_json(qwen3_case.name)
    layer = qmoe.open(qwen3_case).layer(0, threads=1)
    assert (layer.index, layer.device, layer.kernel, layer.threads) == (0, "cpu", "optimized", 1)
    assert (layer.hidden_size, layer.num_experts, layer.top_k) == (c["H"], c["E"], c["K"])
    assert layer.num_local_experts == c["E"] and layer.intermediate_size == c["I"]
    assert c["scheme"] in repr(layer)
    half = qmoe.open(qwen3_case).layer(0, tp=(1, 2), ep=(0, 2))
    assert half.intermediate_size == c["I"] // 2 and half.num_local_experts == c["E"] // 2


@pytest.mark.parametrize("kwargs, words", [
    (dict(index=5), "layer 5"),
    (dict(index=0, device="tpu"), "device 'tpu'"),
    (dict(index=0, device="cuda:x"), "device 'cuda:x'"),
    (dict(index=0, kernel="fast"), "kernel 'fast'"),
    (dict(index=0, threads=0), "threads"),
    (dict(index=0, threads=-2), "threads"),
    (dict(index=0, tp=(2, 2)), "tp_rank"),
    (dict(index=0, tp=(0, 0)), "tp_size"),
    (dict(index=0, ep=(-1, 2)), "ep_rank"),
])
def test_layer_argument_errors(qwen3_case, kwargs, words):
    with pytest.raises(qmoe.Error, match=words):
        qmoe.open(qwen3_case).layer(**kwargs)


def test_cuda_device_without_cuda_or_gpu(qwen3_case):
    if not qmoe.has_cuda:
        with pytest.raises(qmoe.Error, match="without CUDA"):
            qmoe.open(qwen3_case).layer(0, device="cuda")
        assert not qmoe.cuda_available()
    elif not qmoe.cuda_available():
        with pytest.raises(qmoe.Error, match="no CUDA device"):
            qmoe.open(qwen3_case).layer(0, device="cuda:0")
    else:
        with pytest.raises(qmoe.Error, match="CUDA device"):
            qmoe.open(qwen3_case).layer(0, device="cuda:99")


def test_bf16_activations(qwen3_case):
    # Weight-only MXFP4: the input and the intermediate rounded to bf16 once (vLLM's precision).
    io = read_safetensors(qwen3_case / "io.safetensors")
    ckpt = qmoe.open(qwen3_case)
    exact, fast = ckpt.layer(0), ckpt.layer(0, bf16_activations=True)
    assert fast.bf16_activations and not exact.bf16_activations
    a = exact(io["hidden_states"], io["router_logits"]).output
    b = fast(io["hidden_states"], io["router_logits"]).output
    assert np.all(np.isfinite(b)) and np.any(a != b)
    # One bf16 rounding (2^-9 relative) of each input and intermediate element through two GEMMs:
    # rel-L2 ~1e-3; 1e-2 as the C++ test's kBf16Act (tests/cpu/test_optimized.cc) and CUDA's kBf16.
    assert rel_l2(b, a) <= 1e-2
    # Quantized activations (W4A4): the option changes nothing.
    w4a4 = CASES / "qwen3_w_mxfp4_a_mxfp4"
    io4 = read_safetensors(w4a4 / "io.safetensors")
    c4 = qmoe.open(w4a4)
    np.testing.assert_array_equal(c4.layer(0)(io4["hidden_states"], io4["router_logits"]).output,
                                  c4.layer(0, bf16_activations=True)(io4["hidden_states"], io4["router_logits"]).output)


def test_output_unpacks(qwen3_case):
    io = read_safetensors(qwen3_case / "io.safetensors")
    out = qmoe.open(qwen3_case).layer(0)(io["hidden_states"], io["router_logits"])
    o, ids, w = out
    assert o is out.output and ids is out.topk_ids and w is out.topk_weights
    assert "LayerOutput" in repr(out)
