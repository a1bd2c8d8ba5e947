"""Tiny randomly initialised MoE models, quantized and exported by the real AMD Quark.

`export(arch, scheme, out_dir)` builds a 1-layer Qwen3-MoE or Mixtral with transformers, quantizes
it with Quark's ModelQuantizer (the LLMTemplate of the architecture, with the scheme's QLayerConfig;
calibration on a few random token batches) and writes it with `quark.torch.export_safetensors`.
"""

from __future__ import annotations

import pathlib

import torch
from quark.torch import LLMTemplate, ModelQuantizer, export_safetensors
from quark.torch.quantization.config import config as qc
from quark.torch.utils.llm.model_preparation import preprocess_for_quantization

HIDDEN = 128
INTERMEDIATE = 64
EXPERTS = 8
TOP_K = 2
VOCAB = 256


def _layer(weight, act=None) -> qc.QLayerConfig:
    return qc.QLayerConfig(weight=weight.to_quantization_spec(),
                           input_tensors=None if act is None else act.to_quantization_spec())


def _mx(kind: str, dynamic: bool):
    cls = {"fp4": qc.OCP_MXFP4Spec, "fp6_e3m2": qc.OCP_MXFP6E3M2Spec, "fp6_e2m3": qc.OCP_MXFP6E2M3Spec}[kind]
    return cls(ch_axis=-1, is_dynamic=dynamic)


def _int8_channel(dynamic: bool, ch_axis: int):
    return qc.Int8PerChannelSpec(ch_axis=ch_axis, symmetric=True, scale_type="float", round_method="half_even",
                                 is_dynamic=dynamic)


def _int8_tensor(dynamic: bool):
    return qc.Int8PerTensorSpec(observer_method="min_max", symmetric=True, scale_type="float",
                                round_method="half_even", is_dynamic=dynamic)


def _fp8_tensor(dynamic: bool):
    return qc.FP8E4M3PerTensorSpec(observer_method="min_max", scale_type="float", is_dynamic=dynamic)


# qmoe scheme name → Quark's built-in template scheme, or a QLayerConfig built from Quark's specs
# where Quark has no template for it.
QUARK_SCHEMES = {
    "w_mxfp4": "mxfp4_weight_only",
    "w_mxfp4_a_mxfp4": "mxfp4",
    "w_mxfp4_a_mxfp6_e2m3": "mxfp4_mxfp6_e2m3",
    "w_mxfp4_a_mxfp6_e3m2": lambda: _layer(_mx("fp4", False), _mx("fp6_e3m2", True)),
    "w_mxfp4_a_fp8": "mxfp4_fp8",
    "w_mxfp6_e3m2": lambda: _layer(_mx("fp6_e3m2", False)),
    "w_mxfp6_e2m3": lambda: _layer(_mx("fp6_e2m3", False)),
    "w_mxfp6_e3m2_a_mxfp6_e3m2": "mxfp6_e3m2",
    "w_mxfp6_e2m3_a_mxfp6_e2m3": "mxfp6_e2m3",
    "nvfp4": "nvfp4",
    "w_fp8_tensor_a_fp8_static": "fp8",
    "w_fp8_tensor_a_fp8_dyn_tensor": lambda: _layer(_fp8_tensor(False), _fp8_tensor(True)),
    "w_fp8_channel_a_fp8_dyn_token": "ptpc_fp8",
    "w_int8_tensor_a_int8_static": "int8",
    "w_int8_channel_a_int8_dyn_token": lambda: _layer(_int8_channel(False, 0), _int8_channel(True, 1)),
    "w_int8_channel_a_int8_static": lambda: _layer(_int8_channel(False, 0), _int8_tensor(False)),
    "w_int8_tensor_a_int8_dyn_token": lambda: _layer(_int8_tensor(False), _int8_channel(True, 1)),
}


def _template_scheme(qmoe_scheme: str) -> str:
    spec = QUARK_SCHEMES[qmoe_scheme]
    if isinstance(spec, str):
        return spec
    name = "qmoe_interop_" + qmoe_scheme
    if name not in LLMTemplate._SUPPORTED_SCHEMES:
        LLMTemplate.register_scheme(name, config=spec())
    return name


def tiny_model(arch: str, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64, num_experts_per_tok=TOP_K, max_position_embeddings=128)
    if arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(intermediate_size=2 * INTERMEDIATE, moe_intermediate_size=INTERMEDIATE,
                                          num_experts=EXPERTS, decoder_sparse_step=1, norm_topk_prob=True, **common)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif arch == "mixtral":
        cfg = transformers.MixtralConfig(intermediate_size=INTERMEDIATE, num_local_experts=EXPERTS, **common)
        model = transformers.MixtralForCausalLM(cfg)
    else:
        raise ValueError(arch)
    # Random init is N(0, 0.02): give the experts a realistic spread of magnitudes per row.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "experts" in name:
                p.mul_(torch.exp(0.5 * torch.randn(p.shape[:-1] + (1,))))
    return model.eval()


def _quark_probe(model, x: torch.Tensor) -> dict:
    """Quark's own view of the quantized layer, before export: every expert linear's fake-quantized
    (quantize-dequantize) weight, and the MoE block's output on x through Quark's fake-quantized
    modules (activation quantizers included)."""
    block = model.model.layers[0].mlp
    weights = {}
    for name, mod in block.experts.named_modules():
        wq = getattr(mod, "_weight_quantizer", None)
        if wq is not None:
            weights[name] = wq(mod.weight).detach().to(torch.float64)
    out = block(x.to(torch.float32).unsqueeze(0))
    out = out[0] if isinstance(out, tuple) else out
    return {"x": x, "weights": weights, "out": out.squeeze(0).detach().to(torch.float32)}


def export(arch: str, qmoe_scheme: str, out_dir: pathlib.Path, seed: int = 0,
           probe: torch.Tensor | None = None) -> pathlib.Path:
    """Quantize and export; with `probe` (hidden states [T, H]) also write Quark's own fake-quantized
    weights and MoE block output on it to out_dir/quark_probe.pt (not part of the checkpoint)."""
    model = tiny_model(arch, seed)
    preprocess_for_quantization(model)  # transformers >= 5 fused experts → one nn.Linear per expert
    template = LLMTemplate.get(arch)
    qconfig = template.get_config(scheme=_template_scheme(qmoe_scheme))
    gen = torch.Generator().manual_seed(seed + 1)
    calib = [torch.randint(0, VOCAB, (4, 32), generator=gen) for _ in range(4)]
    quantizer = ModelQuantizer(qconfig)
    with torch.no_grad():
        model = quantizer.quantize_model(model, calib)
        model = quantizer.freeze(model)
        quark_view = _quark_probe(model, probe) if probe is not None else None
        export_safetensors(model, str(out_dir))
    if quark_view is not None:
        torch.save(quark_view, out_dir / "quark_probe.pt")
    return out_dir
