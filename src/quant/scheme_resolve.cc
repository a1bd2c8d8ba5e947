// Scheme detection from one QLayerConfig (spec quark-moe.md §4 predicates, §5 dispatch order,
// §6 per-method checks, §12 errors; §16 decisions). Every error starts with the module prefix
// and names the offending field.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "qmoe/config.h"
#include "qmoe/error.h"

namespace qmoe {

namespace {

bool is_mx_dtype(std::string_view d) { return d == "fp4" || d == "fp6_e2m3" || d == "fp6_e3m2"; }
bool is_legacy_mx_dtype(std::string_view d) { return d == "mx" || d == "mx6" || d == "mx9" || d == "bfp16"; }

std::string opt_str(const std::optional<int>& v) { return v ? std::to_string(*v) : "null"; }
std::string opt_str(const std::optional<bool>& v) { return v ? (*v ? "true" : "false") : "null"; }

std::string describe(const QTensorSpec& s) {
  std::string out = fmt::format("{{dtype {}, qscheme {}, is_dynamic {}", s.dtype,
                                s.qscheme.empty() ? "null" : s.qscheme, s.is_dynamic ? "true" : "false");
  if (s.group_size) out += fmt::format(", group_size {}", *s.group_size);
  if (!s.scale_format.empty()) out += fmt::format(", scale_format {}", s.scale_format);
  if (s.symmetric) out += fmt::format(", symmetric {}", *s.symmetric ? "true" : "false");
  return out + "}";
}
std::string describe(const std::vector<QTensorSpec>& v, bool is_list) {
  if (v.empty()) return "null";
  if (!is_list) return describe(v[0]);
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + describe(v[i]);
  return out + "]";
}

class Resolver {
 public:
  Resolver(const QLayerConfig& lc, std::string_view prefix) : lc_(lc), prefix_(prefix) {}

  LayerScheme run() {
    LayerScheme ls;
    ls.prefix = prefix_;
    ls.config = lc_;
    if (lc_.has_output_tensors)
      fail("field 'output_tensors' is set: Quark MoE layers with quantized output_tensors and bias are not "
           "supported (NotImplemented)");
    if (lc_.has_bias)
      fail("field 'bias' is set: Quark MoE layers with quantized output_tensors and bias are not supported "
           "(NotImplemented)");
    check_legacy(lc_.weight, "weight", lc_.weight_is_list);
    check_legacy(lc_.input_tensors, "input_tensors", lc_.input_is_list);

    const auto& W = lc_.weight;
    const auto& A = lc_.input_tensors;
    if (W.empty()) {
      if (!A.empty())
        unsupported("input_tensors is quantized but weight is null (activation-only quantization)");
      ls.scheme = &scheme_by_name("unquantized");  // weight: null quantizes nothing
      return ls;
    }
    // §5 order: W4A8 (ROCm only), NVFP4, FP8 W8A8, OCP MX, INT8 W8A8.
    if (W.size() == 2 && W[0].dtype == "fp8_e4m3" && W[1].dtype == "int4")
      fail("weight is [fp8_e4m3 per_tensor, int4 per_channel] (W4A8, QuarkW4A8Fp8MoEMethod): it needs ROCm "
           "AITER fused MoE and is not supported by qmoe");
    if (W.size() > 1 || A.size() > 1) {  // two-level specs: only NVFP4 is supported
      ls.scheme = &scheme_by_name(nvfp4_or_fail());
      return ls;
    }
    const QTensorSpec& w = W[0];
    const QTensorSpec* a = A.empty() ? nullptr : &A[0];
    if (w.dtype == "fp8_e4m3") {
      ls.scheme = &scheme_by_name(fp8_scheme(w, a));
    } else if (is_mx_dtype(w.dtype)) {
      ls.scheme = &scheme_by_name(mx_scheme(w, a, ls));
    } else if (w.dtype == "int8") {
      ls.scheme = &scheme_by_name(int8_scheme(w, a));
    } else {
      unsupported(fmt::format("weight.dtype \"{}\" has no MoE method", w.dtype));
    }
    return ls;
  }

 private:
  [[noreturn]] void fail(std::string_view msg) const { throw Error(fmt::format("{}: {}", prefix_, msg)); }

  [[noreturn]] void unsupported(std::string_view why) const {
    std::string names;
    for (const auto& s : all_schemes()) names += (names.empty() ? "" : ", ") + std::string(s.name);
    fail(fmt::format("Unsupported FusedMoe scheme: {} (weight = {}, input_tensors = {}); qmoe supports: {}", why,
                     describe(lc_.weight, lc_.weight_is_list), describe(lc_.input_tensors, lc_.input_is_list),
                     names));
  }

  void check_legacy(const std::vector<QTensorSpec>& specs, std::string_view field, bool is_list) const {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!is_legacy_mx_dtype(specs[i].dtype)) continue;
      const std::string f = is_list ? fmt::format("{}[{}]", field, i) : std::string(field);
      fail(fmt::format("field '{}.dtype' is \"{}\", the legacy Quark MX format (element type in mx_element_dtype); "
                       "it is unsupported: re-export with dtype fp4 / fp6_e2m3 / fp6_e3m2, qscheme per_group, "
                       "group_size 32 and scale_format e8m0 (OCP MX)",
                       f, specs[i].dtype));
    }
  }

  // _is_nvfp4 (spec §4): W = [fp4 per_group 16 static, fp8_e4m3 per_tensor static],
  // A = [fp4 per_group 16 dynamic, fp8_e4m3 per_tensor static].
  std::string nvfp4_or_fail() const {
    const auto& W = lc_.weight;
    const auto& A = lc_.input_tensors;
    auto fp4_16 = [](const QTensorSpec& s, bool dynamic) {
      return s.dtype == "fp4" && s.qscheme == "per_group" && s.group_size == 16 && s.is_dynamic == dynamic;
    };
    auto fp8_tensor = [](const QTensorSpec& s) {
      return s.dtype == "fp8_e4m3" && s.qscheme == "per_tensor" && !s.is_dynamic;
    };
    const bool w_ok = W.size() == 2 && fp4_16(W[0], false) && fp8_tensor(W[1]);
    const bool a_ok = A.size() == 2 && fp4_16(A[0], true) && fp8_tensor(A[1]);
    if (w_ok && a_ok) return "nvfp4";
    if (!w_ok && W.size() > 1)
      unsupported("a list-valued weight must be NVFP4: [fp4 per_group group_size 16 is_dynamic false, "
                  "fp8_e4m3 per_tensor is_dynamic false]");
    if (!w_ok)
      unsupported("list-valued input_tensors are only supported with NVFP4, whose weight is the two-element "
                  "list [fp4 per_group group_size 16, fp8_e4m3 per_tensor]");
    unsupported("NVFP4 weights need NVFP4 activations: input_tensors must be [fp4 per_group group_size 16 "
                "is_dynamic true, fp8_e4m3 per_tensor is_dynamic false] (NVFP4 W4A16 is not a qmoe scheme)");
  }

  // QuarkW8A8Fp8MoEMethod (spec §6.1).
  std::string fp8_scheme(const QTensorSpec& w, const QTensorSpec* a) const {
    if (!a) unsupported("fp8_e4m3 weights without input_tensors (FP8 W8A16 is not a qmoe scheme)");
    if (a->dtype != "fp8_e4m3")
      unsupported(fmt::format("fp8_e4m3 weights need fp8_e4m3 input_tensors, input_tensors.dtype is \"{}\"", a->dtype));
    if (w.is_dynamic) fail("field 'weight.is_dynamic' is true: FP8 MoE weights must have static scales");
    const std::string& wq = w.qscheme;
    const std::string& aq = a->qscheme;
    if (wq == "per_tensor" && aq == "per_tensor")
      return a->is_dynamic ? "w_fp8_tensor_a_fp8_dyn_tensor" : "w_fp8_tensor_a_fp8_static";
    if (wq == "per_channel" && aq == "per_channel") {
      if (a->is_dynamic) return "w_fp8_channel_a_fp8_dyn_token";
      fail("field 'input_tensors.is_dynamic' is false with qscheme per_channel: for FP8 Fused MoE layers, we "
           "require either per tensor or channelwise, dynamic per token quantization");
    }
    fail(fmt::format("fields 'weight.qscheme' / 'input_tensors.qscheme': for FP8 Fused MoE layers, only "
                     "per-tensor and per-channel scales for weights and activations are supported "
                     "(per_tensor + per_tensor, or per_channel + dynamic per_channel). Found {}, {}",
                     wq.empty() ? "null" : wq, aq.empty() ? "null" : aq));
  }

  MxScaleMode scale_mode(const QTensorSpec& s, std::string_view field) const {
    const std::string& m = s.scale_calculation_mode;
    if (m.empty() || m == "even") return MxScaleMode::Even;
    if (m == "floor") return MxScaleMode::Floor;
    if (m == "ceil") return MxScaleMode::Ceil;
    fail(fmt::format("field '{}.scale_calculation_mode' is \"{}\"; supported MX scale rules: even, floor, ceil", field,
                     m));
  }

  // QuarkOCP_MX_MoEMethod (spec §6.3).
  std::string mx_scheme(const QTensorSpec& w, const QTensorSpec* a, LayerScheme& ls) const {
    const std::string wname = "mx" + w.dtype;  // fp4 → mxfp4, fp6_e2m3 → mxfp6_e2m3
    if (w.qscheme != "per_group")
      fail(fmt::format("field 'weight.qscheme' is \"{}\": for MX Fused MoE layers, only per-group scales for "
                       "weights are supported (qscheme per_group, group_size 32, scale_format e8m0)",
                       w.qscheme.empty() ? "null" : w.qscheme));
    if (w.group_size != 32) {
      const bool nvfp4_like = w.dtype == "fp4" && w.group_size == 16;
      fail(fmt::format("field 'weight.group_size' is {}: OCP MX weights use group_size 32{}", opt_str(w.group_size),
                       nvfp4_like ? " (fp4 with group_size 16 is NVFP4, whose weight and input_tensors are "
                                    "two-element lists [fp4 per_group 16, fp8_e4m3 per_tensor])"
                                  : ""));
    }
    if (w.scale_format != "e8m0")
      fail(fmt::format("field 'weight.scale_format' is \"{}\": OCP MX weights need scale_format \"e8m0\"",
                       w.scale_format.empty() ? "null" : w.scale_format));
    if (w.is_dynamic) fail("field 'weight.is_dynamic' is true: MX weights must be static (stored) scales");
    ls.weight_scale_mode = scale_mode(w, "weight");

    std::string aname = "None";
    if (a) {
      if (is_mx_dtype(a->dtype)) {
        aname = "mx" + a->dtype;
      } else if (a->dtype == "fp8_e4m3") {
        aname = "fp8";
      } else {
        fail(fmt::format("field 'input_tensors.dtype' is \"{}\": it is not compatible with OCP MX (weight) MoE "
                         "(not implemented); expected fp4, fp6_e3m2, fp6_e2m3, fp8_e4m3 or null",
                         a->dtype));
      }
    }
    struct Pair {
      std::string_view w, a, scheme;
    };
    static constexpr Pair kTable[] = {
        {"mxfp4", "None", "w_mxfp4"},
        {"mxfp4", "mxfp4", "w_mxfp4_a_mxfp4"},
        {"mxfp4", "mxfp6_e3m2", "w_mxfp4_a_mxfp6_e3m2"},
        {"mxfp4", "mxfp6_e2m3", "w_mxfp4_a_mxfp6_e2m3"},
        {"mxfp4", "fp8", "w_mxfp4_a_fp8"},
        {"mxfp6_e3m2", "None", "w_mxfp6_e3m2"},
        {"mxfp6_e3m2", "mxfp6_e3m2", "w_mxfp6_e3m2_a_mxfp6_e3m2"},
        {"mxfp6_e3m2", "fp8", "w_mxfp6_e3m2_a_fp8"},
        {"mxfp6_e2m3", "None", "w_mxfp6_e2m3"},
        {"mxfp6_e2m3", "mxfp6_e2m3", "w_mxfp6_e2m3_a_mxfp6_e2m3"},
        {"mxfp6_e2m3", "fp8", "w_mxfp6_e2m3_a_fp8"},
    };
    std::string_view scheme;
    for (const Pair& p : kTable)
      if (p.w == wname && p.a == aname) scheme = p.scheme;
    if (scheme.empty())
      fail(fmt::format("fields 'weight.dtype' / 'input_tensors.dtype': Unsupported OCP MX dtype combination for "
                       "MoE: weight {} with input {} (not supported; an MXFP6 weight pairs only with the same "
                       "MXFP6 activation, with static fp8_e4m3, or with none)",
                       wname, aname));
    if (a && aname != "fp8") {
      if (!a->is_dynamic)
        fail(fmt::format("field 'input_tensors.is_dynamic' is false: static scales for MX activations ({}) are "
                         "not implemented; MX activations must be dynamic",
                         aname));
      if (a->qscheme != "per_group" || a->group_size != 32)
        fail(fmt::format("fields 'input_tensors.qscheme' / 'input_tensors.group_size' are {} / {}: MX activations "
                         "are quantized per_group with group_size 32",
                         a->qscheme.empty() ? "null" : a->qscheme, opt_str(a->group_size)));
      if (a->scale_format != "e8m0")
        fail(fmt::format("field 'input_tensors.scale_format' is \"{}\": MX activations need scale_format \"e8m0\"",
                         a->scale_format.empty() ? "null" : a->scale_format));
      ls.act_scale_mode = scale_mode(*a, "input_tensors");
    } else if (a) {
      if (a->is_dynamic)
        fail("field 'input_tensors.is_dynamic' is true: dynamic FP8 activations with MX weights are not "
             "implemented; FP8 activations of OCP MX schemes must be static per_tensor");
      if (a->qscheme != "per_tensor")
        fail(fmt::format("field 'input_tensors.qscheme' is \"{}\": FP8 activations of OCP MX schemes must be "
                         "static per_tensor",
                         a->qscheme.empty() ? "null" : a->qscheme));
      if (a->symmetric == false)
        fail("field 'input_tensors.symmetric' is false: FP8 activations must be symmetric");
    }
    return std::string(scheme);
  }

  // QuarkW8A8Int8MoEMethod (spec §4 _is_static_tensor_w8a8 / _is_dynamic_per_token_w8a8, §6.2).
  std::string int8_scheme(const QTensorSpec& w, const QTensorSpec* a) const {
    if (!a) unsupported("int8 weights without input_tensors (INT8 W8A16 is not a qmoe scheme)");
    if (a->dtype != "int8")
      unsupported(fmt::format("int8 weights need int8 input_tensors, input_tensors.dtype is \"{}\"", a->dtype));
    if (w.qscheme != "per_tensor" && w.qscheme != "per_channel")
      unsupported(fmt::format("field 'weight.qscheme' is \"{}\"; INT8 weights are per_tensor or per_channel",
                              w.qscheme.empty() ? "null" : w.qscheme));
    if (w.symmetric != true)
      fail(fmt::format("field 'weight.symmetric' is {}: INT8 MoE weights must be symmetric (true)",
                       opt_str(w.symmetric)));
    if (w.is_dynamic) fail("field 'weight.is_dynamic' is true: INT8 MoE weights must have static scales");
    const std::string wk = w.qscheme == "per_tensor" ? "w_int8_tensor" : "w_int8_channel";
    if (a->qscheme == "per_tensor" && !a->is_dynamic) return wk + "_a_int8_static";
    if (a->qscheme == "per_channel" && a->is_dynamic) {
      if (a->symmetric == false)
        fail("field 'input_tensors.symmetric' is false: asymmetric INT8 is not supported (dynamic per-token "
             "INT8 activations are symmetric)");
      return wk + "_a_int8_dyn_token";
    }
    unsupported(fmt::format("INT8 activations must be static per_tensor or dynamic per_channel (per token); "
                            "input_tensors has qscheme {}, is_dynamic {}",
                            a->qscheme.empty() ? "null" : a->qscheme, a->is_dynamic ? "true" : "false"));
  }

  const QLayerConfig& lc_;
  std::string_view prefix_;
};

}  // namespace

LayerScheme resolve_scheme_from_layer_config(const QLayerConfig& lc, std::string_view prefix) {
  return Resolver(lc, prefix).run();
}

}  // namespace qmoe
