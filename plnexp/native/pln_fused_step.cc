// One PLN iteration's n x p work as a single XLA custom call (strategy=scan_fused).
//
// Per block of 48 rows (kept in cache from read to write):
//   R  = M - X B (profiled) or M (full), T = R Omega              (the n p^2 product, row block by row block)
//   Z  = O + X B + M (full) or O + M (profiled), A = exp(Z + S^2/2)
//   ELBO column sums of Y M - A + log|S|                          (the rest of the value is p x p work)
//   dM = Y - A - T, dS = 1/S - S (A + diag Omega), X'A (full: for dB)
//   the optimizer's elementwise update of M and S and of its slots (moments, step sizes)
//   C  = M_new (full) or M_new - X B (profiled): C'C (upper triangle), X'C, sum S_new^2
// The p x p closed forms (Sigma, Omega, B) stay in XLA: see plnexp/strategies/fused.py, which
// holds the Python reference of every formula here.
//
// The elementwise work runs over a block as one flat stretch of rows x p entries (the block's rows
// are contiguous), not row by row: with p = 114 a row is 7 vectors of 16 floats and a remainder
// that a scalar loop would take at about a quarter of the row's instructions. The per-column operands
// (X B, R Omega, diag Omega) are laid out flat to match, and per-column sums are kept flat and
// reduced over rows once per chunk.
//
// Sums over rows are taken per chunk of rows (a fixed number of chunks, whatever the number of
// threads) and the chunks added in order: the result does not depend on the thread count or on
// scheduling. Threads: XLA's own intra-op pool (ffi::ThreadPool), sized like XLA's.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ---------------------------------------------------------------------------------------------
// Vector width of the products' micro-kernel: AVX-512 where the build machine has it, else 256 bits.
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
constexpr int kMR = 8;  // rows of a register tile (8 x 2 vectors = 16 accumulators of 32 registers)
#else
constexpr int kVecBytes = 32;
constexpr int kMR = 6;  // 6 x 2 = 12 accumulators of 16 registers
#endif
constexpr int kNV = 2;         // vectors per register-tile row
constexpr int kBlock = 8 * 6;  // rows per block: a multiple of both kMR values (48 rows)
constexpr int kChunks = 16;    // fixed number of row chunks (deterministic sums)

template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};
template <typename T>
constexpr int kLanes = kVecBytes / sizeof(T);
template <typename T>
constexpr int kNR = kNV * kLanes<T>;  // columns of a register tile

template <typename T>
inline typename VecOf<T>::type load(const T* p) {
  typename VecOf<T>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
inline void store(T* p, typename VecOf<T>::type v) {
  std::memcpy(p, &v, sizeof(v));
}


// Scratch memory of the calling thread, kept from call to call (slot 0: a chunk's buffers, slot 1:
// the call's own): a fresh allocation per chunk or call costs page faults (measured ~15 us a chunk).
template <typename T>
T* thread_scratch(int slot, size_t n) {
  struct Arena {
    void* ptr[2] = {nullptr, nullptr};
    size_t bytes[2] = {0, 0};
    ~Arena() {
      std::free(ptr[0]);
      std::free(ptr[1]);
    }
  };
  thread_local Arena arena;
  const size_t bytes = ((n * sizeof(T) + 63) / 64) * 64 + 64;
  if (bytes > arena.bytes[slot]) {
    std::free(arena.ptr[slot]);
    arena.ptr[slot] = std::aligned_alloc(64, bytes);
    arena.bytes[slot] = bytes;
  }
  return static_cast<T*>(arena.ptr[slot]);
}

// Out (rows x ldo) = R (rows x lda, first k columns used) @ W (k x ld). rows: a multiple of kMR.
// ldo may be less than ld (the columns past k are zero-padding): the panels are written last to
// first, so that what a row's last panel writes past column ldo (into the next row) is overwritten
// by the next row's first panels; Out must hold (rows - 1) * ldo + ld elements.
template <typename T>
void product(const T* R, int64_t lda, const T* W, T* Out, int rows, int64_t k, int64_t ld, int64_t ldo) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  for (int64_t j0 = ld - kNR<T>; j0 >= 0; j0 -= kNR<T>) {
    for (int i0 = 0; i0 < rows; i0 += kMR) {
      V acc[kMR][kNV];
#pragma GCC unroll 16
      for (int i = 0; i < kMR; ++i)
        for (int v = 0; v < kNV; ++v) acc[i][v] = V{};
      const T* a = R + i0 * lda;
      for (int64_t kk = 0; kk < k; ++kk) {
        V b0 = load<T>(W + kk * ld + j0), b1 = load<T>(W + kk * ld + j0 + L);
#pragma GCC unroll 16
        for (int i = 0; i < kMR; ++i) {
          T s = a[i * lda + kk];
          acc[i][0] += s * b0;
          acc[i][1] += s * b1;
        }
      }
#pragma GCC unroll 16
      for (int i = 0; i < kMR; ++i) {
        store<T>(Out + (i0 + i) * ldo + j0, acc[i][0]);
        store<T>(Out + (i0 + i) * ldo + j0 + L, acc[i][1]);
      }
    }
  }
}

// Rows of a Gram buffer: ld rounded up to whole register tiles (kMR rows; 16 | ld but 6 does not
// divide 16 with 256-bit vectors).
inline int64_t gram_rows(int64_t ld) { return ((ld + kMR - 1) / kMR) * kMR; }

// One register tile of G: rows i0.. i0 + kMR, NV vectors of columns from j0.
template <int NV, typename T>
inline void gram_tile(const T* C, T* G, int rows, int64_t ld, int64_t ldc, int64_t i0, int64_t j0, bool first) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  V acc[kMR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = first ? V{} : load<T>(G + (i0 + i) * ld + j0 + v * L);
  for (int r = 0; r < rows; ++r) {
    const T* c = C + r * ldc;
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load<T>(c + j0 + v * L);
#pragma GCC unroll 16
    for (int i = 0; i < kMR; ++i) {
      const T s = c[i0 + i];
      for (int v = 0; v < NV; ++v) acc[i][v] += s * b[v];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < NV; ++v) store<T>(G + (i0 + i) * ld + j0 + v * L, acc[i][v]);
}

// G (gram_rows(ld) x ld) += C' C over `rows` rows of C (rows x ldc, ldc <= ld), only tiles touching
// the upper triangle. Reads (rows - 1) * ldc + gram_rows(ld) elements of C: where ldc < ld, the
// entries of G past column or row ldc are garbage (never read back); those up to ldc are exact.
// first: G's tiles are set rather than added to (the chunk's first block: no zeroing pass).
// Row tiles from row p on hold padding only and are skipped; a row tile whose first panel's first
// vector lies wholly below the diagonal starts with a one-vector tile.
template <typename T>
void gram_update(const T* C, T* G, int rows, int64_t p, int64_t ld, int64_t ldc, bool first) {
  constexpr int L = kLanes<T>;
  for (int64_t i0 = 0; i0 < p; i0 += kMR) {
    int64_t j0 = (i0 / kNR<T>) * kNR<T>;
    if (i0 - j0 >= L) {
      gram_tile<1, T>(C, G, rows, ld, ldc, i0, j0 + L, first);
      j0 += kNR<T>;
    }
    for (; j0 < ld; j0 += kNR<T>) gram_tile<kNV, T>(C, G, rows, ld, ldc, i0, j0, first);
  }
}

// ---------------------------------------------------------------------------------------------
// exp and log written so that the compiler vectorises the loops that call them (no libm calls).
// Range reduction + polynomial; both within ~2 ulp; NaN, overflow and log(0) as IEEE's.
template <typename T>
struct Bits;
template <>
struct Bits<float> {
  using I = int32_t;
  using U = uint32_t;
  static constexpr int kMant = 23, kBias = 127;
  static constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: x + kMagic rounds x to an integer
};
template <>
struct Bits<double> {
  using I = int64_t;
  using U = uint64_t;
  static constexpr int kMant = 52, kBias = 1023;
  static constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
};

template <typename T>
inline typename Bits<T>::I bits_of(T x) {
  typename Bits<T>::I i;
  std::memcpy(&i, &x, sizeof(T));
  return i;
}
template <typename T>
inline T from_bits(typename Bits<T>::I i) {
  T x;
  std::memcpy(&x, &i, sizeof(T));
  return x;
}

// Integer arithmetic through the magic-number trick only (no float <-> int64 conversions, which
// AVX2 has not), so that the loops vectorise on AVX2 and AVX-512 alike.
template <typename T>
inline T fast_exp(T x) {
  using I = typename Bits<T>::I;
  constexpr bool f32 = std::is_same_v<T, float>;
  const T hi = f32 ? T(88.7228393554688) : T(709.782712893384);
  const T lo = f32 ? T(-87.3365447505531) : T(-708.396418532264);
  const T log2e = T(1.4426950408889634);
  const T ln2_hi = f32 ? T(0.693145751953125) : T(0.6931471803691238);
  const T ln2_lo = f32 ? T(1.428606765330187e-06) : T(1.9082149292705877e-10);
  const T magic = Bits<T>::kMagic;
  T xc = std::min(std::max(x, lo), hi);
  T t = xc * log2e + magic;
  T n = t - magic;
  I ni = bits_of<T>(t) - bits_of<T>(magic);
  T r = (xc - n * ln2_hi) - n * ln2_lo;
  T p;
  if constexpr (f32) {
    p = T(1.0 / 5040);
    p = p * r + T(1.0 / 720);
    p = p * r + T(1.0 / 120);
    p = p * r + T(1.0 / 24);
    p = p * r + T(1.0 / 6);
    p = p * r + T(0.5);
    p = p * r + T(1);
    p = p * r + T(1);
  } else {
    p = T(1.0 / 6227020800.0);
    p = p * r + T(1.0 / 479001600.0);
    p = p * r + T(1.0 / 39916800.0);
    p = p * r + T(1.0 / 3628800.0);
    p = p * r + T(1.0 / 362880.0);
    p = p * r + T(1.0 / 40320.0);
    p = p * r + T(1.0 / 5040.0);
    p = p * r + T(1.0 / 720.0);
    p = p * r + T(1.0 / 120.0);
    p = p * r + T(1.0 / 24.0);
    p = p * r + T(1.0 / 6.0);
    p = p * r + T(0.5);
    p = p * r + T(1);
    p = p * r + T(1);
  }
  // 2^n in two factors, so that n = bias + 1 (x near hi) does not overflow the exponent field
  I n1 = ni >> 1, n2 = ni - n1;
  T s1 = from_bits<T>((n1 + Bits<T>::kBias) << Bits<T>::kMant);
  T s2 = from_bits<T>((n2 + Bits<T>::kBias) << Bits<T>::kMant);
  T out = p * s1 * s2;
  out = x > hi ? T(INFINITY) : out;
  out = x < lo ? T(0) : out;
  return x != x ? x : out;
}

template <typename T>
inline T fast_log(T x) {  // x >= 0, inf or NaN; subnormals are not expected (|S| of a fit)
  using I = typename Bits<T>::I;
  using U = typename Bits<T>::U;
  constexpr bool f32 = std::is_same_v<T, float>;
  constexpr int kMant = Bits<T>::kMant;
  const I mant_mask = (I(1) << kMant) - 1;
  const I b = bits_of<T>(x);
  const I expo = static_cast<I>(static_cast<U>(b) >> kMant);  // biased exponent (x >= 0)
  const T two_mant = from_bits<T>(I(Bits<T>::kBias + kMant) << kMant);  // 2^kMant
  const T ebiased = from_bits<T>(expo | bits_of<T>(two_mant)) - two_mant;  // exact, no int->float
  T m = from_bits<T>((b & mant_mask) | (I(Bits<T>::kBias) << kMant));  // in [1, 2)
  const T sqrt2 = T(1.4142135623730951);
  const bool big = m > sqrt2;
  m = big ? m * T(0.5) : m;
  const T ef = (ebiased - T(Bits<T>::kBias)) + (big ? T(1) : T(0));
  const T f = m - T(1);  // in [sqrt(1/2) - 1, sqrt(2) - 1]
  T out;
  if constexpr (f32) {
    // Cephes' logf: log(1 + f) = f - f^2/2 + f^3 P(f), no division (within ~1 ulp)
    const T z = f * f;
    T q = T(7.0376836292E-2);
    q = q * f + T(-1.1514610310E-1);
    q = q * f + T(1.1676998740E-1);
    q = q * f + T(-1.2420140846E-1);
    q = q * f + T(1.4249322787E-1);
    q = q * f + T(-1.6668057665E-1);
    q = q * f + T(2.0000714765E-1);
    q = q * f + T(-2.4999993993E-1);
    q = q * f + T(3.3333331174E-1);
    T y = (f * z) * q + ef * T(-2.12194440e-4);
    y = y - T(0.5) * z;
    out = (f + y) + ef * T(0.693359375);
  } else {
    const T s = f / (T(2) + f);
    const T s2 = s * s;
    T q = T(1.0 / 23);
    q = q * s2 + T(1.0 / 21);
    q = q * s2 + T(1.0 / 19);
    q = q * s2 + T(1.0 / 17);
    q = q * s2 + T(1.0 / 15);
    q = q * s2 + T(1.0 / 13);
    q = q * s2 + T(1.0 / 11);
    q = q * s2 + T(1.0 / 9);
    q = q * s2 + T(1.0 / 7);
    q = q * s2 + T(1.0 / 5);
    q = q * s2 + T(1.0 / 3);
    const T ln2_hi = T(0.6931471803691238);
    const T ln2_lo = T(1.9082149292705877e-10);
    // log m = 2 atanh(s) = 2 s + 2 s^3 q(s^2)
    out = (T(2) * s * (s2 * q) + ef * ln2_lo) + T(2) * s + ef * ln2_hi;
  }
  out = x == T(0) ? -T(INFINITY) : out;
  out = x == T(INFINITY) ? x : out;
  return (x != x || x < T(0)) ? T(NAN) : out;
}

// ---------------------------------------------------------------------------------------------
// The optimizers' elementwise rules (ids: plnexp/strategies/fused.py's RULES). `g` is the gradient
// of the loss (-ELBO), `x` the parameter, `u`/`v` its slots; `c` the coefficients of this step,
// computed in XLA from the shared step count exactly as optax does (fused.py's coefficients()).
enum Rule : int32_t { kSgd = 0, kAdam = 1, kRadamClip = 2, kRprop = 3 };
template <int R>
constexpr int kSlots = R == kSgd ? 0 : 2;

// The coefficients as values (loaded once per call, so that the compiler keeps them in registers),
// with the divisions by the bias corrections turned into products by their reciprocals, taken once
// per call (x / c and x * (1 / c) differ by at most an ulp: within the tests' tolerances).
template <typename T>
struct Coef {
  T c[10];
  T inv_bc1, inv_bc2;  // 1 / (1 - b1^t), 1 / (1 - b2^t)
  T adam_scale;        // -lr / (1 - b1^t)
  T radam_scale;       // r / (1 - b1^t)
  explicit Coef(const T* raw) {
    for (int i = 0; i < 10; ++i) c[i] = raw[i];
    inv_bc1 = c[4] != T(0) ? T(1) / c[4] : T(0);
    inv_bc2 = c[5] != T(0) ? T(1) / c[5] : T(0);
    adam_scale = c[7] * inv_bc1;
    radam_scale = c[9] * inv_bc1;
  }
};

// Rectified: RAdam past its warm-up (optax's `ro >= threshold`), a template argument so that the
// loop has no loop-invariant branch (GCC does not vectorise one).
template <int R, bool Rectified, typename T>
inline T update(const Coef<T>& k, T g, T x, T& u, T& v) {
  const T* c = k.c;
  if constexpr (R == kSgd) {  // c = [-lr]
    return x + c[0] * g;
  } else if constexpr (R == kAdam || R == kRadamClip) {
    // c = [1-b1, b1, 1-b2, b2, 1-b1^t, 1-b2^t, eps, -lr (adam), use_r, r (radam)]
    const T mu = c[0] * g + c[1] * u;
    const T nu = c[2] * (g * g) + c[3] * v;
    u = mu;
    v = nu;
    const T root = std::sqrt(nu * k.inv_bc2) + c[6];  // sqrt(nu_hat) + eps
    if constexpr (R == kAdam) {
      return x + (k.adam_scale * mu) / root;  // -lr mu_hat / (sqrt(nu_hat) + eps)
    } else {
      T step;
      if constexpr (Rectified)
        step = -((k.radam_scale * mu) / root);  // -(r mu_hat) / (sqrt(nu_hat) + eps)
      else
        step = -(mu * k.inv_bc1);  // -mu_hat
      return x + std::min(std::max(step, T(-0.1)), T(0.1));
    }
  } else {  // rprop; u: step size, v: previous update; c = [eta_plus, eta_minus, min step, max step]
    const T sgn = g * v;
    const T grown = std::min(std::max(u * (sgn > T(0) ? c[0] : c[1]), c[2]), c[3]);
    const T step_size = sgn == T(0) ? u : grown;
    const T sign_g = g > T(0) ? T(1) : (g < T(0) ? T(-1) : g);
    const T applied = sgn < T(0) ? T(0) : v;  // optax 0.2.x applies the *previous* update
    u = step_size;
    v = sgn < T(0) ? T(0) : step_size * sign_g;
    return x - applied;
  }
}

template <typename T>
struct Work {
  int64_t n, p, d, ld;
  const T *Y, *O, *X, *B, *M, *S, *Omega_pad, *coef;
  const T* slot_in[4];  // M's two slots, then S's
  T *M_out, *S_out;
  T* slot_out[4];
  int64_t chunk_rows;
  // per chunk: Gram (gram_rows(ld) x ld, upper tiles), colsum (p), s2 (p), xta (d p), xtc (d p)
  T* gram;
  double *colsum, *s2, *xta, *xtc;
};

// A block of rows as one flat stretch of `count` = rows x p entries (the rows of Y, O, M, S and the
// slots are contiguous): value, gradient, update and the next statistics in one pass, with no
// per-row remainder loop. The per-column inputs come as flat block buffers: X B (xb), R Omega (t),
// diag Omega repeated (diag); the per-column sums go to flat accumulators (colsum, s2), reduced
// over rows at the end of the chunk.
template <int R, bool Full, bool Rectified, typename T>
inline void block_pass(const Work<T>& w, const Coef<T> k, int64_t off, int64_t count, const T* __restrict xb,
                       const T* __restrict t, const T* __restrict diag, T* __restrict a_out, T* __restrict cc,
                       T* __restrict colsum, T* __restrict s2) {
  const T* __restrict y = w.Y + off;
  const T* __restrict o = w.O + off;
  const T* __restrict m = w.M + off;
  const T* __restrict s = w.S + off;
  T* __restrict m_out = w.M_out + off;
  T* __restrict s_out = w.S_out + off;
  // the slots are read then written at the same index (in place when XLA aliases them): no restrict
  T* um = w.slot_out[0] + off;
  T* vm = w.slot_out[1] + off;
  T* us = w.slot_out[2] + off;
  T* vs = w.slot_out[3] + off;
  const T* um_in = w.slot_in[0] + off;
  const T* vm_in = w.slot_in[1] + off;
  const T* us_in = w.slot_in[2] + off;
  const T* vs_in = w.slot_in[3] + off;
#pragma GCC ivdep
  for (int64_t e = 0; e < count; ++e) {
    const T ye = y[e], me = m[e], se = s[e];
    const T z = Full ? (o[e] + xb[e]) + me : o[e] + me;
    const T a = fast_exp<T>(z + (T(0.5) * se) * se);
    colsum[e] += (ye * me - a) + fast_log<T>(std::abs(se));
    if constexpr (Full) a_out[e] = a;
    const T dm = (ye - a) - t[e];
    const T ds = T(1) / se - se * (a + diag[e]);
    T u1 = T(0), v1 = T(0), u2 = T(0), v2 = T(0);
    if constexpr (kSlots<R> > 0) {
      u1 = um_in[e];
      v1 = vm_in[e];
      u2 = us_in[e];
      v2 = vs_in[e];
    }
    const T mn = update<R, Rectified, T>(k, -dm, me, u1, v1);
    const T sn = update<R, Rectified, T>(k, -ds, se, u2, v2);
    if constexpr (kSlots<R> > 0) {
      um[e] = u1;
      vm[e] = v1;
      us[e] = u2;
      vs[e] = v2;
    }
    m_out[e] = mn;
    s_out[e] = sn;
    if constexpr (!Full) cc[e] = mn - xb[e];
    s2[e] += sn * sn;
  }
}

template <int R, bool Full, typename T>
void run_chunk(const Work<T>& w, int64_t chunk) {
  const int64_t n = w.n, p = w.p, d = w.d, ld = w.ld;
  const int64_t begin = chunk * w.chunk_rows, end = std::min(n, begin + w.chunk_rows);
  if (begin >= end) return;
  // block buffers: rows x p, plus what the products' last tiles read or write past the last row
  const int64_t flat = kBlock * p, spill = gram_rows(ld) - p;
  // scratch: every entry read is written first, but for the sums (zeroed) and Rm's padding rows
  // (zeroed where used). Each buffer rounded up to whole cache lines.
  const int64_t line = 64 / sizeof(T);
  auto up = [line](int64_t m) { return ((m + line - 1) / line) * line; };
  const int64_t sizes[8] = {up(kBlock * ld), up(flat + spill), up(flat + spill), up(flat), up(flat), up(flat),
                            up(flat), up(flat)};
  int64_t total = 0;
  for (int64_t z : sizes) total += z;
  T* base = thread_scratch<T>(0, total);
  T* bufs[8];
  for (int i = 0; i < 8; ++i) {
    bufs[i] = base;
    base += sizes[i];
  }
  T *Rm = bufs[0], *Tm = bufs[1], *C = bufs[2], *XB = bufs[3], *A = bufs[4], *diag = bufs[5], *colsum_b = bufs[6],
    *s2_b = bufs[7];
  std::memset(colsum_b, 0, 2 * sizes[6] * sizeof(T));  // colsum_b and s2_b, adjacent
  T* gram = w.gram + chunk * gram_rows(ld) * ld;  // its upper tiles set by the first block
  double* xs = (Full ? w.xta : w.xtc) + chunk * d * p;
  for (int64_t i = 0; i < kBlock; ++i)
    for (int64_t j = 0; j < p; ++j) diag[i * p + j] = w.Omega_pad[j * ld + j];
  const Coef<T> k(w.coef);
  for (int64_t r0 = begin; r0 < end; r0 += kBlock) {
    const int rows = static_cast<int>(std::min<int64_t>(kBlock, end - r0));
    const int padded = ((rows + kMR - 1) / kMR) * kMR;
    const int64_t off = r0 * p, count = rows * p;
    // X B for the block, and R = M (full) or M - X B (profiled), zero-padded to ld columns
    for (int i = 0; i < rows; ++i) {
      const T* x = w.X + (r0 + i) * d;
      T* xb = XB + i * p;
      for (int64_t j = 0; j < p; ++j) xb[j] = T(0);
      for (int64_t q = 0; q < d; ++q) {
        const T xq = x[q];
        const T* b = w.B + q * p;
        for (int64_t j = 0; j < p; ++j) xb[j] += xq * b[j];
      }
      if constexpr (!Full) {
        const T* m = w.M + off + i * p;
        T* rr = Rm + i * ld;
        for (int64_t j = 0; j < p; ++j) rr[j] = m[j] - xb[j];
      }
    }
    if (Full && rows == padded) {  // R = M: the product reads M's rows where they are
      product<T>(w.M + off, p, w.Omega_pad, Tm, padded, p, ld, p);
    } else {
      if constexpr (Full)
        for (int i = 0; i < rows; ++i) std::memcpy(Rm + i * ld, w.M + off + i * p, p * sizeof(T));
      for (int i = rows; i < padded; ++i) std::memset(Rm + i * ld, 0, ld * sizeof(T));
      product<T>(Rm, ld, w.Omega_pad, Tm, padded, p, ld, p);
    }
    if (R == kRadamClip && k.c[8] != T(0))
      block_pass<R, Full, true, T>(w, k, off, count, XB, Tm, diag, A, C, colsum_b, s2_b);
    else
      block_pass<R, Full, false, T>(w, k, off, count, XB, Tm, diag, A, C, colsum_b, s2_b);
    // X'A (full) or X'C (profiled), in double: the profiled model's Sigma takes X'C' (X'X)^-1 X'C
    // from C'C, a difference that float sums of C would spoil
    const T* src = Full ? A : C;
    for (int i = 0; i < rows; ++i) {
      const T* x = w.X + (r0 + i) * d;
      for (int64_t q = 0; q < d; ++q) {
        const double xq = static_cast<double>(x[q]);
        double* __restrict acc = xs + q * p;
        const T* __restrict row = src + i * p;
        for (int64_t j = 0; j < p; ++j) acc[j] += xq * static_cast<double>(row[j]);
      }
    }
    // C'C from the new rows: C = M_new (full: read where it is, unless fewer than `spill` entries
    // follow the block, where the last panel's read past its last row would leave the array) or
    // M_new - X B (profiled)
    if (Full && (n - r0 - rows) * p >= spill) {
      gram_update<T>(w.M_out + off, gram, rows, p, ld, p, r0 == begin);
    } else {
      if constexpr (Full) std::memcpy(C, w.M_out + off, count * sizeof(T));
      std::memset(C + count, 0, spill * sizeof(T));
      gram_update<T>(C, gram, rows, p, ld, p, r0 == begin);
    }
  }
  // the chunk's sums over its rows, in double
  double* colsum = w.colsum + chunk * p;
  double* s2 = w.s2 + chunk * p;
  for (int64_t i = 0; i < kBlock; ++i)
    for (int64_t j = 0; j < p; ++j) {
      colsum[j] += static_cast<double>(colsum_b[i * p + j]);
      s2[j] += static_cast<double>(s2_b[i * p + j]);
    }
}

// Runs fn(chunk) for every chunk, on the calling thread and up to (pool size - 1) pool tasks.
// A task that starts after the work is done returns at once (it never waits for anything): no
// deadlock whether or not the pool has free threads, and no task touches the call's memory after
// the call returns.
struct Gate {
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  int active = 0;
  bool closed = false;
};

template <typename F>
void parallel_chunks(ffi::ThreadPool& pool, int64_t nchunks, const F& fn) {
  auto gate = std::make_shared<Gate>();
  auto drain = [&gate, nchunks, &fn]() {
    for (int64_t c; (c = gate->next.fetch_add(1)) < nchunks;) fn(c);
  };
  int64_t threads = std::min<int64_t>(pool.num_threads(), nchunks);
  for (int64_t t = 1; t < threads; ++t) {
    std::shared_ptr<Gate> g = gate;
    auto* drain_ptr = &drain;
    pool.Schedule([g, drain_ptr]() {
      {
        std::lock_guard<std::mutex> lock(g->mu);
        if (g->closed) return;
        ++g->active;
      }
      (*drain_ptr)();
      {
        std::lock_guard<std::mutex> lock(g->mu);
        --g->active;
      }
      g->cv.notify_all();
    });
  }
  drain();
  std::unique_lock<std::mutex> lock(gate->mu);
  gate->cv.wait(lock, [&gate] { return gate->active == 0; });
  gate->closed = true;
}

int64_t nchunks_for(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>(kChunks, (n + kBlock - 1) / kBlock)); }

template <ffi::DataType DT>
ffi::Error FusedStep(ffi::ThreadPool pool, ffi::Buffer<DT> Y, ffi::Buffer<DT> O, ffi::Buffer<DT> X,
                     ffi::Buffer<DT> B, ffi::Buffer<DT> M, ffi::Buffer<DT> S, ffi::Buffer<DT> Omega,
                     ffi::Buffer<DT> coef, ffi::Buffer<DT> um, ffi::Buffer<DT> vm, ffi::Buffer<DT> us,
                     ffi::Buffer<DT> vs, ffi::ResultBuffer<DT> M_out, ffi::ResultBuffer<DT> S_out,
                     ffi::ResultBuffer<DT> um_out, ffi::ResultBuffer<DT> vm_out, ffi::ResultBuffer<DT> us_out,
                     ffi::ResultBuffer<DT> vs_out, ffi::ResultBuffer<DT> colsum_out,
                     ffi::ResultBuffer<DT> xta_out, ffi::ResultBuffer<DT> gram_out,
                     ffi::ResultBuffer<DT> s2_out, ffi::ResultBuffer<DT> xtc_out, int32_t model,
                     int32_t rule) {
  using T = ffi::NativeType<DT>;
  auto dims = Y.dimensions();
  if (dims.size() != 2) return ffi::Error::InvalidArgument("pln_fused_step: Y must be (n, p)");
  const int64_t n = dims[0], p = dims[1];
  const int64_t d = X.dimensions()[1];
  if (model != 0 && model != 1) return ffi::Error::InvalidArgument("pln_fused_step: model must be 0 or 1");
  if (rule < kSgd || rule > kRprop) return ffi::Error::InvalidArgument("pln_fused_step: unknown rule");
  const int64_t ld = ((p + kNR<T> - 1) / kNR<T>) * kNR<T>;

  T* omega = thread_scratch<T>(1, p * ld + nchunks_for(n) * gram_rows(ld) * ld);
  T* gram = omega + p * ld;
  for (int64_t i = 0; i < p; ++i) {
    std::memcpy(omega + i * ld, Omega.typed_data() + i * p, p * sizeof(T));
    std::memset(omega + i * ld + p, 0, (ld - p) * sizeof(T));
  }

  const int64_t nchunks = nchunks_for(n);
  int64_t chunk_rows = (n + nchunks - 1) / nchunks;
  std::vector<double> colsum(nchunks * p, 0.0), s2(nchunks * p, 0.0), xta(nchunks * d * p, 0.0),
      xtc(nchunks * d * p, 0.0);

  Work<T> w;
  w.n = n;
  w.p = p;
  w.d = d;
  w.ld = ld;
  w.Y = Y.typed_data();
  w.O = O.typed_data();
  w.X = X.typed_data();
  w.B = B.typed_data();
  w.M = M.typed_data();
  w.S = S.typed_data();
  w.Omega_pad = omega;
  w.coef = coef.typed_data();
  w.slot_in[0] = um.typed_data();
  w.slot_in[1] = vm.typed_data();
  w.slot_in[2] = us.typed_data();
  w.slot_in[3] = vs.typed_data();
  w.M_out = M_out->typed_data();
  w.S_out = S_out->typed_data();
  w.slot_out[0] = um_out->typed_data();
  w.slot_out[1] = vm_out->typed_data();
  w.slot_out[2] = us_out->typed_data();
  w.slot_out[3] = vs_out->typed_data();
  w.chunk_rows = chunk_rows;
  w.gram = gram;
  w.colsum = colsum.data();
  w.s2 = s2.data();
  w.xta = xta.data();
  w.xtc = xtc.data();

  auto chunks = [&](auto chunk_fn) { parallel_chunks(pool, nchunks, chunk_fn); };
  const bool full = model == 0;
#define PLNEXP_CASE(R)                                                             \
  case R:                                                                          \
    if (full)                                                                      \
      chunks([&w](int64_t c) { run_chunk<R, true, T>(w, c); });                    \
    else                                                                           \
      chunks([&w](int64_t c) { run_chunk<R, false, T>(w, c); });                   \
    break;
  switch (rule) {
    PLNEXP_CASE(kSgd)
    PLNEXP_CASE(kAdam)
    PLNEXP_CASE(kRadamClip)
    PLNEXP_CASE(kRprop)
  }
#undef PLNEXP_CASE

  // the chunks' Grams added in order, in double; rows of the triangle dealt to the threads in turn
  T* g_out = gram_out->typed_data();
  const int64_t groups = std::min<int64_t>(8, p);
  parallel_chunks(pool, groups, [&](int64_t g) {
    std::vector<double> acc(p);
    for (int64_t i = g; i < p; i += groups) {
      std::fill(acc.begin() + i, acc.end(), 0.0);
      for (int64_t c = 0; c < nchunks; ++c) {
        const T* row = gram + c * gram_rows(ld) * ld + i * ld;
        for (int64_t j = i; j < p; ++j) acc[j] += static_cast<double>(row[j]);
      }
      for (int64_t j = i; j < p; ++j) {
        g_out[i * p + j] = static_cast<T>(acc[j]);
        g_out[j * p + i] = static_cast<T>(acc[j]);
      }
    }
  });
  auto reduce = [nchunks](const std::vector<double>& parts, int64_t size, T* out) {
    for (int64_t k = 0; k < size; ++k) {
      double acc = 0.0;
      for (int64_t c = 0; c < nchunks; ++c) acc += parts[c * size + k];
      out[k] = static_cast<T>(acc);
    }
  };
  reduce(colsum, p, colsum_out->typed_data());
  reduce(s2, p, s2_out->typed_data());
  reduce(xta, d * p, xta_out->typed_data());
  reduce(xtc, d * p, xtc_out->typed_data());
  return ffi::Error::Success();
}

}  // namespace

#define PLNEXP_BIND(DT)                          \
  ffi::Ffi::Bind()                               \
      .Ctx<ffi::ThreadPool>()                    \
      .Arg<ffi::Buffer<DT>>() /* Y */            \
      .Arg<ffi::Buffer<DT>>() /* O */            \
      .Arg<ffi::Buffer<DT>>() /* X */            \
      .Arg<ffi::Buffer<DT>>() /* B */            \
      .Arg<ffi::Buffer<DT>>() /* M */            \
      .Arg<ffi::Buffer<DT>>() /* S */            \
      .Arg<ffi::Buffer<DT>>() /* Omega */        \
      .Arg<ffi::Buffer<DT>>() /* coef */         \
      .Arg<ffi::Buffer<DT>>() /* M slot u */     \
      .Arg<ffi::Buffer<DT>>() /* M slot v */     \
      .Arg<ffi::Buffer<DT>>() /* S slot u */     \
      .Arg<ffi::Buffer<DT>>() /* S slot v */     \
      .Ret<ffi::Buffer<DT>>() /* M new */        \
      .Ret<ffi::Buffer<DT>>() /* S new */        \
      .Ret<ffi::Buffer<DT>>() /* M slot u new */ \
      .Ret<ffi::Buffer<DT>>() /* M slot v new */ \
      .Ret<ffi::Buffer<DT>>() /* S slot u new */ \
      .Ret<ffi::Buffer<DT>>() /* S slot v new */ \
      .Ret<ffi::Buffer<DT>>() /* colsum (p) */   \
      .Ret<ffi::Buffer<DT>>() /* X'A (d, p) */   \
      .Ret<ffi::Buffer<DT>>() /* C'C (p, p) */   \
      .Ret<ffi::Buffer<DT>>() /* sum S^2 (p) */  \
      .Ret<ffi::Buffer<DT>>() /* X'C (d, p) */   \
      .Attr<int32_t>("model")                    \
      .Attr<int32_t>("rule")

XLA_FFI_DEFINE_HANDLER_SYMBOL(PlnFusedStepF32, FusedStep<ffi::DataType::F32>, PLNEXP_BIND(ffi::DataType::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(PlnFusedStepF64, FusedStep<ffi::DataType::F64>, PLNEXP_BIND(ffi::DataType::F64));
