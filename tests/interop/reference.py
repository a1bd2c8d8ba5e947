"""A small torch reference of one Quark-quantized MoE block as vLLM means it, written from the spec
(../shared/spec/quark-moe.md §6, §8, §9, §10 and the binding decisions of §16), not from vLLM's or
Quark's code. It reads a checkpoint's tensors by their Quark names and computes the layer with the
precision chain of §16.6: weights dequantized exactly, GEMMs in float64, intermediates in float32,
activations quantize-dequantized from float32 exactly where the scheme says, router weight in
float32, top-k sum in float32.

Only what the interop test needs: Qwen3-MoE / Mixtral naming (gate, up, down per expert), SiLU,
softmax top-k routing, and the schemes qmoe's registry lists for Quark's weight formats.
"""

from __future__ import annotations

import dataclasses

import torch

F32 = torch.float32
F64 = torch.float64

# ---------------------------------------------------------------------------------------------
# Element formats (§10): value grids, decoders, round-to-nearest-even with saturation.


@dataclasses.dataclass(frozen=True)
class MiniFloat:
    ebits: int
    mbits: int
    bias: int
    max: float
    emax: int  # exponent of the largest power of two <= max (the MX shared-exponent rule, §10.4)


E2M1 = MiniFloat(2, 1, 1, 6.0, 2)
E2M3 = MiniFloat(2, 3, 1, 7.5, 2)
E3M2 = MiniFloat(3, 2, 3, 28.0, 4)
MX_ELEMENTS = {"fp4": E2M1, "fp6_e2m3": E2M3, "fp6_e3m2": E3M2}


def decode_minifloat(codes: torch.Tensor, f: MiniFloat) -> torch.Tensor:
    """Codes (sign | exponent | mantissa, 1 + ebits + mbits bits) → float32 values, exactly."""
    c = codes.to(torch.int64)
    sign = (c >> (f.ebits + f.mbits)) & 1
    e = (c >> f.mbits) & ((1 << f.ebits) - 1)
    m = (c & ((1 << f.mbits) - 1)).to(F64)
    normal = (1.0 + m / (1 << f.mbits)) * torch.pow(2.0, (e - f.bias).to(F64))
    sub = m / (1 << f.mbits) * 2.0 ** (1 - f.bias)
    v = torch.where(e == 0, sub, normal)
    return torch.where(sign == 1, -v, v).to(F32)


def round_minifloat(y: torch.Tensor, f: MiniFloat) -> torch.Tensor:
    """Round float values to the format's grid (nearest, ties to even), saturating at ±max."""
    y = y.to(F64)
    a = y.abs().clamp(max=f.max)
    # exponent of each value, never below the smallest normal's (subnormals share its step)
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=1 - f.bias)
    step = torch.pow(2.0, e - f.mbits)
    q = torch.round(a / step) * step  # torch.round: half to even
    q = q.clamp(max=f.max)
    return (torch.sign(y) * q).to(F32)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[rows, K/2] bytes → [rows, K] codes; element 2j in the low nibble (§10.1)."""
    p = packed.to(torch.int64)
    return torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1).reshape(p.shape[0], -1)


def unpack_fp6(packed: torch.Tensor) -> torch.Tensor:
    """[rows, 3K/4] bytes → [rows, K] codes; 4 values per little-endian 24-bit word (§10.2)."""
    p = packed.to(torch.int64).reshape(packed.shape[0], -1, 3)
    w = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
    return torch.stack([(w >> (6 * i)) & 0x3F for i in range(4)], dim=-1).reshape(packed.shape[0], -1)


def fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float32 → nearest E4M3FN value (ties to even), saturating at ±448, back as float32."""
    return x.to(F32).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(F32)


# ---------------------------------------------------------------------------------------------
# Activation quantize-dequantize (§9.1, §10.4–10.8), from float32 values.


def mx_shared_scale(amax: torch.Tensor, f: MiniFloat) -> torch.Tensor:
    """The "even" rule (§10.4): round the amax mantissa at the element's precision, keep the power of
    two, subtract emax, clamp to E8M0's range."""
    bits = amax.to(F32).contiguous().view(torch.int32).to(torch.int64)
    bits = (bits + (1 << (22 - f.mbits))) & 0x7F800000
    p2 = bits.to(torch.int32).view(F32).to(F64)
    p2 = torch.where(amax == 0, torch.full_like(p2, 2.0 ** -126), p2)
    shared = torch.clamp(torch.floor(torch.log2(p2)) - f.emax, -127, 127)
    return torch.pow(2.0, shared)


def qdq_mx(x: torch.Tensor, f: MiniFloat, block: int = 32) -> torch.Tensor:
    t, k = x.shape
    xb = x.to(F32).reshape(t, k // block, block)
    scale = mx_shared_scale(xb.abs().amax(dim=-1), f).unsqueeze(-1)
    q = round_minifloat(xb.to(F64) / scale, f)
    return (q.to(F64) * scale).to(F32).reshape(t, k)


def qdq_nvfp4(x: torch.Tensor, gs: float) -> torch.Tensor:
    """§10.6 with the quantization-direction global scale gs (float32 arithmetic, correctly rounded)."""
    t, k = x.shape
    xb = x.to(F32).reshape(t, k // 16, 16)
    gs32 = torch.tensor(gs, dtype=F32)
    s = fp8_e4m3(gs32 * xb.abs().amax(dim=-1) / 6.0).unsqueeze(-1)
    inv = torch.where(s == 0, torch.zeros_like(s), gs32 / torch.where(s == 0, torch.ones_like(s), s))
    q = round_minifloat((xb * inv).clamp(-6.0, 6.0), E2M1)
    return (q * (s / gs32)).reshape(t, k)


def qdq_fp8_static(x: torch.Tensor, s: float) -> torch.Tensor:
    s32 = torch.tensor(s, dtype=F32)
    return fp8_e4m3(x.to(F32) * (1.0 / s32)) * s32


# FP8 quantizes as x · (1/s) with the float32 reciprocal (§9.1), never x / s: bf16 inputs put many
# x / s exactly on an E4M3 tie, where the two round apart (measured here: 0.7% rel-L2 on a layer).
def qdq_fp8_per_token(x: torch.Tensor) -> torch.Tensor:
    s = torch.clamp(x.abs().amax(dim=-1, keepdim=True) / 448.0, min=1.0 / (448.0 * 512.0))
    return fp8_e4m3(x * (1.0 / s)) * s


def qdq_fp8_per_tensor(x: torch.Tensor) -> torch.Tensor:
    s = x.abs().amax() / 448.0
    return fp8_e4m3(x * (1.0 / s)) * s


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    # in float64: floor(|x| + 0.5) in float32 rounds 0.49999997 up
    return (torch.sign(x) * torch.floor(x.to(F64).abs() + 0.5)).to(x.dtype)


def qdq_int8_static(x: torch.Tensor, s: float) -> torch.Tensor:
    s32 = torch.tensor(s, dtype=F32)
    return torch.clamp(torch.round(x / s32), -128, 127) * s32


def qdq_int8_per_token(x: torch.Tensor) -> torch.Tensor:
    amax = torch.clamp(x.abs().amax(dim=-1, keepdim=True), min=1e-10)
    # 127 / amax correctly rounded (§16.8): a tensor division, not `127.0 / amax`, which torch
    # evaluates as amax.reciprocal() * 127 (two roundings; it flips codes at ties).
    inv = torch.div(torch.full_like(amax, 127.0), amax)
    return round_half_away(x * inv) * (amax / 127.0)


# ---------------------------------------------------------------------------------------------
# Weights: one Linear's exact float64 value from its Quark tensors (checkpoint-format.md §4).


def scalar(t: torch.Tensor) -> float:
    assert t.numel() == 1, t.shape
    return float(t.reshape(()).to(F64))


def dequant_linear(tensors: dict, prefix: str, fmt: str) -> torch.Tensor:
    w = tensors[prefix + ".weight"]
    if fmt in MX_ELEMENTS:
        f = MX_ELEMENTS[fmt]
        codes = unpack_fp4(w) if fmt == "fp4" else unpack_fp6(w)
        scale = torch.pow(2.0, tensors[prefix + ".weight_scale"].to(F64) - 127)  # E8M0
        vals = decode_minifloat(codes, f).to(F64)
        return vals * scale.repeat_interleave(32, dim=1)
    if fmt == "nvfp4":
        vals = decode_minifloat(unpack_fp4(w), E2M1).to(F64)
        block = tensors[prefix + ".weight_scale"].to(F32).to(F64)
        return vals * (block * scalar(tensors[prefix + ".weight_scale_2"])).repeat_interleave(16, dim=1)
    s = tensors[prefix + ".weight_scale"].to(F64)
    q = w.to(F64)
    if s.numel() == 1:
        return q * s.reshape(())
    return q * s.reshape(-1, 1)  # per output channel


# ---------------------------------------------------------------------------------------------
# The scheme as the reference computes it.


@dataclasses.dataclass(frozen=True)
class Scheme:
    weight: str  # fp4 | fp6_e2m3 | fp6_e3m2 | nvfp4 | fp8 | int8
    weight_per_tensor: bool = False  # FP8 / INT8: per-tensor (else per-channel)
    act: str | None = None  # None (weight only) | fp4 | fp6_* | nvfp4 | fp8 | int8
    act_mode: str | None = None  # static | dyn_token | dyn_tensor (FP8 / INT8)


@dataclasses.dataclass
class Expert:
    w13: torch.Tensor  # [2I, H] float64: gate rows, then up rows
    w2: torch.Tensor  # [H, I]


def _requant_to_max(tensors: dict, gate: str, up: str, scheme: Scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor w1/w3 scales → one per expert (max), weights requantized to it through fp16 (§6.1 /
    §6.2 load-time step, §16.2)."""
    s1 = scalar(tensors[gate + ".weight_scale"])
    s3 = scalar(tensors[up + ".weight_scale"])
    smax = max(s1, s3)
    rows = []
    for name, s in ((gate, s1), (up, s3)):
        q = tensors[name + ".weight"]
        deq = (q.to(torch.float16) * torch.tensor(s, dtype=F32)).to(F32)  # fp16 arithmetic, as the seed
        if scheme.weight == "fp8":
            rq = fp8_e4m3(deq * (1.0 / torch.tensor(smax, dtype=F32)))
        else:
            rq = torch.clamp(torch.round(deq / torch.tensor(smax, dtype=F32)), -128, 127)
        rows.append(rq.to(F64) * smax)
    return rows[0], rows[1]


class Layer:
    """One MoE layer's experts and router from a checkpoint's tensors."""

    def __init__(self, tensors: dict, experts_prefix: str, router_name: str, names: tuple[str, str, str],
                 num_experts: int, top_k: int, renormalize: bool, scheme: Scheme):
        self.scheme, self.top_k, self.renormalize = scheme, top_k, renormalize
        self.router = tensors[router_name].to(F32)
        gate_n, up_n, down_n = names
        self.experts = []
        in13, in2, g13, g2 = [], [], [], []
        for e in range(num_experts):
            p = f"{experts_prefix}.{e}."
            gate, up, down = p + gate_n, p + up_n, p + down_n
            if scheme.weight in ("fp8", "int8") and scheme.weight_per_tensor:
                wg, wu = _requant_to_max(tensors, gate, up, scheme)
            else:
                wg = dequant_linear(tensors, gate, scheme.weight)
                wu = dequant_linear(tensors, up, scheme.weight)
            self.experts.append(Expert(torch.cat([wg, wu]), dequant_linear(tensors, down, scheme.weight)))
            if scheme.act_mode == "static":
                in13 += [scalar(tensors[gate + ".input_scale"]), scalar(tensors[up + ".input_scale"])]
                in2.append(scalar(tensors[down + ".input_scale"]))
            if scheme.act == "nvfp4":
                g13 += [scalar(tensors[gate + ".input_scale_2"]), scalar(tensors[up + ".input_scale_2"])]
                g2.append(scalar(tensors[down + ".input_scale_2"]))
        # Static input scales: max over experts (and over gate / up, which see the same input) (§16.2).
        self.a13 = max(in13) if in13 else None
        self.a2 = max(in2) if in2 else None
        # NVFP4: the quantization-direction global scale is 1 / max(input_scale_2) (§6.4, §16.1).
        self.gs13 = 1.0 / max(g13) if g13 else None
        self.gs2 = 1.0 / max(g2) if g2 else None

    def qdq(self, x: torch.Tensor, which: int) -> torch.Tensor:
        s = self.scheme
        if s.act is None:
            return x
        if s.act in MX_ELEMENTS:
            return qdq_mx(x, MX_ELEMENTS[s.act])
        if s.act == "nvfp4":
            return qdq_nvfp4(x, self.gs13 if which == 1 else self.gs2)
        static = self.a13 if which == 1 else self.a2
        if s.act == "fp8":
            if s.act_mode == "static":
                return qdq_fp8_static(x, static)
            return qdq_fp8_per_token(x) if s.act_mode == "dyn_token" else qdq_fp8_per_tensor(x)
        if s.act == "int8":
            return qdq_int8_static(x, static) if s.act_mode == "static" else qdq_int8_per_token(x)
        raise ValueError(s.act)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over all experts, the K largest (ties → lower id), optional renormalization (§8)."""
        p = torch.softmax(logits.to(F32), dim=-1)
        w, ids = torch.topk(p, self.top_k, dim=-1, sorted=True)
        if self.renormalize:
            w = w / w.sum(dim=-1, keepdim=True)
        return ids.to(torch.int32), w.to(F32)

    def __call__(self, x: torch.Tensor, logits: torch.Tensor):
        x = x.to(F32)
        ids, w = self.route(logits)
        t_count, k_count = ids.shape
        out = torch.zeros(x.shape, dtype=F32)
        xq = self.qdq(x, 1)
        # Intermediates of every (token, k) slot: the dynamic per-tensor rules see the whole tensor.
        slots = [(t, k, int(ids[t, k])) for t in range(t_count) for k in range(k_count)]
        y1 = torch.stack([(xq[t].to(F64) @ self.experts[e].w13.T).to(F32) for t, _, e in slots])
        i = y1.shape[1] // 2
        g, u = y1[:, :i].to(F64), y1[:, i:].to(F64)
        z = (g / (1.0 + torch.exp(-g)) * u).to(F32)
        zq = self.qdq(z, 2)
        for n, (t, k, e) in enumerate(slots):
            y2 = (zq[n].to(F64) @ self.experts[e].w2.T).to(F32)
            out[t] += w[t, k] * y2
        return out, ids, w
