// x @ W^T with W in ggml's Q4_1, Q4_0 or Q8_0 blocks, read as they are: fp32 activations, fp32 math.
//
// A decode step is little else than reading every weight once, so the bytes read are the time:
// a Q4_1 block holds 32 weights in 20 bytes where fp32 needs 128. Each block becomes its 32 fp32
// weights in registers (one fused d * code + m each) and is applied to a tile of up to TILE rows
// of x. At one row that costs the vector uops that a dot of the codes scaled afterwards costs; at
// more, fewer (two FMAs a row and block, not three and the offset's). Up to GEMM_ROWS rows, a
// chunk of weight rows stays in cache while the tiles of x stream over it; from there, a GEMM of
// our own (see `gemm`) dequantizes a few weight rows at a time into L1 and applies them to every
// row of x; from DENSE_ROWS on, slices of weights are dequantized for torch's GEMM.
// The .so is built without -march=native: each vector path carries its own target attribute and
// the path is chosen at run time, so one build runs on an AVX2-only Zen 3 and an AVX-512 Xeon.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))

namespace {

constexpr int QK = 32;  // weights a block, along the input dimension
// Rows of x a block is applied to once unpacked: 8 with AVX-512's 32 registers (two accumulators a
// row), 4 with AVX2's 16 (the static engine's batch either way: a decode step is one tile).
constexpr int TILE = 8, TILE_AVX2 = 4;
// How far ahead of the block in hand a row's bytes are asked for: a page, so that the next one is
// on its way when the hardware prefetcher stops at the page's end.
constexpr int PREFETCH = 4096;
// From GEMM_ROWS rows of x on, a call runs `gemm` (x's rows along the lanes: no horizontal sums,
// each weight unpacked once for all rows); from DENSE_ROWS on, torch's GEMM on dequantized slices
// (`dense`), which blocks a prefill's thousands of rows for the caches better than `gemm` does.
// Where each path starts to be faster than the last, measured on an AVX-512 Xeon (its AVX2 path
// forced for the second pair); the scalar path has no `gemm`.
constexpr int64_t GEMM_ROWS = 48, DENSE_ROWS = 144, GEMM_ROWS_AVX2 = 24, DENSE_ROWS_AVX2 = 64;
// Weight rows `gemm` dequantizes at a time: NR x 4 accumulators and 4 registers of x in AVX-512's 32.
constexpr int NR = 6;

enum Isa { SCALAR = 0, AVX2_FMA = 1, AVX512_F = 2 };

Isa detect() {
  __builtin_cpu_init();
  bool f16c_fma = __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (f16c_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return AVX512_F;
  if (f16c_fma && __builtin_cpu_supports("avx2")) return AVX2_FMA;
  return SCALAR;
}

const Isa best = detect();
Isa active = best;

inline uint16_t half_bits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// IEEE half -> float without F16C, for the scalar path (subnormals included: tiny scales exist).
inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: shift the mantissa up until its leading one is the implicit bit
    exp = 113;
    while (!(man & 0x400)) man <<= 1, --exp;
    bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Every fp16 as a float (256 KiB, of which a model's scales touch a few lines): a scale read this
// way costs a load, where _cvtsh_ss costs three vector uops on the ports the FMAs need.
struct HalfTable {
  float f[65536];
  HalfTable() {
    for (int h = 0; h < 65536; ++h) f[h] = half_to_float((uint16_t)h);
  }
};
const HalfTable halves;
inline float scale(const uint8_t* p) { return halves.f[half_bits(p)]; }

// One format's layout. unpack16 gives the block's weights j and j+16 (j = 0..15) as fp32 in two
// 16-float registers; unpack8 the same as four 8-float ones (j = 0..7, 8..15, 16..23, 24..31).
// Each weight is one fused d * code + offset: rounded once, as the fp32 dequantized matrix holds it.
struct Q41 {
  static constexpr int bytes = 20, codes = 4;
  static float d(const uint8_t* p) { return half_to_float(half_bits(p)); }
  static float offset(const uint8_t* p) { return half_to_float(half_bits(p + 2)); }
  static float code(const uint8_t* q, int j) { return j < 16 ? q[j] & 0xF : q[j - 16] >> 4; }
  AVX512 static void unpack16(const uint8_t* p, __m512& lo, __m512& hi) {
    __m512 d = _mm512_set1_ps(scale(p)), m = _mm512_set1_ps(scale(p + 2));
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + codes)));
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xF))), d, m);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d, m);
  }
  AVX2 static void unpack8(const uint8_t* p, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(scale(p)), m = _mm256_set1_ps(scale(p + 2));
    nibbles8(p + codes, d, m, w);
  }
  // codes j = 0..7, 8..15 from the low nibbles, 16..23, 24..31 from the high ones
  AVX2 static void nibbles8(const uint8_t* q16, __m256 d, __m256 m, __m256 w[4]) {
    __m128i q = _mm_loadu_si128((const __m128i*)q16);
    __m256i a = _mm256_cvtepu8_epi32(q), b = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));
    __m256i nib = _mm256_set1_epi32(0xF);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, nib)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, nib)), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), d, m);
  }
};

// d * (code - 8) as d * code - 8 * d: 8 * d is exact, so the fused result is the same number.
struct Q40 {
  static constexpr int bytes = 18, codes = 2;
  static float d(const uint8_t* p) { return half_to_float(half_bits(p)); }
  static float offset(const uint8_t* p) { return -8.f * d(p); }
  static float code(const uint8_t* q, int j) { return j < 16 ? q[j] & 0xF : q[j - 16] >> 4; }
  AVX512 static void unpack16(const uint8_t* p, __m512& lo, __m512& hi) {
    __m512 d = _mm512_set1_ps(scale(p)), m = _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + codes)));
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xF))), d, m);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), d, m);
  }
  AVX2 static void unpack8(const uint8_t* p, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(scale(p));
    Q41::nibbles8(p + codes, d, _mm256_mul_ps(d, _mm256_set1_ps(-8.f)), w);
  }
};

struct Q80 {
  static constexpr int bytes = 34, codes = 2;
  static float d(const uint8_t* p) { return half_to_float(half_bits(p)); }
  static float offset(const uint8_t*) { return 0.f; }
  static float code(const uint8_t* q, int j) { return (int8_t)q[j]; }
  AVX512 static void unpack16(const uint8_t* p, __m512& lo, __m512& hi) {
    __m512 d = _mm512_set1_ps(scale(p));
    const __m128i* q = (const __m128i*)(p + codes);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
  }
  AVX2 static void unpack8(const uint8_t* p, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(scale(p));
    for (int i = 0; i < 4; ++i) {
      __m128i q = _mm_loadl_epi64((const __m128i*)(p + codes + 8 * i));
      w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  }
};

// One call's operands: x [M, K], w [N, K/32 blocks], y [M, N].
struct Call {
  const float* x;
  const uint8_t* w;
  float* y;
  int64_t N, K, nb, row_bytes;
};

// Output rows [n0, n1) for the R rows of x from row m0 (R <= TILE). At one row, two sets of
// accumulators (even and odd blocks) keep an FMA's latency from setting the pace.
template <class F, int R>
AVX512 void rows_avx512(const Call& c, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int S = R == 1 ? 2 : 1;
  const float* x = c.x + m0 * c.K;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = c.w + n * c.row_bytes;
    __m512 acc[S][R][2];
    for (int s = 0; s < S; ++s)
      for (int r = 0; r < R; ++r) acc[s][r][0] = acc[s][r][1] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < c.nb; b0 += S) {
      _mm_prefetch((const char*)row + b0 * F::bytes + PREFETCH, _MM_HINT_T0);
      for (int s = 0; s < S && b0 + s < c.nb; ++s) {
        const int64_t b = b0 + s;
        __m512 lo, hi;
        F::unpack16(row + b * F::bytes, lo, hi);
        for (int r = 0; r < R; ++r) {
          const float* xb = x + r * c.K + b * QK;
          acc[s][r][0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), acc[s][r][0]);
          acc[s][r][1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), acc[s][r][1]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512 sum = _mm512_add_ps(acc[0][r][0], acc[0][r][1]);
      if constexpr (S == 2) sum = _mm512_add_ps(sum, _mm512_add_ps(acc[1][r][0], acc[1][r][1]));
      c.y[(m0 + r) * c.N + n] = _mm512_reduce_add_ps(sum);
    }
  }
}

AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// The same 8 wide; A accumulators a row (16 registers: four at one row, two at more).
template <class F, int R>
AVX2 void rows_avx2(const Call& c, int64_t m0, int64_t n0, int64_t n1) {
  constexpr int A = R == 1 ? 4 : 2;
  const float* x = c.x + m0 * c.K;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = c.w + n * c.row_bytes;
    __m256 acc[R][A];
    for (int r = 0; r < R; ++r)
      for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
    for (int64_t b = 0; b < c.nb; ++b) {
      _mm_prefetch((const char*)row + b * F::bytes + PREFETCH, _MM_HINT_T0);
      __m256 w[4];
      F::unpack8(row + b * F::bytes, w);
      for (int r = 0; r < R; ++r) {
        const float* xb = x + r * c.K + b * QK;
        for (int i = 0; i < 4; ++i) acc[r][i % A] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xb + 8 * i), acc[r][i % A]);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m256 sum = _mm256_add_ps(acc[r][0], acc[r][1]);
      if constexpr (A == 4) sum = _mm256_add_ps(sum, _mm256_add_ps(acc[r][2], acc[r][3]));
      c.y[(m0 + r) * c.N + n] = hsum8(sum);
    }
  }
}

template <class F, int R>
void rows_scalar(const Call& c, int64_t m0, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = c.w + n * c.row_bytes;
    float acc[R] = {};
    for (int64_t b = 0; b < c.nb; ++b) {
      const uint8_t* p = row + b * F::bytes;
      float w[QK], d = F::d(p), m = F::offset(p);
      for (int j = 0; j < QK; ++j) w[j] = std::fma(F::code(p + F::codes, j), d, m);
      for (int r = 0; r < R; ++r) {
        const float* xb = c.x + (m0 + r) * c.K + b * QK;
        float dot = 0.f;  // a block's sum apart: one long running sum would round more
        for (int j = 0; j < QK; ++j) dot += w[j] * xb[j];
        acc[r] += dot;
      }
    }
    for (int r = 0; r < R; ++r) c.y[(m0 + r) * c.N + n] = acc[r];
  }
}

// Weight rows [n0, n1) as fp32, into out [n1 - n0, K]: what a wide call hands to the GEMM.
template <class F>
AVX512 void dense_avx512(const Call& c, int64_t n0, int64_t n1, float* out) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t b = 0; b < c.nb; ++b) {
      __m512 lo, hi;
      F::unpack16(c.w + n * c.row_bytes + b * F::bytes, lo, hi);
      float* o = out + (n - n0) * c.K + b * QK;
      _mm512_storeu_ps(o, lo), _mm512_storeu_ps(o + 16, hi);
    }
}

template <class F>
AVX2 void dense_avx2(const Call& c, int64_t n0, int64_t n1, float* out) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t b = 0; b < c.nb; ++b) {
      __m256 w[4];
      F::unpack8(c.w + n * c.row_bytes + b * F::bytes, w);
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + (n - n0) * c.K + b * QK + 8 * i, w[i]);
    }
}

template <class F>
void dense_scalar(const Call& c, int64_t n0, int64_t n1, float* out) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t b = 0; b < c.nb; ++b) {
      const uint8_t* p = c.w + n * c.row_bytes + b * F::bytes;
      const float d = F::d(p), m = F::offset(p);
      for (int j = 0; j < QK; ++j) out[(n - n0) * c.K + b * QK + j] = std::fma(F::code(p + F::codes, j), d, m);
    }
}

// A prefill's call: weight rows dequantized a slice at a time (4 MiB, in the last-level cache) for
// torch's GEMM, which uses each weight for many more rows of x than a tile of 4 can.
template <class F>
void dense(const Call& c, const torch::Tensor& x, torch::Tensor& y) {
  auto convert = active == AVX512_F ? dense_avx512<F> : active == AVX2_FMA ? dense_avx2<F> : dense_scalar<F>;
  const int64_t slice = std::max<int64_t>(64, (4 << 20) / (4 * c.K));
  for (int64_t n0 = 0; n0 < c.N; n0 += slice) {
    const int64_t rows = std::min(slice, c.N - n0);
    auto w = torch::empty({rows, c.K}, x.options());
    float* out = w.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      convert(c, n0 + begin, n0 + end, out + begin * c.K);
    });
    if (rows == c.N)
      at::mm_out(y, x, w.t());
    else
      y.narrow(1, n0, rows).copy_(at::mm(x, w.t()));
  }
}

// A GEMM in BLIS's shape for a decode step of many sequences: x transposed once a call into passes
// of P rows (x's rows along a register's lanes, zero past M), and for each panel of NR weight rows,
// dequantized once into a buffer that stays in L1, every pass as outer products: one weight
// broadcast and V FMAs per weight row and input. FMAs bound, where the tiles are bound by loading
// x beside every FMA and summing each output across a register.
template <int V>
AVX512 void outer_avx512(const float* xt, const float* w, int64_t K, float* out) {
  constexpr int P = 64;
  __m512 acc[NR][V];
  for (int j = 0; j < NR; ++j)
    for (int v = 0; v < V; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 xv[V];
    for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_ps(xt + k * P + 16 * v);
    for (int j = 0; j < NR; ++j) {
      const __m512 b = _mm512_set1_ps(w[j * K + k]);
      for (int v = 0; v < V; ++v) acc[j][v] = _mm512_fmadd_ps(b, xv[v], acc[j][v]);
    }
  }
  for (int j = 0; j < NR; ++j)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + j * P + 16 * v, acc[j][v]);
}

template <int V>
AVX2 void outer_avx2(const float* xt, const float* w, int64_t K, float* out) {
  constexpr int P = 16;
  __m256 acc[NR][V];
  for (int j = 0; j < NR; ++j)
    for (int v = 0; v < V; ++v) acc[j][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 xv[V];
    for (int v = 0; v < V; ++v) xv[v] = _mm256_loadu_ps(xt + k * P + 8 * v);
    for (int j = 0; j < NR; ++j) {
      const __m256 b = _mm256_set1_ps(w[j * K + k]);
      for (int v = 0; v < V; ++v) acc[j][v] = _mm256_fmadd_ps(b, xv[v], acc[j][v]);
    }
  }
  for (int j = 0; j < NR; ++j)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out + j * P + 8 * v, acc[j][v]);
}

template <class F>
void gemm(const Call& c, torch::Tensor& y) {
  using Outer = void (*)(const float*, const float*, int64_t, float*);
  const bool wide = active == AVX512_F;
  const Outer avx512[] = {outer_avx512<1>, outer_avx512<2>, outer_avx512<3>, outer_avx512<4>};
  const Outer avx2[] = {outer_avx2<1>, outer_avx2<2>};
  const Outer* outer = wide ? avx512 : avx2;
  auto convert = wide ? dense_avx512<F> : dense_avx2<F>;
  // Passes of up to P rows, as even as whole registers allow (80 rows: 48 + 32, not 64 + 16: a
  // pass of one register has too few accumulators to hide an FMA's latency).
  const int64_t lanes = wide ? 16 : 8, P = wide ? 64 : 16, M = y.size(0);
  const int64_t vectors = (M + lanes - 1) / lanes, passes = (vectors + P / lanes - 1) / (P / lanes);
  auto first = [&](int64_t pass) { return std::min(M, pass * vectors / passes * lanes); };
  // x's rows along the lanes: xt [passes][K][P], zero past each pass's rows
  auto xt = torch::empty({passes, c.K, P}, y.options());
  float* xp = xt.data_ptr<float>();
  at::parallel_for(0, passes * c.nb, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t pass = i / c.nb, k0 = i % c.nb * QK, m0 = first(pass), m1 = first(pass + 1);
      float* to = xp + (pass * c.K + k0) * P;
      for (int64_t r = 0; r < P; ++r)
        for (int64_t k = 0; k < QK; ++k) to[k * P + r] = m0 + r < m1 ? c.x[(m0 + r) * c.K + k0 + k] : 0.f;
    }
  });
  // Outputs of GROUP panels are gathered, then written to y a row at a time: a panel's own NR
  // columns of y, one short piece in each of P rows N floats apart, would keep the same few cache
  // sets busy (rows a multiple of 4 KiB apart share them).
  constexpr int64_t GROUP = 8;
  const int64_t panels = (c.N + NR - 1) / NR;
  at::parallel_for(0, (panels + GROUP - 1) / GROUP, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(NR * c.K, 0.f), out(passes * GROUP * NR * P);  // weight rows past N stay zero
    for (int64_t group = begin; group < end; ++group) {
      const int64_t n_first = group * GROUP * NR, cols = std::min(GROUP * NR, c.N - n_first);
      for (int64_t n0 = n_first; n0 < n_first + cols; n0 += NR) {
        convert(c, n0, std::min(n0 + NR, c.N), w.data());
        for (int64_t pass = 0; pass < passes; ++pass) {
          const int64_t used = (first(pass + 1) - first(pass) + lanes - 1) / lanes;
          outer[used - 1](xp + pass * c.K * P, w.data(), c.K, out.data() + (pass * GROUP * NR + n0 - n_first) * P);
        }
      }
      for (int64_t pass = 0; pass < passes; ++pass)
        for (int64_t m = first(pass); m < first(pass + 1); ++m) {
          const float* o = out.data() + pass * GROUP * NR * P + m - first(pass);
          for (int64_t j = 0; j < cols; ++j) c.y[m * c.N + n_first + j] = o[j * P];
        }
    }
  });
}

using Rows = void (*)(const Call&, int64_t, int64_t, int64_t);

template <class F, int R>
Rows pick(Isa isa) {
  return isa == AVX512_F ? rows_avx512<F, R> : isa == AVX2_FMA ? rows_avx2<F, R> : rows_scalar<F, R>;
}

template <class F>
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K, const char* name) {
  TORCH_CHECK(K > 0 && K % QK == 0, name, ": K (in_features) must be a positive multiple of 32, got ", K);
  TORCH_CHECK(N > 0, name, ": N (out_features) must be positive, got ", N);
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), name, ": x and w must be CPU tensors");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, name, ": x must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, name, ": x must be [M, K=", K, "], got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), name, ": x must be contiguous");
  const int64_t nb = K / QK, row_bytes = nb * F::bytes;
  TORCH_CHECK(w.scalar_type() == torch::kUInt8, name, ": w must be uint8 blocks, got ", w.scalar_type());
  TORCH_CHECK(w.dim() == 2 && w.size(0) == N && w.size(1) == row_bytes, name, ": w must be [N=", N,
              ", K/32*", F::bytes, "=", row_bytes, "] bytes, got ", w.sizes());
  TORCH_CHECK(w.is_contiguous(), name, ": w must be contiguous");
  const int64_t M = x.size(0);
  auto y = torch::empty({M, N}, x.options());
  Call c{x.data_ptr<float>(), w.data_ptr<uint8_t>(), y.data_ptr<float>(), N, K, nb, row_bytes};
  const bool avx2 = active == AVX2_FMA;
  if (M >= (active == SCALAR ? GEMM_ROWS : avx2 ? DENSE_ROWS_AVX2 : DENSE_ROWS)) {
    dense<F>(c, x, y);
    return y;
  }
  if (M >= (avx2 ? GEMM_ROWS_AVX2 : GEMM_ROWS)) {
    gemm<F>(c, y);
    return y;
  }
  const Rows tiles[TILE] = {pick<F, 1>(active), pick<F, 2>(active), pick<F, 3>(active), pick<F, 4>(active),
                            pick<F, 5>(active), pick<F, 6>(active), pick<F, 7>(active), pick<F, 8>(active)};
  const int64_t tile = active == AVX512_F ? TILE : TILE_AVX2;
  // A chunk of output rows of about 16 KiB stays in L1/L2 while every tile of x passes over it;
  // for a decode step (one tile) the chunk is moot and each thread streams its share once.
  const int64_t chunk = std::clamp<int64_t>(16384 / row_bytes, 4, 64);
  const int64_t grain = M > tile ? chunk : std::max<int64_t>(1, 8192 / row_bytes);
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n0 = begin; n0 < end; n0 += chunk) {
      const int64_t n1 = std::min(end, n0 + chunk);
      for (int64_t m0 = 0; m0 < M; m0 += tile) tiles[std::min(tile, M - m0) - 1](c, m0, n0, n1);
    }
  });
  return y;
}

const char* isa_name(Isa isa) { return isa == AVX512_F ? "avx512" : isa == AVX2_FMA ? "avx2" : "scalar"; }

std::string isa() { return isa_name(active); }

void set_isa(const std::string& name) {
  Isa want = name == "avx512" ? AVX512_F : name == "avx2" ? AVX2_FMA : name == "scalar" ? SCALAR : best;
  TORCH_CHECK(name == isa_name(want), "set_isa: unknown path ", name, " (avx512, avx2 or scalar)");
  TORCH_CHECK(want <= best, "set_isa: this CPU cannot run ", name, "; the best it runs is ", isa_name(best));
  active = want;
}

}  // namespace

torch::Tensor q4_1_linear(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K) {
  return linear<Q41>(x, w, N, K, "q4_1_linear");
}
torch::Tensor q4_0_linear(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K) {
  return linear<Q40>(x, w, N, K, "q4_0_linear");
}
torch::Tensor q8_0_linear(const torch::Tensor& x, const torch::Tensor& w, int64_t N, int64_t K) {
  return linear<Q80>(x, w, N, K, "q8_0_linear");
}

// The linears as torch operators (torch.ops.llm_blocks.*), so that torch.compile traces a model
// that calls them and its graphs call them back: the blocks stay the graph's inputs, one copy,
// never folded in as constants. Their shapes for tracing are registered in Python (blocks.py).
TORCH_LIBRARY(llm_blocks, m) {
  m.def("q4_1_linear(Tensor x, Tensor w, int N, int K) -> Tensor");
  m.def("q4_0_linear(Tensor x, Tensor w, int N, int K) -> Tensor");
  m.def("q8_0_linear(Tensor x, Tensor w, int N, int K) -> Tensor");
}

TORCH_LIBRARY_IMPL(llm_blocks, CPU, m) {
  m.impl("q4_1_linear", &q4_1_linear);
  m.impl("q4_0_linear", &q4_0_linear);
  m.impl("q8_0_linear", &q8_0_linear);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", &isa, "the path in use: avx512, avx2 or scalar");
  m.def("set_isa", &set_isa, "force a path this CPU runs (tests run each one)");
}
