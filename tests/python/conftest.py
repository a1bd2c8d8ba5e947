"""Shared helpers of the Python tests: where the conformance cases are, a small safetensors reader
(NumPy only), and the scale-free error the cases are judged by (conformance/README.md)."""

from __future__ import annotations

import json
import os
import pathlib
import struct

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# As the C++ tests (tests/cpu/conformance_util.h): ../shared/conformance/cases beside the
# repository; QMOE_CONFORMANCE_CASES overrides it (e.g. for a clone elsewhere).
CASES = pathlib.Path(os.environ.get("QMOE_CONFORMANCE_CASES", REPO.parent / "shared" / "conformance" / "cases"))


def list_cases(include_error_cases: bool = True) -> list[str]:
    if not CASES.is_dir():
        return []
    names = []
    for d in sorted(CASES.iterdir()):
        if (d / "case.json").is_file():
            if include_error_cases or not case_json(d.name).get("expect_error", False):
                names.append(d.name)
    return names


def case_json(name: str) -> dict:
    return json.loads((CASES / name / "case.json").read_text())


_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I8": np.int8, "U8": np.uint8,
           "F64": np.float64, "I64": np.int64, "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn"}


def read_safetensors(path: os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file (BF16 / F8 through ml_dtypes, raw bytes otherwise)."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dt = _DTYPES.get(info["dtype"])
        if isinstance(dt, str):
            try:
                import ml_dtypes
            except ImportError:  # a machine without it (the GPU image): bf16 widened exactly to f32
                if dt != "bfloat16":
                    raise
                bits = np.frombuffer(data[begin:end], np.uint16).astype(np.uint32) << 16
                out[name] = bits.view(np.float32).reshape(info["shape"]).copy()
                continue
            dt = getattr(ml_dtypes, dt)
        if dt is None:  # packed sub-byte formats: the bytes
            out[name] = np.frombuffer(data[begin:end], np.uint8).copy()
        else:
            out[name] = np.frombuffer(data[begin:end], dt).reshape(info["shape"]).copy()
    return out


def rel_l2(got, want) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    num = float(np.sum((got - want) ** 2))
    den = float(np.sum(want ** 2))
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


def bf16_as_f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


@pytest.fixture(scope="session")
def qwen3_case() -> pathlib.Path:
    d = CASES / "qwen3_w_mxfp4"
    if not d.is_dir():
        pytest.fail(f"conformance case {d} is missing (set QMOE_CONFORMANCE_CASES)")
    return d
