// oneDNN's matmul primitive for the linear kernels, run through its threadpool interface with OpenMP threads.
//
// The library is the libdnnl.so.3 that MindSpore's CPU wheel ships (the one its own MatMul uses), bound at run
// time; every type, function signature and constant comes from the oneDNN headers this file is compiled
// against (onednn-devel, pinned in pyproject.toml). Those headers describe the runtime ABI only for a range of
// versions, checked before anything is called:
//   - the C API is backward compatible within a major version: a runtime at least as new as the headers;
//   - dnnl::threadpool_interop::threadpool_iface is a C++ vtable the library calls into. It gained `wait()`
//     before its destructor in v3.11 (oneDNN commit 6468abc1), so a 3.11+ runtime would call the wrong slot of a
//     pool built from older headers: a runtime older than kIfaceChanged;
//   - the runtime must be a THREADPOOL build (a TBB, OpenMP or SYCL build has no threadpool streams).
// Outside that range nothing is bound, and the linear kernels run their own (skinny) code for every size.
#include "onednn.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "pool.h"
#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl_threadpool.h"
#include "oneapi/dnnl/dnnl_threadpool_iface.hpp"

namespace msw::onednn {
namespace {

constexpr int kHeaderVersion = DNNL_VERSION_MAJOR * 100 + DNNL_VERSION_MINOR;
constexpr int kIfaceChanged = 311;  // v3.11: threadpool_iface::wait()
static_assert(kHeaderVersion < kIfaceChanged, "these sources implement the threadpool_iface of oneDNN < 3.11");

// oneDNN runs on the kernels' own pool (pool.h).
struct Threads final : dnnl::threadpool_interop::threadpool_iface {
  int get_num_threads() const override { return threads(); }
  bool get_in_parallel() const override { return in_parallel(); }
  void parallel_for(int n, const std::function<void(int, int)> &fn) override {
    parallel_each(n, [&](int64_t i) { fn(int(i), n); });
  }
  uint64_t get_flags() const override { return 0; }  // synchronous: parallel_for returns when done
};

// The slice of the C API this file calls, typed by the headers' own declarations.
struct Api {
  decltype(&dnnl_version) version;
  decltype(&dnnl_engine_create) engine_create;
  decltype(&dnnl_threadpool_interop_stream_create) stream_create;
  decltype(&dnnl_memory_desc_create_with_strides) md_create;
  decltype(&dnnl_memory_desc_destroy) md_destroy;
  decltype(&dnnl_memory_desc_clone) md_clone;
  decltype(&dnnl_memory_desc_get_size) md_size;
  decltype(&dnnl_primitive_attr_create) attr_create;
  decltype(&dnnl_primitive_attr_destroy) attr_destroy;
  decltype(&dnnl_primitive_attr_set_scratchpad_mode) attr_scratchpad_mode;
  decltype(&dnnl_primitive_attr_set_fpmath_mode_v2) attr_fpmath_mode;
  decltype(&dnnl_primitive_attr_set_scales_mask) attr_scales_mask;
  decltype(&dnnl_matmul_primitive_desc_create) matmul_pd_create;
  decltype(&dnnl_primitive_desc_query_md) pd_query_md;
  decltype(&dnnl_primitive_desc_query) pd_query;
  decltype(&dnnl_primitive_desc_destroy) pd_destroy;
  decltype(&dnnl_primitive_create) primitive_create;
  decltype(&dnnl_primitive_destroy) primitive_destroy;
  decltype(&dnnl_memory_create) memory_create;
  decltype(&dnnl_memory_destroy) memory_destroy;
  decltype(&dnnl_primitive_execute) execute;
  decltype(&dnnl_stream_wait) stream_wait;
  dnnl_engine_t engine = nullptr;
  Threads pool;
};

std::mutex g_mutex;
Api g_api;
bool g_tried = false;
std::string g_status;

template <typename F>
bool sym(void *h, F &f, const char *name) {
  return (f = reinterpret_cast<F>(dlsym(h, name))) != nullptr;
}

// The file a dlopen handle stands for (its folder from dlinfo, as the name it was asked for may be bare).
std::string library_path(void *h, const char *asked) {
  char folder[4096] = {};
  const std::string name(asked), base = name.substr(name.rfind('/') + 1);
  return dlinfo(h, RTLD_DI_ORIGIN, folder) == 0 ? std::string(folder) + "/" + base : name;
}

// The status line; g_api.engine is set only when the library is usable. The library: $MS_SWIGLU_ONEDNN when set,
// else `path` (MindSpore's copy, from the Python side), else the libdnnl.so.3 already loaded in the process.
std::string try_bind(const char *path) {
  const char *env = std::getenv("MS_SWIGLU_ONEDNN");
  if (env && *env) path = env;
  const bool named = path && *path;
  // A copy already loaded (MindSpore's) is used as it is; another one is loaded with its own symbols first, so
  // that its calls into itself never reach the copy MindSpore loaded.
  void *h = named ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : dlopen("libdnnl.so.3", RTLD_NOW | RTLD_NOLOAD);
  if (!h && named) h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h) return named ? std::string("unavailable: cannot load ") + path + ": " + dlerror()
                       : "unavailable: no libdnnl.so.3 is loaded in this process";
  const std::string where = library_path(h, named ? path : "libdnnl.so.3");
  Api &a = g_api;
  if (!sym(h, a.version, "dnnl_version")) return "unavailable: " + where + " has no dnnl_version()";
  const dnnl_version_t *v = a.version();
  char version[64];
  std::snprintf(version, sizeof version, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
  const std::string found = version + std::string(" at ") + where;
  const int runtime = v->major * 100 + v->minor;
  if (v->major != DNNL_VERSION_MAJOR || runtime < kHeaderVersion || runtime >= kIfaceChanged) {
    char why[128];
    std::snprintf(why, sizeof why, ", expected %d.%d <= version < %d.%d (the ABI of the headers this package was "
                  "built with)", DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, kIfaceChanged / 100, kIfaceChanged % 100);
    return "unavailable: " + found + why;
  }
  if (v->cpu_runtime != DNNL_RUNTIME_THREADPOOL)
    return "unavailable: " + found + ", expected a THREADPOOL build (cpu runtime " +
           std::to_string(DNNL_RUNTIME_THREADPOOL) + "), got cpu runtime " + std::to_string(v->cpu_runtime);
  const bool ok = sym(h, a.engine_create, "dnnl_engine_create") &&
                  sym(h, a.stream_create, "dnnl_threadpool_interop_stream_create") &&
                  sym(h, a.md_create, "dnnl_memory_desc_create_with_strides") &&
                  sym(h, a.md_destroy, "dnnl_memory_desc_destroy") && sym(h, a.md_clone, "dnnl_memory_desc_clone") &&
                  sym(h, a.md_size, "dnnl_memory_desc_get_size") &&
                  sym(h, a.attr_create, "dnnl_primitive_attr_create") &&
                  sym(h, a.attr_destroy, "dnnl_primitive_attr_destroy") &&
                  sym(h, a.attr_scratchpad_mode, "dnnl_primitive_attr_set_scratchpad_mode") &&
                  sym(h, a.attr_fpmath_mode, "dnnl_primitive_attr_set_fpmath_mode_v2") &&
                  sym(h, a.attr_scales_mask, "dnnl_primitive_attr_set_scales_mask") &&
                  sym(h, a.matmul_pd_create, "dnnl_matmul_primitive_desc_create") &&
                  sym(h, a.pd_query_md, "dnnl_primitive_desc_query_md") &&
                  sym(h, a.pd_query, "dnnl_primitive_desc_query") &&
                  sym(h, a.pd_destroy, "dnnl_primitive_desc_destroy") &&
                  sym(h, a.primitive_create, "dnnl_primitive_create") &&
                  sym(h, a.primitive_destroy, "dnnl_primitive_destroy") &&
                  sym(h, a.memory_create, "dnnl_memory_create") && sym(h, a.memory_destroy, "dnnl_memory_destroy") &&
                  sym(h, a.execute, "dnnl_primitive_execute") && sym(h, a.stream_wait, "dnnl_stream_wait");
  if (!ok) return "unavailable: " + found + " lacks a function of the matmul API";
  if (a.engine_create(&a.engine, dnnl_cpu, 0) != dnnl_success) {
    a.engine = nullptr;
    return "unavailable: " + found + " cannot create a CPU engine";
  }
  return found;
}

}  // namespace

const char *bind(const char *path) {  // the first call decides
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_tried) {
    g_tried = true;
    g_status = try_bind(path);
  }
  return g_status.c_str();
}

namespace {
const Api *api() {
  bind(nullptr);
  return g_api.engine ? &g_api : nullptr;
}

constexpr dnnl_data_type_t kType[kDtypes] = {dnnl_f32, dnnl_f16, dnnl_bf16};
// The math of a matmul with int8 weights, by the dtype of a: the int8 rows widened to it (exactly), float32 sums.
constexpr dnnl_fpmath_mode_t kQ8Math[kDtypes] = {dnnl_fpmath_mode_strict, dnnl_fpmath_mode_f16, dnnl_fpmath_mode_bf16};
constexpr int kQ8 = -1;  // b_d of a matmul with int8 weights and per-row float32 scales
constexpr int kS8 = -2;  // a_d, b_d of an int8 x int8 matmul (c_d: kS32, int32 sums)
constexpr int kS32 = -3;
dnnl_data_type_t type_of(int d) { return d == kS8 || d == kQ8 ? dnnl_s8 : d == kS32 ? dnnl_s32 : kType[d]; }

// One matmul primitive per shape, kept per (dtypes, na, nb, k, ldc); the cache is dropped when it holds
// kMaxMatmuls (dynamic token counts); calls still running keep theirs alive. A primitive runs in whichever thread
// calls (MindSpore's actor threads, the pool's threads for a MoE block's experts), concurrently with itself and
// with others, so its scratchpad is the caller's (dnnl_scratchpad_mode_user): with oneDNN's own (library mode) a
// primitive may run only in the thread that created it (oneDNN's documentation of dnnl_scratchpad_mode_t), and a
// MoE block's bfloat16 experts run from the pool's threads came out wrong in 137 of 200 calls (errors 5-11).
struct Matmul {
  const Api *api;
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_desc_t md[5] = {};  // src, weights, dst, scratchpad, the weights' scales (int8 weights)
  size_t scratch = 0;             // the scratchpad's bytes
  std::string impl;               // oneDNN's name for its implementation ("brg_matmul:avx512_core_vnni")
  ~Matmul() {
    if (primitive) api->primitive_destroy(primitive);
    for (dnnl_memory_desc_t m : md)
      if (m) api->md_destroy(m);
  }
};
constexpr size_t kMaxMatmuls = 256;
std::map<std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t>, std::shared_ptr<Matmul>> g_matmuls;

// Whether pd is one of oneDNN's reference implementations ("ref:any"): plain loops, for correctness only, which
// oneDNN 3.10 picks on AVX2 for some dtype mixes (float32 x, int8 weights, bfloat16 y) at a thousand times the time.
bool reference(const Api &a, const_dnnl_primitive_desc_t pd) {
  const char *impl = nullptr;
  return a.pd_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl ||
         std::strncmp(impl, "ref", 3) == 0;
}

// The primitive for a_d, b_d, c_d (dtypes; b_d kQ8: int8 weights with per-row scales); nullptr where oneDNN
// has none, or only a reference implementation (the caller's own path is faster then), which is kept too.
std::shared_ptr<Matmul> matmul(const Api &a, int a_d, int b_d, int c_d, int64_t na, int64_t nb, int64_t k,
                               int64_t ldc) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto key = std::make_tuple(a_d, b_d, c_d, na, nb, k, ldc);
  auto it = g_matmuls.find(key);
  if (it != g_matmuls.end()) return it->second;
  const dnnl_dims_t dims[3] = {{na, k}, {k, nb}, {na, nb}}, strides[3] = {{k, 1}, {1, k}, {ldc, 1}};
  const dnnl_data_type_t types[3] = {type_of(a_d), type_of(b_d), type_of(c_d)};
  auto mm = std::make_shared<Matmul>();
  mm->api = &a;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  bool ok = a.attr_create(&attr) == dnnl_success &&
            a.attr_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (b_d == kQ8) {  // one scale per column of the weights [k, nb] (mask: dimension 1)
    const dnnl_dims_t scale_dims = {nb}, scale_strides = {1};
    ok = ok && a.attr_fpmath_mode(attr, kQ8Math[a_d], 1) == dnnl_success &&
         a.attr_scales_mask(attr, DNNL_ARG_WEIGHTS, 1 << 1) == dnnl_success &&
         a.md_create(&mm->md[4], 1, scale_dims, dnnl_f32, scale_strides) == dnnl_success;
  }
  for (int i = 0; i < 3; ++i) ok = ok && a.md_create(&mm->md[i], 2, dims[i], types[i], strides[i]) == dnnl_success;
  ok = ok && a.matmul_pd_create(&pd, a.engine, mm->md[0], mm->md[1], nullptr, mm->md[2], attr) == dnnl_success &&
       !reference(a, pd);
  const char *impl = nullptr;
  if (ok && a.pd_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) mm->impl = impl;
  const_dnnl_memory_desc_t scratch = ok ? a.pd_query_md(pd, dnnl_query_scratchpad_md, 0) : nullptr;
  if (scratch && a.md_size(scratch) > 0) ok = ok && a.md_clone(&mm->md[3], scratch) == dnnl_success;
  mm->scratch = mm->md[3] ? a.md_size(mm->md[3]) : 0;
  ok = ok && a.primitive_create(&mm->primitive, pd) == dnnl_success;
  if (pd) a.pd_destroy(pd);
  if (attr) a.attr_destroy(attr);
  if (g_matmuls.size() >= kMaxMatmuls) g_matmuls.clear();
  return g_matmuls[key] = ok ? mm : nullptr;  // (nullptr: e.g. no float16 matmul on this CPU)
}

}  // namespace

bool available() { return api() != nullptr; }

namespace {
bool execute(int a_d, const void *a, int64_t na, int b_d, const void *b, const float *b_scale, int64_t nb, int64_t k,
             int c_d, void *c, int64_t ldc) {
  const Api *ap = api();
  if (!ap) return false;
  const std::shared_ptr<Matmul> mm = matmul(*ap, a_d, b_d, c_d, na, nb, k, ldc);
  if (!mm) return false;
  thread_local dnnl_stream_t stream = nullptr;
  if (!stream && ap->stream_create(&stream, ap->engine, const_cast<Threads *>(&ap->pool)) != dnnl_success)
    return false;
  thread_local std::vector<char> scratch;  // the calling thread's scratchpad, grown once (64 bytes of slack to align)
  if (scratch.size() < mm->scratch + 64) scratch.resize(mm->scratch + 64);
  void *scratch_at = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  const int keys[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD,
                       DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS};
  const void *data[5] = {a, b, c, scratch_at, b_scale};
  dnnl_memory_t mem[5] = {};
  dnnl_exec_arg_t args[5];
  int n = 0;
  bool ok = true;
  for (int i = 0; i < 5; ++i) {
    if (!mm->md[i]) continue;  // no scratchpad, or no scales
    ok = ok && ap->memory_create(&mem[i], mm->md[i], ap->engine, const_cast<void *>(data[i])) == dnnl_success;
    args[n++] = {keys[i], mem[i]};
  }
  ok = ok && ap->execute(mm->primitive, stream, n, args) == dnnl_success && ap->stream_wait(stream) == dnnl_success;
  for (dnnl_memory_t m : mem)
    if (m) ap->memory_destroy(m);
  return ok;
}
}  // namespace

bool gemm(int a_d, const void *a, int64_t na, int b_d, const void *b, int64_t nb, int64_t k, int c_d, void *c,
          int64_t ldc) {
  return execute(a_d, a, na, b_d, b, nullptr, nb, k, c_d, c, ldc);
}

bool gemm_q8(int a_d, const void *a, int64_t na, const int8_t *b, const float *b_scale, int64_t nb, int64_t k,
             int c_d, void *c, int64_t ldc) {
  return execute(a_d, a, na, kQ8, b, b_scale, nb, k, c_d, c, ldc);
}

bool gemm_s8(const int8_t *a, int64_t na, const int8_t *b, int64_t nb, int64_t k, int32_t *c, int64_t ldc) {
  return execute(kS8, a, na, kS8, b, nullptr, nb, k, kS32, c, ldc);
}

namespace {
// known[d]: whether `probe()` built its matmuls, asked once per dtype d (-1: not yet)
template <typename Probe>
bool once(std::atomic<int> (&known)[kDtypes], int d, const Probe &probe) {
  const Api *ap = api();
  if (!ap) return false;
  if (known[d] < 0) known[d] = probe(*ap);
  return known[d] == 1;
}
}  // namespace

bool takes(int d) {
  static std::atomic<int> known[kDtypes] = {-1, -1, -1};
  return once(known, d, [d](const Api &ap) {
    return matmul(ap, d == kF16 ? kF32 : d, d, d, 2, 16, 16, 16) && matmul(ap, d, d, kF32, 16, 2, 16, 2);
  });
}

namespace {
// an int8 matmul of a small shape: whether oneDNN has one, and its implementation's name
std::shared_ptr<Matmul> s8_probe(const Api &ap) { return matmul(ap, kS8, kS8, kS32, 64, 256, 256, 256); }
}  // namespace

bool takes_s8() {
  // exact only where oneDNN has VPDPBUSD: without, its VPMADDUBSW on x + 128 may saturate
  static const bool vnni = __builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avxvnni");
  static std::atomic<int> known[kDtypes] = {-1, -1, -1};
  return vnni && once(known, 0, [](const Api &ap) { return s8_probe(ap) != nullptr; });
}

const char *s8_impl() {  // (never binds: the Python side binds MindSpore's copy first)
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_tried || !g_api.engine) return nullptr;
  }
  static const std::string impl = [] {
    const std::shared_ptr<Matmul> mm = takes_s8() ? s8_probe(g_api) : nullptr;
    return mm ? mm->impl : std::string();
  }();
  return impl.empty() ? nullptr : impl.c_str();
}

bool takes_q8(int a_d) {
  static std::atomic<int> known[kDtypes] = {-1, -1, -1};
  return once(known, a_d, [a_d](const Api &ap) { return matmul(ap, a_d, kQ8, kF32, 2, 16, 16, 16) != nullptr; });
}

}  // namespace msw::onednn
