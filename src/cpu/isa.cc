#include "cpu/isa.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <string>

#include "qmoe/error.h"

namespace qmoe::cpu {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Bf16: return "avx512bf16";
    case Isa::Amx: return "amx";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : kAllIsas)
    if (isa_name(i) == name) return i;
  return std::nullopt;
}

namespace {

// Linux hands out AMX tile data (8 KB of extended state per thread) only to processes that ask
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, kernel 5.16+); a tile instruction
// without that permission faults. Asked once per process; false where it is refused or unknown.
bool amx_permitted() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool ok = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

#if defined(__x86_64__)
bool bit(unsigned reg, int b) { return (reg >> b) & 1u; }

CpuFeatures read_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
  const unsigned max_leaf = a;
  const bool amd = b == 0x68747541u && d == 0x69746E65u && c == 0x444D4163u;  // "AuthenticAMD"
  __cpuid(1, a, b, c, d);
  const unsigned base_family = (a >> 8) & 0xFu;
  const unsigned family = base_family == 0xFu ? base_family + ((a >> 20) & 0xFFu) : base_family;
  // XCR0 (XGETBV 0, valid where CPUID.1:ECX.OSXSAVE): which register state the OS saves.
  uint64_t xcr0 = 0;
  if (bit(c, 27)) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (uint64_t{hi} << 32) | lo;
  }
  const bool os_avx = (xcr0 & 0x6u) == 0x6u;                            // SSE, AVX (YMM)
  const bool os_avx512 = os_avx && (xcr0 & 0xE0u) == 0xE0u;             // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & (uint64_t{3} << 17)) == (uint64_t{3} << 17);  // XTILECFG, XTILEDATA
  f.fma = os_avx && bit(c, 12);
  f.f16c = os_avx && bit(c, 29);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned max_sub = a;
  f.avx2 = os_avx && bit(b, 5);
  f.avx512f = os_avx512 && bit(b, 16);
  f.avx512dq = os_avx512 && bit(b, 17);
  f.avx512bw = os_avx512 && bit(b, 30);
  f.avx512vl = os_avx512 && bit(b, 31);
  f.avx512vnni = os_avx512 && bit(c, 11);
  f.avx512_half_width = f.avx512f && amd && family == 0x19;  // Zen 4 (Zen 3, also 19h, has no AVX-512)
  f.near_row_prefetch = amd && family == 0x19 && !f.avx512f;  // Zen 3
  f.amx_bf16 = os_amx && bit(d, 22);
  f.amx_tile = os_amx && bit(d, 24);
  f.amx_int8 = os_amx && bit(d, 25);
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = os_avx512 && bit(a, 5);
  }
  return f;
}
#else
CpuFeatures read_cpu_features() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read_cpu_features();
  return f;
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return f.avx2 && f.fma && f.f16c;
    case Isa::Avx512:
      return isa_supported(Isa::Avx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
    case Isa::Avx512Bf16: return isa_supported(Isa::Avx512) && f.avx512bf16;
    case Isa::Amx:
      return isa_supported(Isa::Avx512Bf16) && f.amx_tile && f.amx_bf16 && f.amx_int8 && amx_permitted();
  }
  return false;
}

Isa default_isa() {
  if (const char* env = std::getenv("QMOE_CPU_ISA"); env != nullptr && *env != '\0') {
    const auto isa = isa_from_name(env);
    if (!isa) throw Error(fmt::format("QMOE_CPU_ISA='{}' is not one of scalar, avx2, avx512, avx512bf16, amx", env));
    if (!isa_supported(*isa))
      throw Error(fmt::format("QMOE_CPU_ISA={} is not supported by this CPU", env));
    return *isa;
  }
  static const Isa best = [] {
    Isa b = Isa::Scalar;
    for (Isa i : kAllIsas)
      if (isa_supported(i)) b = i;
    return b;
  }();
  return best;
}

}  // namespace qmoe::cpu
