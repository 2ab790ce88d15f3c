// One PLN iteration's n x p work as a single XLA custom call (strategy=scan_fused).
//
// Per block of 48 rows (kept in cache from read to write):
//   R  = M - X B (profiled) or M (full), T = R Omega              (the n p^2 product, row block by row block)
//   Z  = O + X B + M (full) or O + M (profiled), A = exp(Z + S^2/2)
//   ELBO column sums of Y M - A + log|S|                          (the rest of the value is p x p work)
//   dM = Y - A - T, dS = 1/S - S (A + diag Omega), X'A (full: for dB)
//   the optimizer's elementwise update of M and S and of its slots (moments, step sizes)
//   C  = M_new (full) or M_new - X B (profiled): C'C (upper triangle), X'C, sum S^2_new
// The p x p closed forms (Sigma, Omega, B) stay in XLA: see plnexp/strategies/fused.py, which
// holds the Python reference of every formula here.
//
// The elementwise work runs over a block as one flat stretch of rows x p entries (the block's rows
// are contiguous), not row by row: with p = 114 a row is 7 vectors of 16 floats and a remainder
// that a scalar loop would take at about a quarter of the row's instructions. The per-column operands
// (X B, R Omega, diag Omega) are laid out flat to match, and per-column sums are kept flat and
// reduced over rows at the end of each chunk.
//
// Sums over rows are taken per chunk of rows (a fixed number of chunks, whatever the number of
// threads) and the chunks added in order: the result does not depend on the thread count or on
// scheduling. Threads: XLA's own intra-op pool (ffi::ThreadPool), sized like XLA's.
//
// Code paths. One library runs on every x86-64 CPU: the kernel (pln_fused_kernel.inc) is compiled
// three times, into the namespaces avx512 (x86-64-v4's AVX-512 F/DQ/VL/BW/CD), avx2 (AVX2, FMA,
// BMI1/2) and baseline (x86-64: SSE2), each under its own `#pragma GCC target`, with handlers
// PlnFusedStep{F32,F64}_{avx512,avx2,baseline}; plnexp_fused_isas() says which of them this CPU
// runs and fused.py registers only those. Everything else (headers, shapes' checks, threads,
// exports) is compiled once without a target pragma, for the baseline CPU: no code that the loader
// or a check runs can hold an instruction that the CPU lacks. One translation unit rather than one
// object per code path: inline functions of the headers, compiled in several objects with
// different flags, would be merged by the linker into one copy of unknown flags. Elsewhere (another
// architecture, or a compiler without GCC's target pragmas) the baseline path only is built, for
// the flags the compiler is given.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// The interface between this library and plnexp/strategies/fused.py (its KERNEL_VERSION): the
// handlers' symbols, arguments and attributes. Raised with any change to them, so that a library
// left by an earlier install is refused by fused.py rather than called with arguments it misreads.
// 1: the builds before this number (no plnexp_fused_abi_version); 2: a handler per code path.
#define PLNEXP_FUSED_ABI_VERSION 2

// -DPLNEXP_X86_PATHS=0 builds the baseline path alone, as on other architectures (a check of that build)
#ifndef PLNEXP_X86_PATHS
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PLNEXP_X86_PATHS 1
#else
#define PLNEXP_X86_PATHS 0
#endif
#endif

// The code paths, as bits of plnexp_fused_isas() (fused.py's ISA_BITS)
enum Isa : int { kBaseline = 1, kAvx2 = 2, kAvx512 = 4 };

namespace {

// ---------------------------------------------------------------------------------------------
// What every code path shares, compiled once for the baseline CPU.

constexpr int kNV = 2;           // vectors per register-tile row
constexpr int kBlock = 8 * 6;    // rows per block: a multiple of every code path's kMR (48 rows)
constexpr int kChunks = 16;      // fixed number of row chunks (deterministic sums)
constexpr int kCoefficients = 10;  // the optimizer's per-step scalars (fused.py's N_COEFFICIENTS)

// The optimizers' ids (plnexp/strategies/fused.py's RULES)
enum Rule : int32_t { kSgd = 0, kAdam = 1, kRadamClip = 2, kRprop = 3 };
template <int R>
constexpr int kSlots = R == kSgd ? 0 : 2;

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

// A call checked by check_call: the buffers' data and the sizes they agree on.
template <typename T>
struct Args {
  int64_t n, p, d;
  int32_t model, rule;
  const T *Y, *O, *X, *B, *M, *S, *Omega, *coef;
  const T* slot_in[4];  // M's two slots, then S's
  T *M_out, *S_out;
  T* slot_out[4];
  T *colsum_out, *xta_out, *gram_out, *s2_out, *xtc_out;
};

ffi::Error out_of_memory(int64_t n, int64_t p) {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted, "pln_fused_step: out of memory for its scratch buffers (n=" +
                                                            std::to_string(n) + ", p=" + std::to_string(p) + ")");
}

// Scratch memory of the calling thread, kept from call to call (slot 0: a chunk's buffers, slot 1:
// the call's own): a fresh allocation per chunk or call costs page faults (measured ~15 us a chunk).
// nullptr where it cannot be allocated (the caller returns out_of_memory).
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
    arena.bytes[slot] = arena.ptr[slot] != nullptr ? bytes : 0;
  }
  return static_cast<T*>(arena.ptr[slot]);
}

// Runs fn(chunk) for every chunk, on the calling thread and up to (pool size - 1) pool tasks.
// A task that starts after the work is done returns at once (it never waits for anything): no
// deadlock whether or not the pool has free threads, and no task touches the call's memory after
// the call returns. fn must not throw (it runs on the pool's threads).
struct Gate {
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  int active = 0;
  bool closed = false;
};

template <typename F>
void parallel_chunks(ffi::ThreadPool& pool, int64_t nchunks, const F& fn) {
  auto gate = std::make_shared<Gate>();  // may throw: nothing is scheduled yet
  auto drain = [&gate, nchunks, &fn]() {
    for (int64_t c; (c = gate->next.fetch_add(1)) < nchunks;) fn(c);
  };
  int64_t threads = std::min<int64_t>(pool.num_threads(), nchunks);
  for (int64_t t = 1; t < threads; ++t) {
    std::shared_ptr<Gate> g = gate;
    auto* drain_ptr = &drain;
    try {
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
    } catch (const std::bad_alloc&) {
      break;  // a task not scheduled: this thread and those scheduled do its chunks
    }
  }
  drain();
  std::unique_lock<std::mutex> lock(gate->mu);
  gate->cv.wait(lock, [&gate] { return gate->active == 0; });
  gate->closed = true;
}

int64_t nchunks_for(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>(kChunks, (n + kBlock - 1) / kBlock)); }

// --- the call's checks: every buffer's dtype and shape, in one line naming it ------------------

const char* dtype_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32:
      return "float32";
    case ffi::DataType::F64:
      return "float64";
    case ffi::DataType::F16:
      return "float16";
    case ffi::DataType::BF16:
      return "bfloat16";
    case ffi::DataType::S32:
      return "int32";
    case ffi::DataType::S64:
      return "int64";
    default:
      return "another dtype";
  }
}

std::string shape_string(const int64_t* dims, size_t rank) {
  std::string s = "(";
  for (size_t i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (rank == 1 ? ",)" : ")");
}

ffi::Error invalid(const std::string& what) { return ffi::Error::InvalidArgument("pln_fused_step: " + what); }

struct Expected {
  const char* name;  // as fused.py's ffi_call names it
  ffi::AnyBuffer buf;
  size_t rank;
  int64_t dims[2];
  const char* as;  // the shape in the call's sizes
};

// The call's sizes are Y's (n, p) and X's d; every other buffer must agree with them and have the
// handler's dtype (a kernel that trusted them would read or write past their ends).
template <typename T>
ffi::Error check_call(Args<T>& a, ffi::AnyBuffer Y, ffi::AnyBuffer O, ffi::AnyBuffer X, ffi::AnyBuffer B,
                      ffi::AnyBuffer M, ffi::AnyBuffer S, ffi::AnyBuffer Omega, ffi::AnyBuffer coef,
                      const ffi::AnyBuffer* slots_in, ffi::AnyBuffer M_out, ffi::AnyBuffer S_out,
                      const ffi::AnyBuffer* slots_out, ffi::AnyBuffer colsum, ffi::AnyBuffer xta,
                      ffi::AnyBuffer gram, ffi::AnyBuffer s2, ffi::AnyBuffer xtc, int32_t model, int32_t rule) {
  constexpr ffi::DataType dtype = std::is_same_v<T, float> ? ffi::DataType::F32 : ffi::DataType::F64;
  if (model != 0 && model != 1)
    return invalid("model=" + std::to_string(model) + ": allowed values are 0 (full), 1 (profiled)");
  if (rule < kSgd || rule > kRprop)
    return invalid("rule=" + std::to_string(rule) + ": allowed values are 0 (sgd), 1 (adam), 2 (radam_clip), 3 (rprop)");
  auto y = Y.dimensions(), x = X.dimensions();
  if (y.size() != 2) return invalid("Y has shape " + shape_string(y.begin(), y.size()) + ", expected (n, p)");
  if (x.size() != 2) return invalid("X has shape " + shape_string(x.begin(), x.size()) + ", expected (n, d)");
  const int64_t n = y[0], p = y[1], d = x[1];
  // the optimizer's slots: two per parameter, (n, p) each, or none for sgd (fused.py passes (0, 0))
  const bool slots = rule != kSgd;
  const int64_t sn = slots ? n : 0, sp = slots ? p : 0;
  const char* slot_as = slots ? "(n, p)" : "(0, 0) (sgd keeps no slots)";
  const Expected all[] = {
      {"Y", Y, 2, {n, p}, "(n, p)"},
      {"O", O, 2, {n, p}, "(n, p)"},
      {"X", X, 2, {n, d}, "(n, d)"},
      {"B", B, 2, {d, p}, "(d, p)"},
      {"M", M, 2, {n, p}, "(n, p)"},
      {"S", S, 2, {n, p}, "(n, p)"},
      {"Omega", Omega, 2, {p, p}, "(p, p)"},
      {"coef", coef, 1, {kCoefficients, 0}, "(10,)"},
      {"M's slot u", slots_in[0], 2, {sn, sp}, slot_as},
      {"M's slot v", slots_in[1], 2, {sn, sp}, slot_as},
      {"S's slot u", slots_in[2], 2, {sn, sp}, slot_as},
      {"S's slot v", slots_in[3], 2, {sn, sp}, slot_as},
      {"new M", M_out, 2, {n, p}, "(n, p)"},
      {"new S", S_out, 2, {n, p}, "(n, p)"},
      {"new M's slot u", slots_out[0], 2, {sn, sp}, slot_as},
      {"new M's slot v", slots_out[1], 2, {sn, sp}, slot_as},
      {"new S's slot u", slots_out[2], 2, {sn, sp}, slot_as},
      {"new S's slot v", slots_out[3], 2, {sn, sp}, slot_as},
      {"colsum", colsum, 1, {p, 0}, "(p,)"},
      {"X'A", xta, 2, {d, p}, "(d, p)"},
      {"C'C", gram, 2, {p, p}, "(p, p)"},
      {"sum S^2", s2, 1, {p, 0}, "(p,)"},
      {"X'C", xtc, 2, {d, p}, "(d, p)"},
  };
  for (const Expected& e : all) {
    if (e.buf.element_type() != dtype)
      return invalid(std::string(e.name) + " has dtype " + dtype_name(e.buf.element_type()) + ", expected " +
                     dtype_name(dtype) + " (this handler's)");
    auto got = e.buf.dimensions();
    bool same = got.size() == e.rank;
    for (size_t i = 0; same && i < e.rank; ++i) same = got[i] == e.dims[i];
    if (!same)
      return invalid(std::string(e.name) + " has shape " + shape_string(got.begin(), got.size()) + ", expected " +
                     e.as + " = " + shape_string(e.dims, e.rank) + " (n, p from Y; d from X)");
  }
  a.n = n;
  a.p = p;
  a.d = d;
  a.model = model;
  a.rule = rule;
  a.Y = Y.typed_data<T>();
  a.O = O.typed_data<T>();
  a.X = X.typed_data<T>();
  a.B = B.typed_data<T>();
  a.M = M.typed_data<T>();
  a.S = S.typed_data<T>();
  a.Omega = Omega.typed_data<T>();
  a.coef = coef.typed_data<T>();
  for (int i = 0; i < 4; ++i) {
    a.slot_in[i] = slots_in[i].typed_data<T>();
    a.slot_out[i] = slots_out[i].typed_data<T>();
  }
  a.M_out = M_out.typed_data<T>();
  a.S_out = S_out.typed_data<T>();
  a.colsum_out = colsum.typed_data<T>();
  a.xta_out = xta.typed_data<T>();
  a.gram_out = gram.typed_data<T>();
  a.s2_out = s2.typed_data<T>();
  a.xtc_out = xtc.typed_data<T>();
  return ffi::Error::Success();
}

// The FFI handler of one code path: the call checked, then `Run` (that path's run<T>). An
// allocation that fails on this thread is an error returned to XLA, never an exception through it.
template <typename T, ffi::Error (*Run)(ffi::ThreadPool&, const Args<T>&)>
ffi::Error Handler(ffi::ThreadPool pool, ffi::AnyBuffer Y, ffi::AnyBuffer O, ffi::AnyBuffer X, ffi::AnyBuffer B,
                   ffi::AnyBuffer M, ffi::AnyBuffer S, ffi::AnyBuffer Omega, ffi::AnyBuffer coef, ffi::AnyBuffer um,
                   ffi::AnyBuffer vm, ffi::AnyBuffer us, ffi::AnyBuffer vs, ffi::Result<ffi::AnyBuffer> M_out,
                   ffi::Result<ffi::AnyBuffer> S_out, ffi::Result<ffi::AnyBuffer> um_out,
                   ffi::Result<ffi::AnyBuffer> vm_out, ffi::Result<ffi::AnyBuffer> us_out,
                   ffi::Result<ffi::AnyBuffer> vs_out, ffi::Result<ffi::AnyBuffer> colsum_out,
                   ffi::Result<ffi::AnyBuffer> xta_out, ffi::Result<ffi::AnyBuffer> gram_out,
                   ffi::Result<ffi::AnyBuffer> s2_out, ffi::Result<ffi::AnyBuffer> xtc_out, int32_t model,
                   int32_t rule) {
  try {
    const ffi::AnyBuffer slots_in[4] = {um, vm, us, vs};
    const ffi::AnyBuffer slots_out[4] = {*um_out, *vm_out, *us_out, *vs_out};
    Args<T> a;
    ffi::Error bad = check_call<T>(a, Y, O, X, B, M, S, Omega, coef, slots_in, *M_out, *S_out, slots_out,
                                   *colsum_out, *xta_out, *gram_out, *s2_out, *xtc_out, model, rule);
    if (bad.failure()) return bad;
    return Run(pool, a);
  } catch (const std::bad_alloc&) {
    const auto y = Y.dimensions();
    return out_of_memory(y.size() > 0 ? y[0] : 0, y.size() > 1 ? y[1] : 0);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The code paths. The target pragmas open after every header and close before the handlers'
// definitions: only the kernel's own functions (and the lambdas in them) are compiled for the
// path's instructions. Functions of the headers that they call are inlined into them or called
// as compiled for the baseline CPU.

#if PLNEXP_X86_PATHS
#pragma GCC push_options
// x86-64-v4's AVX-512 subsets; plnexp_fused_isas() checks these same features
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx512cd,avx2,fma,bmi,bmi2")
namespace {
namespace avx512 {
#define PLNEXP_VEC_BYTES 64
#define PLNEXP_MR 8  // 8 x 2 = 16 accumulators of 32 registers
#include "pln_fused_kernel.inc"
#undef PLNEXP_VEC_BYTES
#undef PLNEXP_MR
}  // namespace avx512
}  // namespace
#pragma GCC pop_options

#pragma GCC push_options
// x86-64-v3's vector subset; plnexp_fused_isas() checks these same features
#pragma GCC target("avx2,fma,bmi,bmi2")
namespace {
namespace avx2 {
#define PLNEXP_VEC_BYTES 32
#define PLNEXP_MR 6  // 6 x 2 = 12 accumulators of 16 registers
#include "pln_fused_kernel.inc"
#undef PLNEXP_VEC_BYTES
#undef PLNEXP_MR
}  // namespace avx2
}  // namespace
#pragma GCC pop_options
#endif

namespace {
namespace baseline {  // the compiler's flags only: SSE2 on x86-64 (16 vector registers)
#define PLNEXP_VEC_BYTES 16
#define PLNEXP_MR 6  // 6 x 2 = 12 accumulators of 16 registers
#include "pln_fused_kernel.inc"
#undef PLNEXP_VEC_BYTES
#undef PLNEXP_MR
}  // namespace baseline
}  // namespace

// ---------------------------------------------------------------------------------------------
// Exports: the handlers, the interface version and the code paths this CPU runs.

#define PLNEXP_BIND                                   \
  ffi::Ffi::Bind()                                    \
      .Ctx<ffi::ThreadPool>()                         \
      .Arg<ffi::AnyBuffer>() /* Y */                  \
      .Arg<ffi::AnyBuffer>() /* O */                  \
      .Arg<ffi::AnyBuffer>() /* X */                  \
      .Arg<ffi::AnyBuffer>() /* B */                  \
      .Arg<ffi::AnyBuffer>() /* M */                  \
      .Arg<ffi::AnyBuffer>() /* S */                  \
      .Arg<ffi::AnyBuffer>() /* Omega */              \
      .Arg<ffi::AnyBuffer>() /* coef */               \
      .Arg<ffi::AnyBuffer>() /* M slot u */           \
      .Arg<ffi::AnyBuffer>() /* M slot v */           \
      .Arg<ffi::AnyBuffer>() /* S slot u */           \
      .Arg<ffi::AnyBuffer>() /* S slot v */           \
      .Ret<ffi::AnyBuffer>() /* M new */              \
      .Ret<ffi::AnyBuffer>() /* S new */              \
      .Ret<ffi::AnyBuffer>() /* M slot u new */       \
      .Ret<ffi::AnyBuffer>() /* M slot v new */       \
      .Ret<ffi::AnyBuffer>() /* S slot u new */       \
      .Ret<ffi::AnyBuffer>() /* S slot v new */       \
      .Ret<ffi::AnyBuffer>() /* colsum (p) */         \
      .Ret<ffi::AnyBuffer>() /* X'A (d, p) */         \
      .Ret<ffi::AnyBuffer>() /* C'C (p, p) */         \
      .Ret<ffi::AnyBuffer>() /* sum S^2 (p) */        \
      .Ret<ffi::AnyBuffer>() /* X'C (d, p) */         \
      .Attr<int32_t>("model")                         \
      .Attr<int32_t>("rule")

#define PLNEXP_HANDLERS(ISA)                                                                    \
  constexpr auto kStepF32_##ISA = &Handler<float, ISA::run<float>>;                            \
  constexpr auto kStepF64_##ISA = &Handler<double, ISA::run<double>>;                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(PlnFusedStepF32_##ISA, kStepF32_##ISA, PLNEXP_BIND);           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(PlnFusedStepF64_##ISA, kStepF64_##ISA, PLNEXP_BIND)

#if PLNEXP_X86_PATHS
PLNEXP_HANDLERS(avx512);
PLNEXP_HANDLERS(avx2);
#endif
PLNEXP_HANDLERS(baseline);

extern "C" int plnexp_fused_abi_version(void) { return PLNEXP_FUSED_ABI_VERSION; }

// The code paths this CPU runs (bits of enum Isa), among those built. __builtin_cpu_supports also
// asks the OS (xgetbv) whether it saves the vector registers: AVX-512 on a kernel that does not is
// reported as absent.
extern "C" int plnexp_fused_isas(void) {
  int isas = kBaseline;
#if PLNEXP_X86_PATHS
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512cd");
  if (avx2) isas |= kAvx2;
  if (avx512) isas |= kAvx512;
#endif
  return isas;
}
