"""Inputs: dtypes (NumPy bf16 through ml_dtypes, f16, f32), layouts, bad values; threads."""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np
import pytest

import qmoe
from conftest import read_safetensors


@pytest.fixture(scope="module")
def case(qwen3_case):
    io = read_safetensors(qwen3_case / "io.safetensors")
    return qwen3_case, io


@pytest.fixture(scope="module")
def layer(case):
    return qmoe.open(case[0]).layer(0)


def run(layer, x, logits=None):
    return layer(x, logits)


def test_dtypes_give_the_same_output(layer, case):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    _, io = case
    x32 = io["hidden_states"].astype(np.float32)
    x16 = x32.astype(np.float16)
    assert np.array_equal(x16.astype(np.float32), x32)  # the case's bf16 values are exact in f16
    xbf = x32.astype(ml_dtypes.bfloat16)
    ref = layer(x32, io["router_logits"])
    for x in (x16, xbf):
        out = layer(x, io["router_logits"])
        np.testing.assert_array_equal(out.output, ref.output)
        np.testing.assert_array_equal(out.topk_ids, ref.topk_ids)
    # Router logits in bf16 / f16 are accepted too (widened exactly).
    out = layer(x32, io["router_logits"].astype(np.float16))
    assert out.topk_ids.shape == ref.topk_ids.shape


def test_read_only_input(layer, case):
    _, io = case
    x = io["hidden_states"].astype(np.float32)
    x.flags.writeable = False
    assert layer(x, io["router_logits"]).output.shape == x.shape


def test_non_contiguous_is_refused(layer, case):
    _, io = case
    x = io["hidden_states"].astype(np.float32)
    wide = np.zeros((x.shape[0], 2 * x.shape[1]), np.float32)
    wide[:, ::2] = x
    for bad in (wide[:, ::2], np.asfortranarray(x), x[::-1]):
        assert not bad.flags.c_contiguous
        with pytest.raises(qmoe.Error, match="contiguous"):
            layer(bad, io["router_logits"])
    # The documented fix works.
    out = layer(np.ascontiguousarray(wide[:, ::2]), io["router_logits"])
    np.testing.assert_array_equal(out.output, layer(x, io["router_logits"]).output)
    # One row: any row stride is fine (the stride of a size-1 dimension means nothing).
    one = wide[:1, : x.shape[1]]
    assert layer(one, io["router_logits"][:1]).output.shape == (1, x.shape[1])


def test_bad_inputs(layer, case):
    _, io = case
    x = io["hidden_states"].astype(np.float32)
    T, H = x.shape
    lg = io["router_logits"]
    cases = [
        (x[0], lg, "2-D"),
        (x[None], lg, "2-D"),
        (x.astype(np.float64), lg, "float64"),
        (x.astype(np.int32), lg, "int32"),
        (x[:, : H // 2].copy(), lg, "hidden size"),
        (np.zeros((0, H), np.float32), lg[:0], "tokens"),
        (x, lg[:, :3].copy(), "router_logits"),
        (x, lg[:2].copy(), "router_logits"),
        ([[1.0] * H], None, "2-D tensor"),
        ("not an array", None, "2-D tensor"),
    ]
    for xs, ls, words in cases:
        with pytest.raises(qmoe.Error, match=words):
            layer(xs, ls)
    bad = x.copy()
    bad[3, 5] = np.nan
    with pytest.raises(qmoe.Error, match="token 3"):
        layer(bad, lg)
    bad = lg.copy()
    bad[2, 1] = np.inf
    with pytest.raises(qmoe.Error, match="token 2"):
        layer(x, bad)


def test_threads_and_kernels_agree(case):
    d, io = case
    ckpt = qmoe.open(d)
    x, lg = io["hidden_states"], io["router_logits"]
    ref = ckpt.layer(0, kernel="reference")(x, lg).output
    outs = [ckpt.layer(0, threads=n)(x, lg).output for n in (1, 2, 64)]  # 64: bounded to the machine
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    err = float(np.linalg.norm(outs[0] - ref) / np.linalg.norm(ref))
    assert err < 2e-2


def test_concurrent_calls(layer, case):
    _, io = case
    x = io["hidden_states"].astype(np.float32)
    lg = io["router_logits"]
    want = layer(x, lg).output
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        outs = list(pool.map(lambda _: layer(x, lg).output, range(16)))
    for o in outs:
        np.testing.assert_array_equal(o, want)


def test_gil_is_released(case):
    # While one thread runs a large batch, another Python thread keeps running.
    d, io = case
    layer = qmoe.open(d).layer(0, kernel="reference", threads=1)
    x = np.tile(io["hidden_states"].astype(np.float32), (16, 1))
    lg = np.tile(io["router_logits"], (16, 1))
    import threading
    import time

    ticks = 0
    stop = threading.Event()

    def spin():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        t0 = time.perf_counter()
        layer(x, lg)
        dt = time.perf_counter() - t0
    finally:
        stop.set()
        t.join()
    if dt > 0.05:
        assert ticks >= 5, f"the other thread ran {ticks} times in {dt:.3f} s"
