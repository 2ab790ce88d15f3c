// One PLN iteration's n x p work as a single XLA custom call (strategy=scan_fused).
//
// Per block of rows (kept in cache from read to write):
//   R  = M - X B (profiled) or M (full), T = R Omega              (the n p^2 product, row block by row block)
//   Z  = O + X B + M (full) or O + M (profiled), A = exp(Z + S^2/2)
//   ELBO column sums of Y M - A + log|S|                          (the rest of the value is p x p work)
//   dM = Y - A - T, dS = 1/S - S (A + diag Omega), X'A (full: for dB)
//   the optimizer's elementwise update of M and S and of its slots (moments, step sizes)
//   C  = M_new (full) or M_new - X B (profiled): C'C (upper triangle), X'C, sum S_new^2
// The p x p closed forms (Sigma, Omega, B) stay in XLA: see plnexp/strategies/fused.py, which
// holds the Python reference of every formula here.
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

template <typename T>
struct Aligned {
  T* ptr = nullptr;
  explicit Aligned(size_t n) {
    size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
    ptr = static_cast<T*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
    std::memset(ptr, 0, bytes == 0 ? 64 : bytes);
  }
  ~Aligned() { std::free(ptr); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
};

// Out (rows x ld) = R (rows x lda, first k columns used) @ W (k x ld). rows: a multiple of kMR.
template <typename T>
void product(const T* R, int64_t lda, const T* W, T* Out, int rows, int64_t k, int64_t ld) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  for (int64_t j0 = 0; j0 < ld; j0 += kNR<T>) {
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
        store<T>(Out + (i0 + i) * ld + j0, acc[i][0]);
        store<T>(Out + (i0 + i) * ld + j0 + L, acc[i][1]);
      }
    }
  }
}

// G (ld x ld) += C' C over `rows` rows of C (rows x ld), only tiles touching the upper triangle.
template <typename T>
void gram_update(const T* C, T* G, int rows, int64_t ld) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  for (int64_t i0 = 0; i0 < ld; i0 += kMR) {
    int64_t first_panel = (i0 / kNR<T>) * kNR<T>;
    for (int64_t j0 = first_panel; j0 < ld; j0 += kNR<T>) {
      V acc[kMR][kNV];
#pragma GCC unroll 16
      for (int i = 0; i < kMR; ++i) {
        acc[i][0] = load<T>(G + (i0 + i) * ld + j0);
        acc[i][1] = load<T>(G + (i0 + i) * ld + j0 + L);
      }
      for (int r = 0; r < rows; ++r) {
        const T* c = C + r * ld;
        V b0 = load<T>(c + j0), b1 = load<T>(c + j0 + L);
#pragma GCC unroll 16
        for (int i = 0; i < kMR; ++i) {
          T s = c[i0 + i];
          acc[i][0] += s * b0;
          acc[i][1] += s * b1;
        }
      }
#pragma GCC unroll 16
      for (int i = 0; i < kMR; ++i) {
        store<T>(G + (i0 + i) * ld + j0, acc[i][0]);
        store<T>(G + (i0 + i) * ld + j0 + L, acc[i][1]);
      }
    }
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
  const T f = m - T(1);
  const T s = f / (T(2) + f);
  const T s2 = s * s;
  T q;
  if constexpr (f32) {
    q = T(1.0 / 11);
    q = q * s2 + T(1.0 / 9);
    q = q * s2 + T(1.0 / 7);
    q = q * s2 + T(1.0 / 5);
    q = q * s2 + T(1.0 / 3);
  } else {
    q = T(1.0 / 23);
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
  }
  const T ln2_hi = f32 ? T(0.693145751953125) : T(0.6931471803691238);
  const T ln2_lo = f32 ? T(1.428606765330187e-06) : T(1.9082149292705877e-10);
  // log m = 2 atanh(s) = 2 s + 2 s^3 q(s^2)
  T out = (T(2) * s * (s2 * q) + ef * ln2_lo) + T(2) * s + ef * ln2_hi;
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

// The coefficients as values (loaded once per call, so that the compiler keeps them in registers).
template <typename T>
struct Coef {
  T c[10];
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
    const T mu_hat = mu / c[4], nu_hat = nu / c[5];
    if constexpr (R == kAdam) {
      return x + c[7] * (mu_hat / (std::sqrt(nu_hat) + c[6]));
    } else {
      T step;
      if constexpr (Rectified)
        step = -((c[9] * mu_hat) / (std::sqrt(nu_hat) + c[6]));
      else
        step = -mu_hat;
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
  // per chunk: Gram (ld x ld, upper tiles), colsum (p), s2 (p), xta (d p), xtc (d p)
  T* gram;
  double *colsum, *s2, *xta, *xtc;
};

// One row: value, gradient, update and the next statistics, in one pass over its p entries.
template <int R, bool Full, bool Rectified, typename T>
inline void row_pass(const Work<T>& w, const Coef<T> k, int64_t off, const T* __restrict xb, const T* __restrict t,
                     const T* __restrict diag, T* __restrict a_row, T* __restrict cc, double* __restrict colsum,
                     double* __restrict s2) {
  const int64_t p = w.p;
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
  for (int64_t j = 0; j < p; ++j) {
    const T yj = y[j], mj = m[j], sj = s[j];
    const T z = Full ? (o[j] + xb[j]) + mj : o[j] + mj;
    const T a = fast_exp<T>(z + (T(0.5) * sj) * sj);
    colsum[j] += static_cast<double>((yj * mj - a) + fast_log<T>(std::abs(sj)));
    a_row[j] = a;
    const T dm = (yj - a) - t[j];
    const T ds = T(1) / sj - sj * (a + diag[j]);
    T u1 = T(0), v1 = T(0), u2 = T(0), v2 = T(0);
    if constexpr (kSlots<R> > 0) {
      u1 = um_in[j];
      v1 = vm_in[j];
      u2 = us_in[j];
      v2 = vs_in[j];
    }
    const T mn = update<R, Rectified, T>(k, -dm, mj, u1, v1);
    const T sn = update<R, Rectified, T>(k, -ds, sj, u2, v2);
    if constexpr (kSlots<R> > 0) {
      um[j] = u1;
      vm[j] = v1;
      us[j] = u2;
      vs[j] = v2;
    }
    m_out[j] = mn;
    s_out[j] = sn;
    cc[j] = Full ? mn : mn - xb[j];
    s2[j] += static_cast<double>(sn * sn);
  }
}

template <int R, bool Full, typename T>
void run_chunk(const Work<T>& w, int64_t chunk) {
  const int64_t n = w.n, p = w.p, d = w.d, ld = w.ld;
  const int64_t begin = chunk * w.chunk_rows, end = std::min(n, begin + w.chunk_rows);
  if (begin >= end) return;
  Aligned<T> Rm(kBlock * ld), Tm(kBlock * ld), C(kBlock * ld), XB(kBlock * p), diag(p);
  T* gram = w.gram + chunk * ld * ld;
  double* colsum = w.colsum + chunk * p;
  double* s2 = w.s2 + chunk * p;
  double* xta = w.xta + chunk * d * p;
  double* xtc = w.xtc + chunk * d * p;
  for (int64_t j = 0; j < p; ++j) diag.ptr[j] = w.Omega_pad[j * ld + j];
  Coef<T> k;
  for (int i = 0; i < 10; ++i) k.c[i] = w.coef[i];
  for (int64_t r0 = begin; r0 < end; r0 += kBlock) {
    const int rows = static_cast<int>(std::min<int64_t>(kBlock, end - r0));
    const int padded = ((rows + kMR - 1) / kMR) * kMR;
    // X B for the block, and R = M (full) or M - X B (profiled), zero-padded to ld columns
    for (int i = 0; i < rows; ++i) {
      const T* x = w.X + (r0 + i) * d;
      T* xb = XB.ptr + i * p;
      for (int64_t j = 0; j < p; ++j) xb[j] = T(0);
      for (int64_t k = 0; k < d; ++k) {
        const T xk = x[k];
        const T* b = w.B + k * p;
        for (int64_t j = 0; j < p; ++j) xb[j] += xk * b[j];
      }
      if constexpr (!Full) {
        const T* m = w.M + (r0 + i) * p;
        T* rr = Rm.ptr + i * ld;
        for (int64_t j = 0; j < p; ++j) rr[j] = m[j] - xb[j];
      }
    }
    if (Full && rows == padded) {  // R = M: the product reads M's rows where they are
      product<T>(w.M + r0 * p, p, w.Omega_pad, Tm.ptr, padded, p, ld);
    } else {
      if constexpr (Full)
        for (int i = 0; i < rows; ++i) std::memcpy(Rm.ptr + i * ld, w.M + (r0 + i) * p, p * sizeof(T));
      for (int i = rows; i < padded; ++i) std::memset(Rm.ptr + i * ld, 0, ld * sizeof(T));
      product<T>(Rm.ptr, ld, w.Omega_pad, Tm.ptr, padded, p, ld);
    }
    for (int i = 0; i < rows; ++i) {
      T* cc = C.ptr + i * ld;
      T* a_row = Rm.ptr + i * ld;  // R's row is used up: A goes there (for X'A)
      const int64_t off = (r0 + i) * p;
      const T* xb = XB.ptr + i * p;
      const T* t = Tm.ptr + i * ld;
      if (R == kRadamClip && k.c[8] != T(0))
        row_pass<R, Full, true, T>(w, k, off, xb, t, diag.ptr, a_row, cc, colsum, s2);
      else
        row_pass<R, Full, false, T>(w, k, off, xb, t, diag.ptr, a_row, cc, colsum, s2);
      for (int64_t j = p; j < ld; ++j) cc[j] = T(0);
      const T* x = w.X + (r0 + i) * d;
      for (int64_t q = 0; q < d; ++q) {
        const double xk = static_cast<double>(x[q]);
        double* acc = (Full ? xta : xtc) + q * p;
        const T* src = Full ? a_row : cc;
        for (int64_t j = 0; j < p; ++j) acc[j] += xk * static_cast<double>(src[j]);
      }
    }
    gram_update<T>(C.ptr, gram, rows, ld);
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

  Aligned<T> omega(p * ld);
  for (int64_t i = 0; i < p; ++i)
    std::memcpy(omega.ptr + i * ld, Omega.typed_data() + i * p, p * sizeof(T));

  int64_t nchunks = std::max<int64_t>(1, std::min<int64_t>(kChunks, (n + kBlock - 1) / kBlock));
  int64_t chunk_rows = (n + nchunks - 1) / nchunks;
  Aligned<T> gram(nchunks * ld * ld);
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
  w.Omega_pad = omega.ptr;
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
  w.gram = gram.ptr;
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

  // chunks added in order, in double
  T* g_out = gram_out->typed_data();
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = i; j < p; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < nchunks; ++c) acc += static_cast<double>(gram.ptr[c * ld * ld + i * ld + j]);
      g_out[i * p + j] = static_cast<T>(acc);
      g_out[j * p + i] = static_cast<T>(acc);
    }
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
