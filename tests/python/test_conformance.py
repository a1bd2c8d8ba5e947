"""Every conformance case through qmoe.open(...).layer(0) (conformance/README.md), with the C++
tests' tolerances: tests/cpu/test_conformance_run.cc (reference kernel: tolerance_rel_l2_fp32)
and tests/cpu/test_conformance_optimized.cc (optimized kernel: tolerance_rel_l2_fp32 for schemes
that quantize activations, tolerance_rel_l2 otherwise)."""

from __future__ import annotations

import numpy as np
import pytest

import qmoe
from conftest import CASES, bf16_as_f32, case_json, list_cases, read_safetensors, rel_l2

ALL = list_cases(include_error_cases=True)
OK = [c for c in ALL if not case_json(c).get("expect_error", False)]
ERR = [c for c in ALL if case_json(c).get("expect_error", False)]


def test_cases_are_present():
    assert len(ALL) >= 20, f"conformance cases not found under {CASES} (set QMOE_CONFORMANCE_CASES)"


def tolerance(case: dict, kernel: str) -> float:
    act_quant = qmoe.scheme_info(case["scheme"])["activations"] != "none"
    if kernel == "reference" or act_quant:
        return case["tolerance_rel_l2_fp32"]
    return case["tolerance_rel_l2"]


def check_routing(out, io):
    np.testing.assert_array_equal(out.topk_ids, io["topk_ids"])
    np.testing.assert_allclose(out.topk_weights, io["topk_weights"], rtol=1e-6, atol=0)


@pytest.mark.parametrize("kernel", ["reference", "optimized"])
@pytest.mark.parametrize("name", OK)
def test_case(name, kernel):
    c = case_json(name)
    io = read_safetensors(CASES / name / "io.safetensors")
    ckpt = qmoe.open(CASES / name)
    assert 0 in ckpt.moe_layers
    layer = ckpt.layer(0, kernel=kernel)
    assert layer.scheme == c["scheme"] or c["scheme"] == "unquantized"
    x = io["hidden_states"]  # bf16 (ml_dtypes), read as bf16
    out = layer(x, io["router_logits"])
    assert isinstance(out.output, np.ndarray) and out.output.dtype == np.float32
    assert out.output.shape == (c["T"], c["H"])
    assert out.topk_ids.dtype == np.int32 and out.topk_ids.shape == (c["T"], c["K"])
    assert out.topk_weights.dtype == np.float32 and out.topk_weights.shape == (c["T"], c["K"])
    check_routing(out, io)
    assert np.all(np.isfinite(out.output)) and np.any(out.output != 0)
    tol = tolerance(c, kernel)
    err = rel_l2(out.output, io["expected"])
    assert err <= tol, f"{name} ({kernel}): rel_l2 {err} > {tol}"

    # The checkpoint's router gives the same routing as the stored fp32 logits.
    if layer.has_router:
        np.testing.assert_array_equal(layer(x).topk_ids, out.topk_ids)

    # Tensor- and expert-parallel partial outputs.
    for kind in ("tp", "ep"):
        for rank in range(2):
            key = f"expected_{kind}2_rank{rank}"
            if key not in io:
                continue
            part = ckpt.layer(0, kernel=kernel, **{kind: (rank, 2)})
            pe = rel_l2(part(x, io["router_logits"]).output, io[key])
            assert pe <= tol, f"{name} {key} ({kernel}): rel_l2 {pe} > {tol}"


@pytest.mark.parametrize("name", ERR)
def test_error_case(name):
    c = case_json(name)
    with pytest.raises(qmoe.Error) as info:
        qmoe.open(CASES / name).layer(0, kernel="reference")
    msg = str(info.value).lower()
    assert any(k.lower() in msg for k in c["error_keywords"]), str(info.value)


def test_error_is_runtime_error():
    assert issubclass(qmoe.Error, RuntimeError)


@pytest.mark.parametrize("name", [c for c in OK if case_json(c)["T"] > 1][:3])
def test_f32_input_matches_bf16(name):
    io = read_safetensors(CASES / name / "io.safetensors")
    layer = qmoe.open(CASES / name).layer(0)
    a = layer(io["hidden_states"], io["router_logits"]).output
    b = layer(bf16_as_f32(io["hidden_states"]), io["router_logits"]).output
    np.testing.assert_array_equal(a, b)
