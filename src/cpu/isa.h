// CPU instruction-set selection for the optimized expert kernels: the best the machine supports,
// overridable with env QMOE_CPU_ISA=scalar|avx2|avx512|avx512bf16|amx or an explicit argument (tests).
// Targets, each a superset of the one before:
//   scalar      plain C++ (the baseline the others are tested against)
//   avx2        AVX2 + FMA + F16C (Haswell, Zen 1–3)
//   avx512      + AVX-512 F/BW/VL/DQ + VNNI (Cascade Lake, Ice Lake)
//   avx512bf16  + AVX512_BF16 (vdpbf16ps: Cooper Lake, Sapphire Rapids, Zen 4/5): bf16 dot
//               products for bf16 / MX-weight schemes (DotKind::Bf16)
//   amx         + AMX tiles (AMX-TILE, AMX-BF16, AMX-INT8: Sapphire Rapids and later) with the
//               OS's permission for tile data (Linux arch_prctl ARCH_REQ_XCOMP_PERM): TDPBF16PS /
//               TDPBSSD tile GEMMs for experts with many tokens (gemm_amx.cc); avx512bf16's
//               kernels below that
#pragma once

#include <optional>
#include <string_view>

namespace qmoe::cpu {

enum class Isa { Scalar, Avx2, Avx512, Avx512Bf16, Amx };

std::string_view isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);  // nullopt for unknown names
// The x86 features the targets need, read from CPUID and XGETBV (the OS saves the registers:
// XCR0's AVX, AVX-512 and AMX tile state bits), the same on every compiler (GCC's and clang's
// __builtin_cpu_supports know different feature names). All false off x86-64.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512dq = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  // AVX-512 whose 512-bit operations run on 256-bit datapaths (AMD Zen 4: family 19h): a speed fact
  // for dot_kind_for, not a target.
  bool avx512_half_width = false;
  // AMD family 19h without AVX-512 (Zen 3): the one-row weight streams prefetch 1 KB ahead, not 4 KB
  // (row_stream_distance, kernel_iface.h). A speed fact, not a target.
  bool near_row_prefetch = false;
};
const CpuFeatures& cpu_features();
// Whether this CPU (and OS) can run the kernels of `isa`: AVX2 needs AVX2+FMA+F16C; AVX-512 needs
// F, BW, VL, DQ and VNNI; avx512bf16 also AVX512_BF16; amx also AMX-TILE/BF16/INT8 and the OS's
// permission to use tile data (asked for once per process).
bool isa_supported(Isa isa);
// The best supported ISA, unless env QMOE_CPU_ISA names one (an unsupported or unknown name is a
// qmoe::Error naming the variable and the choices).
Isa default_isa();
// Every target, in order (for tests: each supported one is run against the scalar reference).
inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx};

}  // namespace qmoe::cpu
