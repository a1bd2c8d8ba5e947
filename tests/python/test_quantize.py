"""qmoe.quantize: the conformance source/ checkpoints quantize to the cases' bytes; progress."""

from __future__ import annotations

import numpy as np
import pytest

import qmoe
from conftest import CASES, case_json, read_safetensors

NAME = "qwen3_w_mxfp4_a_mxfp4"


@pytest.fixture(scope="module")
def source():
    d = CASES / NAME / "source"
    if not d.is_dir():
        pytest.fail(f"{d} is missing")
    return d


def test_quantize_reproduces_the_case(source, tmp_path):
    calls = []
    report = qmoe.quantize(source, tmp_path / "q", case_json(NAME)["scheme"], threads=2,
                           progress=lambda stage, done, total: calls.append((stage, done, total)))
    assert report["quantized_linears"] > 0 and "model.safetensors" in report["files"]
    got = read_safetensors(tmp_path / "q" / "model.safetensors")
    want = read_safetensors(CASES / NAME / "model.safetensors")
    compared = 0
    for name, t in want.items():
        if name.endswith((".weight", ".weight_scale")) and ".experts." in name:
            np.testing.assert_array_equal(got[name].view(np.uint8), t.view(np.uint8), err_msg=name)
            compared += 1
    assert compared > 0
    assert calls and calls[-1][1] == calls[-1][2]
    assert all(stage.startswith("qmoe quantize") for stage, _, _ in calls)
    assert all(b[1] >= a[1] for a, b in zip(calls, calls[1:]) if a[0] == b[0])
    # The result loads and runs.
    assert qmoe.open(tmp_path / "q").layer(0).scheme == case_json(NAME)["scheme"]


def test_quantize_quiet_and_tqdm(source, tmp_path):
    qmoe.quantize(source, tmp_path / "a", "w_mxfp4", progress=False)
    qmoe.quantize(source, tmp_path / "b", "w_mxfp4")  # tqdm when installed, else stderr lines
    a = read_safetensors(tmp_path / "a" / "model.safetensors")
    b = read_safetensors(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys()


def test_callback_exception_stops_the_job(source, tmp_path):
    class Stop(Exception):
        pass

    def cb(stage, done, total):
        if done > 0:
            raise Stop("enough")

    with pytest.raises(Stop, match="enough"):
        qmoe.quantize(source, tmp_path / "x", "w_mxfp4", threads=2, progress=cb)
    assert not (tmp_path / "x").exists()


def test_quantize_errors(source, tmp_path):
    with pytest.raises(qmoe.Error, match="w_mxfp4"):
        qmoe.quantize(source, tmp_path / "x", "no_such_scheme")
    with pytest.raises(qmoe.Error, match="re:"):
        qmoe.quantize(source, tmp_path / "x", "w_mxfp4", exclude=["re:("])
    with pytest.raises(qmoe.Error):
        qmoe.quantize(tmp_path / "missing", tmp_path / "x", "w_mxfp4")
    with pytest.raises(qmoe.Error, match="calib"):
        qmoe.quantize(source, tmp_path / "x", "w_fp8_tensor_a_fp8_static", progress=False)
    with pytest.raises(TypeError):
        qmoe.quantize(source, tmp_path / "x", "w_mxfp4", progress="yes")
    assert not (tmp_path / "x").exists()
