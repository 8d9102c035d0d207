// gradops._torch_call: the call path for PyTorch tensors, compiled.
//
// gradops._call.run turns one call into descriptors, allocates the outputs and calls gradops_run
// through ctypes. On a tiny tensor that Python work costs more than PyTorch's whole op (its
// allocation alone is most of a softmax), so calls whose inputs (and outputs given with out=) are
// all contiguous PyTorch tensors come here instead: the plan of a call seen before is found by a key
// of the tensors' own metadata, the other outputs are allocated with at::empty, and gradops_run is
// called directly. Anything else (numpy, DLPack, a non-contiguous tensor, a call the library
// rejects) goes back to the Python path, which has the same results and raises the same errors.
//
// The extension links libtorch, so it is built for one PyTorch (setup.py builds it when PyTorch's
// headers are present); libgradops is not linked: its functions come from the library object the
// op belongs to, so one extension serves any libgradops the package loads.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <gradops/gradops.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>

namespace {

using RunFn = decltype(&gradops_run);
using InferFn = decltype(&gradops_infer_output_shapes);

constexpr int kMaxArgs = GRADOPS_MAX_ARGS;
constexpr int kMaxRank = GRADOPS_MAX_RANK;
constexpr int kMaxAttrs = 16;
// op, threads, the outputs' flags, attributes (two words each), inputs and outputs given with out=
// (three words and the dims each): read_call checks every count and rank before it pushes.
constexpr int kMaxKey = 3 + 2 * kMaxAttrs + 2 * kMaxArgs * (3 + kMaxRank);

// Everything that decides a call's plan, as machine words.
struct Key {
  int n = 0;
  int64_t v[kMaxKey];
  void push(int64_t x) { v[n++] = x; }
  bool operator==(const Key& o) const { return n == o.n && std::equal(v, v + n, o.v); }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < k.n; ++i) h = (h ^ static_cast<uint64_t>(k.v[i])) * 0xBF58476D1CE4E5B9ull;
    return static_cast<size_t>(h ^ (h >> 31));
  }
};

// What gradops_run needs besides data pointers, fixed by the key. Immutable once made, so calls on
// several threads share it: each copies the descriptors to its stack and writes its pointers there,
// and holds the plan (a shared_ptr) while it runs, since the cache may be cleared meanwhile.
struct Plan {
  PyObject* op = nullptr;  // held: while the plan lives, no other op can reuse the address in its key
  PyObject* c_name = nullptr;
  PyObject* error = nullptr;  // op.library.error: the exception for a status, with the message
  std::array<PyObject*, kMaxAttrs> attr_names{};
  RunFn run = nullptr;
  int n_in = 0, n_out = 0, n_all = 0, n_attrs = 0;
  gradops_device device{GRADOPS_DEVICE_CPU, 0};
  std::array<gradops_tensor, kMaxArgs> in{}, out{};
  std::array<std::array<int64_t, kMaxRank>, kMaxArgs> in_dims{}, out_dims{};
  std::array<at::ScalarType, kMaxArgs> out_type{};
  std::array<bool, kMaxArgs> given{};  // output passed with out= (the caller's tensor is written)
  std::array<gradops_attribute, kMaxAttrs> attrs{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    Py_XDECREF(op);
    Py_XDECREF(c_name);
    Py_XDECREF(error);
    for (PyObject* a : attr_names) Py_XDECREF(a);
  }
};

// Never destroyed: its plans hold Python references, which must not be released after the
// interpreter is gone. Only touched with the GIL held.
auto* const g_plans = new std::unordered_map<Key, std::shared_ptr<const Plan>, KeyHash>();
constexpr size_t kMaxPlans = 4096;

PyObject* g_python_run = nullptr;  // gradops._call's Python path: same arguments, same results
PyObject* g_stream_of = nullptr;   // device index -> PyTorch's current cudaStream_t, as an int
const gradops_allocator* g_cuda_allocator = nullptr;  // scratch from PyTorch's caching allocator
uint64_t g_hits = 0, g_misses = 0, g_python = 0;

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return GRADOPS_DTYPE_F32;
    case at::kDouble: return GRADOPS_DTYPE_F64;
    case at::kHalf: return GRADOPS_DTYPE_F16;
    case at::kBFloat16: return GRADOPS_DTYPE_BF16;
    default: return -1;
  }
}

at::ScalarType scalar_type(int code) {
  constexpr at::ScalarType kTypes[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
  return kTypes[code];
}

PyObject* python_path(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames = nullptr) {
  ++g_python;
  return PyObject_Vectorcall(g_python_run, args, static_cast<size_t>(nargs), kwnames);
}

// A new reference, dropped at scope exit.
struct Owned {
  PyObject* p;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { Py_XDECREF(p); }
};

// References to the items of a sequence for the life of a call.
struct Held {
  std::array<PyObject*, kMaxArgs> items{};
  Held(PyObject* seq, Py_ssize_t n) {
    if (n == 0) return;
    PyObject** p = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; ++i) Py_INCREF(items[i] = p[i]);
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() {
    for (PyObject* o : items) Py_XDECREF(o);
  }
};

// The items of a tuple or list, or false.
bool items_of(PyObject* seq, PyObject*** items, Py_ssize_t* n) {
  if (!PyTuple_Check(seq) && !PyList_Check(seq)) return false;
  *items = PySequence_Fast_ITEMS(seq);
  *n = PySequence_Fast_GET_SIZE(seq);
  return true;
}

// One call's arguments as read from Python (the tensors point into the call's PyObjects).
struct Call {
  std::array<const at::Tensor*, kMaxArgs> in{}, out{};  // nullptr: None (out: allocated by us)
  std::array<double, kMaxAttrs> values{};
  std::array<bool, kMaxAttrs> given{};  // attribute given (else the library's default)
  Py_ssize_t n_in = 0, n_attrs = 0, n_want = 0;
  uint64_t wanted = 0;
};

// A contiguous tensor of gradops' dtypes on the CPU or a CUDA device into *t and the key (three
// words and the dims); false for anything else. None is one word.
bool read_tensor(PyObject* x, Key& key, const at::Tensor** t) {
  *t = nullptr;
  if (x == Py_None) {
    key.push(-1);
    return true;
  }
  if (!THPVariable_CheckExact(x)) return false;  // subclasses may mean something else
  const at::Tensor& v = THPVariable_Unpack(x);
  if (v.layout() != at::kStrided || !v.has_storage()) return false;  // sparse, meta, ...
  const int code = dtype_code(v.scalar_type());
  const int64_t rank = v.dim();
  if (code < 0 || rank > kMaxRank || !v.is_contiguous()) return false;
  const at::Device d = v.device();
  int64_t dev;
  if (d.is_cpu()) dev = GRADOPS_DEVICE_CPU;
  else if (d.is_cuda()) dev = GRADOPS_DEVICE_CUDA | static_cast<int64_t>(d.index()) << 8;
  else return false;
  *t = &v;
  key.push(code);
  key.push(dev);
  key.push(rank);
  for (int64_t s : v.sizes()) key.push(s);
  return true;
}

// Reads the call into key and c; false where the Python path must take it.
bool read_call(PyObject* op, PyObject* inputs, PyObject* attrs, PyObject* want, PyObject* out, long threads,
               Key& key, Call& c) {
  PyObject** items;
  PyObject** outs = nullptr;
  Py_ssize_t n_outs = 0;
  if (!PyTuple_Check(attrs) || !PyTuple_Check(want)) return false;
  c.n_attrs = PyTuple_GET_SIZE(attrs);
  c.n_want = PyTuple_GET_SIZE(want);
  if (c.n_attrs > kMaxAttrs || c.n_want > kMaxArgs) return false;
  if (!items_of(inputs, &items, &c.n_in) || c.n_in > kMaxArgs) return false;
  if (out != Py_None && (!items_of(out, &outs, &n_outs) || n_outs != c.n_want)) return false;
  key.push(reinterpret_cast<intptr_t>(op));
  key.push(threads);
  for (Py_ssize_t i = 0; i < c.n_want; ++i) {
    PyObject* w = PyTuple_GET_ITEM(want, i);
    if (w == Py_True) c.wanted |= 1u << i;
    else if (w != Py_False) return false;
  }
  key.push(static_cast<int64_t>(c.wanted | static_cast<uint64_t>(c.n_want) << 8 |
                                static_cast<uint64_t>(c.n_in) << 16 | static_cast<uint64_t>(n_outs) << 24));
  for (Py_ssize_t a = 0; a < c.n_attrs; ++a) {
    PyObject* v = PyTuple_GET_ITEM(attrs, a);
    c.given[a] = v != Py_None;
    if (!c.given[a]) {
      key.push(0);
      key.push(0);
      continue;
    }
    if (PyFloat_CheckExact(v)) {
      c.values[a] = PyFloat_AS_DOUBLE(v);
    } else if (PyLong_Check(v)) {
      int overflow = 0;
      long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      c.values[a] = static_cast<double>(x);
    } else {
      return false;  // numpy scalars and the like: the Python path converts them
    }
    int64_t bits;
    std::memcpy(&bits, &c.values[a], sizeof bits);
    key.push(1);
    key.push(bits);
  }
  for (Py_ssize_t i = 0; i < c.n_in; ++i)
    if (!read_tensor(items[i], key, &c.in[i])) return false;
  for (Py_ssize_t o = 0; o < n_outs; ++o) {
    // An output given but not asked for is the Python path's error to raise.
    if (!read_tensor(outs[o], key, &c.out[o]) || (c.out[o] && !(c.wanted >> o & 1))) return false;
  }
  return true;
}

// The descriptor of t, its dims kept in dims.
void describe(const at::Tensor& t, gradops_tensor& d, std::array<int64_t, kMaxRank>& dims) {
  const at::Device dev = t.device();
  d.device = gradops_device{dev.is_cuda() ? GRADOPS_DEVICE_CUDA : GRADOPS_DEVICE_CPU,
                            dev.is_cuda() ? static_cast<int32_t>(dev.index()) : 0};
  d.rank = static_cast<int32_t>(t.dim());
  d.dtype = dtype_code(t.scalar_type());
  std::copy(t.sizes().begin(), t.sizes().end(), dims.begin());
  d.shape = dims.data();
}

// The plan of a call: outputs given keep their own descriptors, the others get the library's
// inferred shapes. nullptr (no Python error set) when the library rejects the call or cannot infer
// shapes, so that the Python path reports it.
std::unique_ptr<Plan> make_plan(PyObject* op, const Call& c) {
  auto plan = std::make_unique<Plan>();
  Py_INCREF(op);
  plan->op = op;
  PyObject* lib = PyObject_GetAttrString(op, "library");
  PyObject* fns = lib ? PyObject_GetAttrString(lib, "fast_functions") : nullptr;
  plan->error = lib ? PyObject_GetAttrString(lib, "error") : nullptr;
  plan->c_name = PyObject_GetAttrString(op, "c_name");
  PyObject* attr_info = PyObject_GetAttrString(op, "attributes");
  PyObject* outputs = PyObject_GetAttrString(op, "outputs");
  Py_XDECREF(lib);
  std::unique_ptr<Plan> none;
  auto done = [&](std::unique_ptr<Plan> p) {
    Py_XDECREF(fns);
    Py_XDECREF(attr_info);
    Py_XDECREF(outputs);
    PyErr_Clear();
    return p;
  };
  if (!fns || !plan->error || !plan->c_name || !attr_info || !outputs || !PyBytes_Check(plan->c_name) ||
      !PyTuple_Check(fns) || PyTuple_GET_SIZE(fns) != 2 || !PyTuple_Check(attr_info) ||
      PyTuple_GET_SIZE(attr_info) != c.n_attrs || !PyTuple_Check(outputs))
    return done(std::move(none));
  plan->run = reinterpret_cast<RunFn>(PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, 0)));
  auto infer = reinterpret_cast<InferFn>(PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, 1)));
  plan->n_all = static_cast<int>(PyTuple_GET_SIZE(outputs));
  if (!plan->run || !infer || plan->n_all != c.n_want) return done(std::move(none));

  for (Py_ssize_t a = 0; a < c.n_attrs; ++a) {
    if (!c.given[a]) continue;
    PyObject* name = PyObject_GetAttrString(PyTuple_GET_ITEM(attr_info, a), "name");
    const char* utf8 = name ? PyUnicode_AsUTF8(name) : nullptr;
    if (!utf8) {
      Py_XDECREF(name);
      return done(std::move(none));
    }
    plan->attr_names[plan->n_attrs] = name;  // keeps utf8 alive
    plan->attrs[plan->n_attrs++] = gradops_attribute{utf8, c.values[a]};
  }

  bool have_device = false;
  std::array<const gradops_tensor*, kMaxArgs> in_ptrs{};
  plan->n_in = static_cast<int>(c.n_in);
  for (int i = 0; i < plan->n_in; ++i) {
    if (!c.in[i]) continue;
    describe(*c.in[i], plan->in[i], plan->in_dims[i]);
    in_ptrs[i] = &plan->in[i];
    if (!have_device) plan->device = plan->in[i].device;
    have_device = true;
  }

  std::array<int64_t, kMaxArgs * kMaxRank> dims{};
  std::array<int32_t, kMaxArgs> ranks{}, dtypes{};
  if (infer(PyBytes_AS_STRING(plan->c_name), in_ptrs.data(), static_cast<size_t>(c.n_in), plan->attrs.data(),
            static_cast<size_t>(plan->n_attrs), dims.data(), ranks.data(), dtypes.data(),
            static_cast<size_t>(plan->n_all)) != GRADOPS_OK)
    return done(std::move(none));
  for (int o = 0; o < plan->n_all; ++o) {
    if (!(c.wanted >> o & 1)) continue;
    plan->n_out = o + 1;
    gradops_tensor& d = plan->out[o];
    plan->given[o] = c.out[o] != nullptr;
    if (plan->given[o]) {
      describe(*c.out[o], d, plan->out_dims[o]);
      continue;
    }
    d.device = plan->device;
    d.rank = ranks[o];
    d.dtype = dtypes[o];
    std::copy_n(dims.begin() + o * kMaxRank, kMaxRank, plan->out_dims[o].begin());
    d.shape = plan->out_dims[o].data();
    plan->out_type[o] = scalar_type(dtypes[o]);
  }
  return done(std::move(plan));
}

// run(op, inputs, attribute_values, want, out=None, num_threads=0): gradops._call.run's contract.
PyObject* run(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  if (!g_python_run) {
    PyErr_SetString(PyExc_RuntimeError, "gradops._torch_call: init() has not been called");
    return nullptr;
  }
  if (kwnames && PyTuple_GET_SIZE(kwnames) > 0) return python_path(args, nargs, kwnames);  // out= by name
  if (nargs < 4 || nargs > 6) return python_path(args, nargs);
  PyObject* out_arg = nargs > 4 ? args[4] : Py_None;
  long threads = 0;
  if (nargs > 5) {
    threads = PyLong_Check(args[5]) ? PyLong_AsLong(args[5]) : -1;
    if (threads < 0 || threads > INT32_MAX) {
      PyErr_Clear();
      return python_path(args, nargs);
    }
  }
  Key key;
  Call c;
  if (!read_call(args[0], args[1], args[2], args[3], out_arg, threads, key, c)) return python_path(args, nargs);
  // Held to the end: c points into them, and a list of them could lose its items to another thread
  // whenever the GIL is let go (Python callbacks, the kernel).
  const Held held_in(args[1], c.n_in), held_out(out_arg, out_arg == Py_None ? 0 : c.n_want);

  std::shared_ptr<const Plan> held_plan;
  if (auto it = g_plans->find(key); it != g_plans->end()) {
    held_plan = it->second;
    ++g_hits;
  } else {
    held_plan = make_plan(args[0], c);
    if (!held_plan) return python_path(args, nargs);
    if (g_plans->size() >= kMaxPlans) g_plans->clear();
    g_plans->emplace(key, held_plan);
    ++g_misses;
  }
  const Plan& plan = *held_plan;

  std::array<gradops_tensor, kMaxArgs> in = plan.in, out = plan.out;
  std::array<const gradops_tensor*, kMaxArgs> in_ptrs{}, out_ptrs{};
  for (int i = 0; i < plan.n_in; ++i) {
    if (!c.in[i]) continue;
    in[i].data = c.in[i]->data_ptr();
    in_ptrs[i] = &in[i];
  }
  const Owned owned{PyList_New(plan.n_all)};  // released on every early return, exceptions included
  PyObject* result = owned.p;
  if (!result) return nullptr;
  for (int o = 0; o < plan.n_all; ++o) {
    if (o >= plan.n_out || !out[o].shape) {
      Py_INCREF(Py_None);
      PyList_SET_ITEM(result, o, Py_None);
      continue;
    }
    out_ptrs[o] = &out[o];
    if (plan.given[o]) {  // the caller's tensor, returned as given
      out[o].data = c.out[o]->data_ptr();
      PyObject* given = held_out.items[o];
      Py_INCREF(given);
      PyList_SET_ITEM(result, o, given);
      continue;
    }
    const at::Device device = plan.device.type == GRADOPS_DEVICE_CUDA
                                  ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(plan.device.index))
                                  : at::Device(at::kCPU);
    at::Tensor t = at::empty(c10::IntArrayRef(out[o].shape, static_cast<size_t>(out[o].rank)),
                             at::TensorOptions().dtype(plan.out_type[o]).device(device));
    out[o].data = t.data_ptr();
    PyObject* wrapped = THPVariable_Wrap(std::move(t));
    if (!wrapped) return nullptr;
    PyList_SET_ITEM(result, o, wrapped);
  }

  gradops_context ctx{static_cast<int32_t>(threads), nullptr, nullptr};
  if (plan.device.type == GRADOPS_DEVICE_CUDA) {
    PyObject* index = PyLong_FromLong(plan.device.index);
    PyObject* stream = index ? PyObject_CallOneArg(g_stream_of, index) : nullptr;
    Py_XDECREF(index);
    ctx.cuda_stream = stream ? PyLong_AsVoidPtr(stream) : nullptr;
    Py_XDECREF(stream);
    if (PyErr_Occurred()) return nullptr;
    ctx.allocator = g_cuda_allocator;
  }

  const char* name = PyBytes_AS_STRING(plan.c_name);
  gradops_status status;
  // Released for the kernel, as ctypes does: other Python threads run meanwhile (the CUDA scratch
  // allocator, a Python callback, takes the GIL back for itself).
  Py_BEGIN_ALLOW_THREADS
  status = plan.run(name, in_ptrs.data(), static_cast<size_t>(plan.n_in), out_ptrs.data(),
                    static_cast<size_t>(plan.n_out), plan.attrs.data(), static_cast<size_t>(plan.n_attrs), &ctx);
  Py_END_ALLOW_THREADS
  if (status != GRADOPS_OK) {
    PyObject* exc = PyObject_CallFunction(plan.error, "i", static_cast<int>(status));
    if (exc) {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
      Py_DECREF(exc);
    }
    return nullptr;
  }
  Py_INCREF(result);  // the caller's; owned drops its own
  return result;
  END_HANDLE_TH_ERRORS
}

// init(python_run, stream_of, cuda_allocator_address)
PyObject* init(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "gradops._torch_call.init: expected 3 arguments");
    return nullptr;
  }
  if (!THPVariableClass) {
    PyErr_SetString(PyExc_ImportError, "gradops._torch_call: import torch first");
    return nullptr;
  }
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  Py_XSETREF(g_python_run, args[0]);
  Py_XSETREF(g_stream_of, args[1]);
  g_cuda_allocator = static_cast<const gradops_allocator*>(PyLong_AsVoidPtr(args[2]));
  if (PyErr_Occurred()) return nullptr;
  Py_RETURN_NONE;
}

// stats() -> (hits, misses, calls sent to the Python path): for tests and for measuring.
PyObject* stats(PyObject* /*self*/, PyObject* /*unused*/) {
  return Py_BuildValue("(KKK)", static_cast<unsigned long long>(g_hits), static_cast<unsigned long long>(g_misses),
                       static_cast<unsigned long long>(g_python));
}

PyMethodDef kMethods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL | METH_KEYWORDS,
     "run(op, inputs, attribute_values, want, out=None, num_threads=0): gradops._call.run, compiled"},
    {"init", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(init)), METH_FASTCALL,
     "init(python_run, stream_of, cuda_allocator_address)"},
    {"stats", stats, METH_NOARGS, "(plan hits, plan misses, calls sent to the Python path)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_torch_call", "gradops' call path for PyTorch tensors, compiled",
                       -1, kMethods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

// The PyTorch this extension was compiled against (setup.py defines it): a build for another
// release may load yet disagree with it on the ABI, so the loader compares it with torch.__version__.
#ifndef GRADOPS_TORCH_VERSION
#define GRADOPS_TORCH_VERSION ""
#endif

PyMODINIT_FUNC PyInit__torch_call() {
  PyObject* m = PyModule_Create(&kModule);
  if (m && PyModule_AddStringConstant(m, "torch_version", GRADOPS_TORCH_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
