// gradops_microbench: the op families' cases, plus an OpenMP memcpy timed the way `gradops bench`
// times its reference, so that a case's bytes_per_second can be read as a share of the copy.
#include "microbench.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

namespace gradops::bench {
namespace {

int g_threads = 2;  // Context::num_threads of every case, and the copy's threads (--threads=N)

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Storage = std::unique_ptr<std::byte, FreeDeleter>;

Storage allocate(std::size_t bytes) {
  constexpr std::size_t kAlign = 64;
  return Storage(static_cast<std::byte*>(std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign)));
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fill(std::byte* p, const Spec& s, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(splitmix64(seed) >> 40) * 0x1p-24f;
    const float v = s.lo + (s.hi - s.lo) * u;
    switch (s.dtype) {
      case DType::f32: reinterpret_cast<float*>(p)[i] = v; break;
      case DType::f64: reinterpret_cast<double*>(p)[i] = v; break;
      case DType::f16: reinterpret_cast<uint16_t*>(p)[i] = half::from_float(v); break;
      case DType::bf16: reinterpret_cast<uint16_t*>(p)[i] = bfloat16::from_float(v); break;
    }
  }
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) {
    if (!s.empty()) s += 'x';
    s += std::to_string(d);
  }
  return s;
}

// A case's tensors and views. Google Benchmark calls a case's function several times while it
// settles the iteration count: the last case's tensors are kept, so that the inputs are not refilled
// (nor the pages faulted in again) each time.
struct Prepared {
  const Case* c = nullptr;
  std::vector<Storage> storage;
  std::vector<TensorView> in, out;
  int64_t bytes = 0;
  std::string impl;
};

Prepared* prepare(const Case& c) {
  static std::unique_ptr<Prepared> last;
  if (last && last->c == &c) return last.get();
  last.reset();  // the previous case's memory goes first
  auto p = std::make_unique<Prepared>();
  p->c = &c;
  uint64_t seed = 1;
  for (const std::vector<Spec>* list : {&c.inputs, &c.outputs}) {
    const bool is_input = list == &c.inputs;
    for (const Spec& s : *list) {
      TensorView v(nullptr, s.dtype, s.shape);
      p->storage.push_back(allocate(static_cast<std::size_t>(v.nbytes())));
      if (!p->storage.back()) return nullptr;
      v.data = p->storage.back().get();
      // Outputs are written once here so that their pages are mapped before the timing.
      if (is_input) fill(p->storage.back().get(), s, v.numel(), seed++);
      else std::memset(v.data, 0, static_cast<std::size_t>(v.nbytes()));
      (is_input ? p->in : p->out).push_back(v);
      p->bytes += v.nbytes();
    }
  }
  std::vector<const TensorView*> in_ptr, out_ptr;
  for (const TensorView& v : p->in) in_ptr.push_back(&v);
  for (const TensorView& v : p->out) out_ptr.push_back(&v);
  Context ctx;
  ctx.num_threads = g_threads;
  if (Status s = implementation_name(c.op, in_ptr, out_ptr, c.attrs, ctx, &p->impl); !s) p->impl.clear();
  last = std::move(p);
  return last.get();
}

void run_case(benchmark::State& st, const Case& c) {
  const Prepared* p = prepare(c);
  if (!p) return st.SkipWithError("out of memory");
  Context ctx;
  ctx.num_threads = g_threads;
  st.SetLabel(p->impl);
  if (Status s = c.call(p->in, p->out, ctx); !s) return st.SkipWithError(s.to_string().c_str());  // and a warm-up
  for (auto _ : st) {
    Status s = c.call(p->in, p->out, ctx);
    benchmark::DoNotOptimize(s);
  }
  st.SetBytesProcessed(st.iterations() * p->bytes);
}

// memcpy of disjoint chunks by the same threads, over buffers far beyond the last-level cache (at
// least 1 GiB and 4x the cache, at most an eighth of the memory), as `gradops bench` measures it.
// Bytes processed count the read and the write.
void run_copy(benchmark::State& st, int64_t bytes) {
  Storage src = allocate(static_cast<std::size_t>(bytes)), dst = allocate(static_cast<std::size_t>(bytes));
  if (!src || !dst) return st.SkipWithError("out of memory");
  auto bound = [&](int64_t t, int64_t nt) { return bytes / 4096 * t / nt * 4096; };
  auto each_chunk = [&](auto&& f) {
#pragma omp parallel num_threads(g_threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t begin = bound(t, nt), end = t + 1 == nt ? bytes : bound(t + 1, nt);
      f(begin, end - begin);
    }
  };
  each_chunk([&](int64_t at, int64_t n) {  // first touch by the thread that copies the pages
    std::memset(src.get() + at, 1, n);
    std::memset(dst.get() + at, 0, n);
  });
  for (auto _ : st) {
    each_chunk([&](int64_t at, int64_t n) { std::memcpy(dst.get() + at, src.get() + at, n); });
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * 2 * bytes);
}

int64_t copy_bytes() {
  const int64_t llc = std::max<long>({sysconf(_SC_LEVEL3_CACHE_SIZE), sysconf(_SC_LEVEL2_CACHE_SIZE), 0L});
  const int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  return std::min<int64_t>(std::max<int64_t>(int64_t{1} << 30, 4 * llc),
                           std::max<int64_t>(memory / 8, int64_t{64} << 20));
}

}  // namespace

void add(Case c) {
  std::string name = std::string(c.op) + "/" + dtype_name(c.dtype) + "/" + shape_string(c.shape);
  if (!c.variant.empty()) name += "/" + c.variant;
  // Real time: the work runs on OpenMP threads, not on the thread that the CPU clock would follow.
  benchmark::RegisterBenchmark(name.c_str(), [c = std::move(c)](benchmark::State& st) { run_case(st, c); })
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace gradops::bench

int main(int argc, char** argv) {
  using namespace gradops::bench;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--threads" || a.starts_with("--threads=")) {
      const char* n = a == "--threads" ? (i + 1 < argc ? argv[++i] : "") : argv[i] + 10;
      g_threads = std::atoi(n);
      if (g_threads < 1) {
        std::fprintf(stderr, "gradops_microbench: --threads takes a count from 1, got '%s'\n", n);
        return 1;
      }
    } else {
      if (a == "--help")
        std::printf("gradops_microbench [--threads=N]: N threads per call (default 2); Google Benchmark's options:\n");
      args.push_back(argv[i]);
    }
  }
  register_activation();
  register_softmax();
  register_layer_norm();
  register_batch_norm();
  const int64_t bytes = copy_bytes();
  benchmark::RegisterBenchmark(("memcpy/" + std::to_string(bytes)).c_str(),
                               [bytes](benchmark::State& st) { run_copy(st, bytes); })
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);

  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::AddCustomContext("gradops_threads", std::to_string(g_threads));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
