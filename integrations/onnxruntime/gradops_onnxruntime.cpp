// The ONNX Runtime custom-op library: registers gradops' gradient operators (and BatchNormInternal)
// in the com.microsoft domain so that stock ONNX Runtime runs graphs made by ORT's gradient builder.
//
// Everything comes from the op table (gradops/schema.hpp): one OrtCustomOp per (operator, dtype
// signature), whose inputs, outputs, optional outputs, attributes and in-place pairs are the
// table's. ORT groups the OrtCustomOps of one name into one schema and picks the kernel whose
// dtypes match the node, which covers the mixed (T, U, V) and (T, T1, T2) signatures. A kernel
// reads the node's attributes once, at creation; at run time it wraps ORT's tensors in
// TensorViews, allocates the outputs, and calls gradops::run, which validates everything and
// reports failures with the message that ORT then returns.
//
// Each (operator, signature) is registered for ONNX Runtime's CPU execution provider, and again
// for its CUDA execution provider where this build of gradops has a CUDA kernel for it
// (gradops::supports) and the runtime has a CUDA provider: built in (GetAvailableProviders), or a
// plugin registered with the environment (GetEpDevices), as ORT 1.22 and newer allow. A CUDA kernel
// receives device tensors, runs on the stream ORT gives it and takes scratch from ORT's allocator
// for the tensors' device, so ORT neither copies around it nor waits for it. An operator without a
// CUDA kernel has only its CPU registration, and ORT places that node on the CPU provider.
#include <onnxruntime_c_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradops/ops.hpp"
#include "gradops/schema.hpp"

namespace {

using namespace gradops;

// OrtCustomOp::GetMayInplace and ReleaseMayInplace (ORT 1.18) are the newest members we fill in;
// CreateKernelV2/KernelComputeV2 (1.16) and KernelContext_GetAllocator (1.15) are older.
constexpr uint32_t kMinOrtApiVersion = 18;
constexpr const char* kMinOrtRelease = "1.18";

// The operators registered: ONNX Runtime's own (OpSchema::origin) that stock ORT lacks, which are
// every gradient operator and BatchNormInternal (ORT's training rewrite puts it in place of
// BatchNormalization). Never a name stock ONNX Runtime already has (Gelu, Softmax,
// LayerNormalization, ...): a custom kernel would silently replace ORT's own. Never gradops' own
// operators either: com.microsoft is ORT's domain, and a name there is ORT's to define.
bool registered(const OpSchema& op) {
  return op.origin == OpOrigin::onnxruntime && (op.gradient || op.id == OpId::BatchNormInternal);
}

ONNXTensorElementDataType ort_type(DType t) {
  switch (t) {
    case DType::f32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case DType::f64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
    case DType::f16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case DType::bf16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

bool from_ort_type(ONNXTensorElementDataType t, DType* out) {
  for (DType d : kAllDTypes)
    if (ort_type(d) == t) {
      *out = d;
      return true;
    }
  return false;
}

OrtErrorCode ort_code(StatusCode c) {
  switch (c) {
    case StatusCode::ok: return ORT_OK;
    case StatusCode::invalid_argument: return ORT_INVALID_ARGUMENT;
    case StatusCode::unimplemented: return ORT_NOT_IMPLEMENTED;
    case StatusCode::out_of_memory: return ORT_RUNTIME_EXCEPTION;
    case StatusCode::device_error: return ORT_EP_FAIL;
    case StatusCode::internal: return ORT_FAIL;
  }
  return ORT_FAIL;
}

// ---- in-place pairs -------------------------------------------------------------------------------

// GetMayInplace takes no OrtCustomOp, so each distinct set of the table's alias rules gets its own
// function: slot k reports alias_sets()[k]. The table has two sets (dX may be dY; BatchNormInternal's
// running statistics may be its input statistics); four slots leave room.
constexpr int kAliasSlots = 4;

std::vector<std::span<const AliasRule>>& alias_sets() {
  static std::vector<std::span<const AliasRule>> sets;
  return sets;
}

template <int Slot>
size_t ORT_API_CALL may_inplace(int** input_index, int** output_index) {
  *input_index = *output_index = nullptr;
  const std::span<const AliasRule> rules = alias_sets()[Slot];
  // ORT releases these through ReleaseMayInplace (older runtimes call free() directly): malloc.
  auto* in = static_cast<int*>(std::malloc(rules.size() * sizeof(int)));
  auto* out = static_cast<int*>(std::malloc(rules.size() * sizeof(int)));
  if (!in || !out) {
    std::free(in);
    std::free(out);
    return 0;  // no in-place reuse is always correct
  }
  for (std::size_t i = 0; i < rules.size(); ++i) {
    in[i] = rules[i].input;
    out[i] = rules[i].output;
  }
  *input_index = in;
  *output_index = out;
  return rules.size();
}

size_t ORT_API_CALL no_pairs(int** input_index, int** output_index) {
  *input_index = *output_index = nullptr;
  return 0;
}

void ORT_API_CALL release_pairs(int* input_index, int* output_index) {
  std::free(input_index);
  std::free(output_index);
}

constexpr std::array<size_t(ORT_API_CALL*)(int**, int**), kAliasSlots> kMayInplace = {
    may_inplace<0>, may_inplace<1>, may_inplace<2>, may_inplace<3>};

// ---- registrations --------------------------------------------------------------------------------

// One (operator, signature) pair. Standard layout with the OrtCustomOp first, so that the pointer
// ORT hands to the callbacks converts back to the Registration.
struct Registration {
  OrtCustomOp ort;
  const OpSchema* op;
  TypeSignature sig;
  bool cuda;      // for ORT's CUDA execution provider; otherwise its CPU one
  char name[48];  // NUL-terminated copy of op->name
};
static_assert(std::is_standard_layout_v<Registration>);

const Registration& reg_of(const OrtCustomOp* op) { return *reinterpret_cast<const Registration*>(op); }

const char* ORT_API_CALL get_name(const OrtCustomOp* op) { return reg_of(op).name; }
constexpr const char* kCudaProvider = "CUDAExecutionProvider";
const char* ORT_API_CALL get_provider(const OrtCustomOp* op) {
  return reg_of(op).cuda ? kCudaProvider : nullptr;  // nullptr: the CPU provider
}
size_t ORT_API_CALL input_count(const OrtCustomOp* op) { return reg_of(op).op->inputs.size(); }
size_t ORT_API_CALL output_count(const OrtCustomOp* op) { return reg_of(op).op->outputs.size(); }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp* op, size_t i) {
  const Registration& r = reg_of(op);
  return ort_type(r.sig.types[r.op->inputs[i].type_var]);
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp* op, size_t i) {
  const Registration& r = reg_of(op);
  return ort_type(r.sig.types[r.op->outputs[i].type_var]);
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_kind(const OrtCustomOp* op, size_t i) {
  return reg_of(op).op->inputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_kind(const OrtCustomOp* op, size_t i) {
  return reg_of(op).op->outputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL input_memory(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL start_version(const OrtCustomOp* op) { return reg_of(op).op->since_version; }
int ORT_API_CALL variadic_min_arity(const OrtCustomOp*) { return 1; }
int ORT_API_CALL variadic_homogeneity(const OrtCustomOp*) { return 1; }

// ---- kernels --------------------------------------------------------------------------------------

struct Kernel {
  const OrtApi* api;
  const OpSchema* op;
  bool cuda;
  std::array<Attribute, kMaxAttrs> attrs;
  int num_attrs = 0;
  OrtMemoryInfo* cpu_memory = nullptr;  // names ORT's CPU allocator, for scratch on the CPU
};

OrtStatus* error(const OrtApi* api, OrtErrorCode code, const std::string& message) {
  return api->CreateStatus(code, message.c_str());
}

// True for success; a failure is released.
bool succeeded(const OrtApi* api, OrtStatus* s) {
  if (!s) return true;
  api->ReleaseStatus(s);
  return false;
}

// Reads attribute `a` of the node. Absent: *found = false (gradops applies the schema's default).
// Present with another type: an error, rather than silently running with the default.
OrtStatus* read_attribute(const OrtApi* api, const OrtKernelInfo* info, const OpSchema& op,
                          const AttrSchema& a, bool* found, double* value) {
  const std::string name(a.name);
  const bool is_float = a.type == AttrType::float32;
  float f;
  int64_t i;
  size_t size = 0;
  *found = is_float ? succeeded(api, api->KernelInfoGetAttribute_float(info, name.c_str(), &f))
                    : succeeded(api, api->KernelInfoGetAttribute_int64(info, name.c_str(), &i));
  if (*found) {
    *value = is_float ? static_cast<double>(f) : static_cast<double>(i);
    return nullptr;
  }
  // Absent, or of another type? Probe the other kinds an attribute of this name could be.
  const bool other_type = (is_float ? succeeded(api, api->KernelInfoGetAttribute_int64(info, name.c_str(), &i))
                                    : succeeded(api, api->KernelInfoGetAttribute_float(info, name.c_str(), &f))) ||
                          succeeded(api, api->KernelInfoGetAttribute_string(info, name.c_str(), nullptr, &size));
  if (!other_type) return nullptr;
  return error(api, ORT_INVALID_ARGUMENT,
               std::string(op.name) + ": attribute '" + name + "' must be " + (is_float ? "a FLOAT" : "an INT") +
                   " attribute");
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* custom_op, const OrtApi* api, const OrtKernelInfo* info,
                                      void** out) try {
  *out = nullptr;
  const OpSchema& op = *reg_of(custom_op).op;
  auto k = std::make_unique<Kernel>();
  k->api = api;
  k->op = &op;
  k->cuda = reg_of(custom_op).cuda;
  for (const AttrSchema& a : op.attributes) {
    bool found = false;
    double value = 0;
    if (OrtStatus* s = read_attribute(api, info, op, a, &found, &value)) return s;
    if (found) {
      k->attrs[k->num_attrs++] = {a.name, value};
    } else if (a.required) {
      return error(api, ORT_INVALID_ARGUMENT,
                   std::string(op.name) + ": required attribute '" + std::string(a.name) + "' is missing");
    }
  }
  // The CPU provider's allocator, for scratch. A CUDA kernel names its tensors' device instead, at
  // run time (ORT may give one kernel object tensors of any device it serves).
  if (!k->cuda)
    if (OrtStatus* s = api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &k->cpu_memory)) return s;
  *out = k.release();
  return nullptr;
} catch (const std::exception& e) {
  return error(api, ORT_RUNTIME_EXCEPTION, std::string(reg_of(custom_op).name) + ": " + e.what());
}

void ORT_API_CALL destroy_kernel(void* p) {
  auto* k = static_cast<Kernel*>(p);
  if (!k) return;
  if (k->cpu_memory) k->api->ReleaseMemoryInfo(k->cpu_memory);
  delete k;
}

// Scratch for gradops from ORT's allocator of the kernel's provider. gradops wants 64-byte
// alignment, which ORT's allocators do not promise, so each block is over-allocated; the pointer ORT
// returned is remembered here, on the host (the block may be device memory, which the host must not
// touch).
struct Scratch {
  const OrtApi* api;
  OrtKernelContext* ctx;
  const OrtMemoryInfo* memory;
  OrtAllocator* allocator = nullptr;  // fetched on first use; most calls need no scratch
  std::vector<std::pair<void*, void*>> blocks;  // (aligned, as ORT returned it)

  ~Scratch() {
    for (const auto& b : blocks) succeeded(api, api->AllocatorFree(allocator, b.second));
    if (allocator) api->ReleaseAllocator(allocator);
  }
};

constexpr std::size_t kAlign = 64;

void* scratch_allocate(void* user, Device, std::size_t bytes) try {
  auto* s = static_cast<Scratch*>(user);
  if (!s->allocator && !succeeded(s->api, s->api->KernelContext_GetAllocator(s->ctx, s->memory, &s->allocator))) {
    s->allocator = nullptr;
    return nullptr;
  }
  s->blocks.reserve(s->blocks.size() + 1);  // so that recording the block below cannot fail
  void* raw = nullptr;
  if (bytes > SIZE_MAX - kAlign || !succeeded(s->api, s->api->AllocatorAlloc(s->allocator, bytes + kAlign, &raw)) ||
      !raw)
    return nullptr;
  auto* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw) + kAlign - 1) & ~(uintptr_t{kAlign} - 1));
  s->blocks.emplace_back(aligned, raw);
  return aligned;
} catch (const std::bad_alloc&) {
  return nullptr;
}

void scratch_deallocate(void* user, Device, void* ptr, std::size_t) {
  if (!ptr) return;
  auto* s = static_cast<Scratch*>(user);
  const auto it = std::find_if(s->blocks.begin(), s->blocks.end(), [&](const auto& b) { return b.first == ptr; });
  if (it == s->blocks.end()) return;
  succeeded(s->api, s->api->AllocatorFree(s->allocator, it->second));
  s->blocks.erase(it);
}

// C API 23 (ORT 1.23) or newer, where the runtime serves it: set when the library is registered.
std::atomic<const OrtApi*> g_api23{nullptr};

// A TensorView over an OrtValue. `device` comes from the value's memory info: a GPU's memory is
// CUDA memory unless the host can address it (ORT's pinned staging buffers, which ORT 1.23 and newer
// describe as GPU memory of type HOST_ACCESSIBLE and older runtimes as CPU memory).
OrtStatus* view_of(const OrtApi* api, const OpSchema& op, const OrtValue* v, TensorView* out) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* s = api->GetTensorTypeAndShape(v, &info)) return s;
  ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  size_t rank = 0;
  OrtStatus* s = api->GetTensorElementType(info, &et);
  if (!s) s = api->GetDimensionsCount(info, &rank);
  std::vector<int64_t> dims(rank);
  if (!s) s = api->GetDimensions(info, dims.data(), rank);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (s) return s;
  DType dtype;
  if (!from_ort_type(et, &dtype))
    return error(api, ORT_INVALID_ARGUMENT,
                 std::string(op.name) + ": tensor element type " + std::to_string(et) + " is not supported");
  void* data = nullptr;
  if (OrtStatus* st = api->GetTensorMutableData(const_cast<OrtValue*>(v), &data)) return st;
  const OrtMemoryInfo* memory = nullptr;
  if (OrtStatus* st = api->GetTensorMemoryInfo(v, &memory)) return st;
  OrtMemoryInfoDeviceType device_type = OrtMemoryInfoDeviceType_CPU;
  api->MemoryInfoGetDeviceType(memory, &device_type);
  Device device = Device::cpu();
  const OrtApi* api23 = g_api23.load(std::memory_order_relaxed);
  const bool host_accessible =
      api23 && api23->MemoryInfoGetDeviceMemType(memory) == OrtDeviceMemoryType_HOST_ACCESSIBLE;
  if (device_type == OrtMemoryInfoDeviceType_GPU && !host_accessible) {
    int id = 0;
    if (OrtStatus* st = api->MemoryInfoGetId(memory, &id)) return st;
    device = Device::cuda(id);
  }
  *out = TensorView(data, dtype, std::span<const int64_t>(dims), device);
  return nullptr;
}

OrtStatus* ORT_API_CALL compute(void* p, OrtKernelContext* ctx) try {
  const Kernel& k = *static_cast<const Kernel*>(p);
  const OrtApi* api = k.api;
  const OpSchema& op = *k.op;

  std::array<TensorView, kMaxArgs> in_views{}, out_views{};
  std::array<const TensorView*, kMaxArgs> in{}, out{};
  size_t n_in = 0, n_out = 0;
  if (OrtStatus* s = api->KernelContext_GetInputCount(ctx, &n_in)) return s;
  if (OrtStatus* s = api->KernelContext_GetOutputCount(ctx, &n_out)) return s;
  for (size_t i = 0; i < op.inputs.size() && i < n_in; ++i) {
    const OrtValue* v = nullptr;
    if (OrtStatus* s = api->KernelContext_GetInput(ctx, i, &v)) return s;
    if (!v) continue;  // an absent optional input
    if (OrtStatus* s = view_of(api, op, v, &in_views[i])) return s;
    in[i] = &in_views[i];
  }
  // The outputs' shapes by the op table's rules. A call they cannot be inferred for is one gradops
  // rejects: say why now, before ORT allocates anything.
  std::array<TensorSpec, kMaxArgs> specs{};
  if (const Status st = infer_output_shapes(op.name, std::span(in.data(), op.inputs.size()),
                                            std::span(k.attrs.data(), static_cast<size_t>(k.num_attrs)), specs);
      !st)
    return error(api, ort_code(st.code()), st.message());
  for (size_t o = 0; o < op.outputs.size() && o < n_out; ++o) {
    const std::span<const int64_t> shape = specs[o].shape();
    OrtValue* v = nullptr;
    if (OrtStatus* s = api->KernelContext_GetOutput(ctx, o, shape.data(), shape.size(), &v)) return s;
    if (!v) continue;  // an optional output the node does not have
    if (OrtStatus* s = view_of(api, op, v, &out_views[o])) return s;
    out[o] = &out_views[o];
  }

  // A kernel registered for one provider runs on its memory only: a CUDA tensor handed to a CPU
  // kernel (or the reverse) would otherwise reach gradops' other backend with the wrong scratch.
  for (const auto& views : {std::span(in), std::span(out)})
    for (const TensorView* v : views)
      if (v && (v->device.type == DeviceType::cuda) != k.cuda)
        return error(api, ORT_INVALID_ARGUMENT,
                     std::string(op.name) + ": the kernel for ONNX Runtime's " + (k.cuda ? "CUDA" : "CPU") +
                         " execution provider was given a tensor in " + (k.cuda ? "host" : "CUDA device") +
                         " memory");
  // Scratch from ORT's allocator for the tensors' memory: for CUDA kernels, that of the first input
  // (every operator's first input is required), whose device the call runs on. ORT's CUDA allocator
  // hands back freed blocks only to work ordered after ours on the same stream, so the block may be
  // returned while our kernels still use it, as ORT's own CUDA kernels do with theirs.
  const OrtMemoryInfo* scratch_memory = k.cpu_memory;
  if (k.cuda) {
    const OrtValue* first = nullptr;
    if (OrtStatus* s = api->KernelContext_GetInput(ctx, 0, &first)) return s;
    if (OrtStatus* s = api->GetTensorMemoryInfo(first, &scratch_memory)) return s;
  }
  Scratch scratch{api, ctx, scratch_memory, nullptr, {}};
  const WorkspaceAllocator allocator{scratch_allocate, scratch_deallocate, &scratch};
  Context context;  // CPU threads: OpenMP's default
  context.allocator = &allocator;
  if (k.cuda)  // ORT's stream for this kernel: gradops enqueues on it and never waits for it
    if (OrtStatus* s = api->KernelContext_GetGPUComputeStream(ctx, &context.cuda_stream)) return s;

  const Status st = run(op.name, std::span(in.data(), op.inputs.size()), std::span(out.data(), op.outputs.size()),
                        std::span(k.attrs.data(), static_cast<size_t>(k.num_attrs)), context);
  if (st.is_ok()) return nullptr;
  return error(api, ort_code(st.code()), st.message());
} catch (const std::bad_alloc&) {
  const Kernel& k = *static_cast<const Kernel*>(p);
  return error(k.api, ORT_RUNTIME_EXCEPTION, std::string(k.op->name) + ": out of host memory");
} catch (const std::exception& e) {
  const Kernel& k = *static_cast<const Kernel*>(p);
  return error(k.api, ORT_RUNTIME_EXCEPTION, std::string(k.op->name) + ": " + e.what());
}

// ORT infers a custom op's output types, and picks its kernel, from the input dtypes alone, taking
// the first registration that matches. A signature whose input dtypes equal an earlier one's
// differs only in a type variable that no input carries (InvertibleLayerNormalizationGrad's T,
// which only X_grad has), and ORT could never select it: it is not registered.
bool selectable(const OpSchema& op, const TypeSignature& sig) {
  for (const TypeSignature& earlier : op.signatures) {
    if (&earlier == &sig) return true;
    bool same_inputs = true;
    for (const ArgSchema& in : op.inputs)
      same_inputs = same_inputs && earlier.types[in.type_var] == sig.types[in.type_var];
    if (same_inputs) return false;
  }
  return true;
}

// Every (operator, signature) pair for the CPU provider, and again for the CUDA provider where this
// build has a CUDA kernel for it; built once, so the addresses stay valid for the life of the
// process, as ORT requires of registered OrtCustomOps.
const std::vector<Registration>& registrations() {
  static const std::vector<Registration> regs = [] {
    std::vector<Registration> r;
    for (const OpSchema& op : op_schemas()) {
      if (!registered(op)) continue;
      int slot = -1;
      if (!op.aliases.empty()) {
        auto& sets = alias_sets();
        auto same = [&](std::span<const AliasRule> s) {
          return std::equal(s.begin(), s.end(), op.aliases.begin(), op.aliases.end(),
                            [](AliasRule a, AliasRule b) { return a.output == b.output && a.input == b.input; });
        };
        auto it = std::find_if(sets.begin(), sets.end(), same);
        slot = static_cast<int>(it - sets.begin());
        if (it == sets.end()) sets.push_back(op.aliases);
        if (slot >= kAliasSlots) throw std::length_error("more distinct in-place rule sets than slots");
      }
      for (const TypeSignature& sig : op.signatures) {
        if (!selectable(op, sig)) continue;
        Registration g{};
        g.op = &op;
        g.sig = sig;
        if (op.name.size() >= sizeof(g.name)) throw std::length_error("operator name too long");
        std::memcpy(g.name, op.name.data(), op.name.size());
        OrtCustomOp& c = g.ort;
        c.version = kMinOrtApiVersion;  // what we fill in; ORT reads no newer member
        c.GetName = get_name;
        c.GetExecutionProviderType = get_provider;
        c.GetInputType = input_type;
        c.GetInputTypeCount = input_count;
        c.GetOutputType = output_type;
        c.GetOutputTypeCount = output_count;
        c.GetInputCharacteristic = input_kind;
        c.GetOutputCharacteristic = output_kind;
        c.GetInputMemoryType = input_memory;
        c.GetVariadicInputMinArity = variadic_min_arity;
        c.GetVariadicInputHomogeneity = variadic_homogeneity;
        c.GetVariadicOutputMinArity = variadic_min_arity;
        c.GetVariadicOutputHomogeneity = variadic_homogeneity;
        c.CreateKernelV2 = create_kernel;
        c.KernelComputeV2 = compute;
        c.KernelDestroy = destroy_kernel;
        c.GetStartVersion = start_version;
        c.GetMayInplace = slot < 0 ? no_pairs : kMayInplace[slot];
        c.ReleaseMayInplace = release_pairs;
        c.GetAliasMap = no_pairs;  // ORT's Alias() means "must share"; gradops only allows it
        c.ReleaseAliasMap = release_pairs;
        r.push_back(g);
        if (supports(op.id, sig, DeviceType::cuda)) {
          g.cuda = true;
          r.push_back(g);
        }
      }
    }
    return r;
  }();
  return regs;
}

// Domains handed to ORT stay alive until the library is unloaded (ORT's sessions refer to them).
struct Domains {
  std::mutex mutex;
  std::vector<std::pair<const OrtApi*, OrtCustomOpDomain*>> list;
  ~Domains() {
    for (auto& [api, d] : list) api->ReleaseCustomOpDomain(d);
  }
};
Domains& domains() {
  static Domains d;
  return d;
}

// GRADOPS_VERBOSE=onnxruntime (or =all) reports what the library registered, and why not for CUDA.
bool verbose() {
  const char* v = std::getenv("GRADOPS_VERBOSE");
  return v && (std::strstr(v, "onnxruntime") || std::strcmp(v, "all") == 0);
}

// Whether the runtime has a CUDA execution provider: built in, or a plugin library registered with
// the environment before this library is loaded. `why` says which, or why not.
bool runtime_has_cuda(const OrtApiBase* api_base, const OrtApi* api, std::string* why) {
  char** names = nullptr;
  int count = 0;
  if (succeeded(api, api->GetAvailableProviders(&names, &count))) {
    const bool built_in = std::find_if(names, names + count, [](const char* n) {
                            return std::strcmp(n, kCudaProvider) == 0;
                          }) != names + count;
    succeeded(api, api->ReleaseAvailableProviders(names, count));
    if (built_in) {
      *why = "built into ONNX Runtime";
      return true;
    }
  }
  // Plugin execution providers (GetEpDevices, C API 22). CreateEnv returns the process's existing
  // environment, the one the plugin was registered with; ReleaseEnv only drops our reference.
  const OrtApi* api22 = api_base->GetApi(22);
  OrtEnv* env = nullptr;
  if (!api22 || !succeeded(api22, api22->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "gradops", &env))) {
    *why = "ONNX Runtime has no CUDA execution provider built in and predates plugin providers";
    return false;
  }
  const OrtEpDevice* const* devices = nullptr;
  size_t n = 0;
  bool plugin = false;
  if (succeeded(api22, api22->GetEpDevices(env, &devices, &n)))
    for (size_t i = 0; i < n && !plugin; ++i) plugin = std::strcmp(api22->EpDevice_EpName(devices[i]), kCudaProvider) == 0;
  api22->ReleaseEnv(env);
  *why = plugin ? "a plugin execution provider with a device"
                : "no CUDA execution provider: not built into ONNX Runtime, and no plugin with a device registered "
                  "with the environment (RegisterExecutionProviderLibrary) before this library was loaded";
  return plugin;
}

OrtStatus* register_all(OrtSessionOptions* options, const OrtApiBase* api_base, const OrtApi* api) {
  // CUDA kernels are registered where this build has them and the runtime can run them; the
  // environment variable GRADOPS_ORT_CUDA=0 keeps every gradops node on the CPU provider.
  const std::vector<Registration>& all = registrations();
  const bool built = std::any_of(all.begin(), all.end(), [](const Registration& r) { return r.cuda; });
  const char* knob = std::getenv("GRADOPS_ORT_CUDA");
  const bool disabled = knob && std::strcmp(knob, "0") == 0;
  std::string why = !built ? "this build of gradops has no CUDA backend" : disabled ? "GRADOPS_ORT_CUDA=0" : "";
  const bool cuda = built && !disabled && runtime_has_cuda(api_base, api, &why);
  std::vector<const Registration*> regs;  // into the static list: ORT keeps the addresses
  for (const Registration& r : all)
    if (!r.cuda || cuda) regs.push_back(&r);
  if (verbose()) {
    const auto n_cuda = static_cast<size_t>(
        std::count_if(regs.begin(), regs.end(), [](const Registration* r) { return r->cuda; }));
    std::fprintf(stderr, "gradops: onnxruntime: %zu CPU kernels, %zu CUDA kernels (%s)\n", regs.size() - n_cuda,
                 n_cuda, why.c_str());
  }
  std::vector<std::string_view> names;  // one OrtCustomOpDomain per table domain
  for (const Registration* r : regs)
    if (std::find(names.begin(), names.end(), r->op->domain) == names.end()) names.push_back(r->op->domain);
  for (std::string_view name : names) {
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* s = api->CreateCustomOpDomain(std::string(name).c_str(), &domain)) return s;
    {
      std::lock_guard<std::mutex> lock(domains().mutex);
      domains().list.emplace_back(api, domain);
    }
    for (const Registration* r : regs) {
      if (r->op->domain != name) continue;
      if (OrtStatus* s = api->CustomOpDomain_Add(domain, &r->ort)) return s;
    }
    if (OrtStatus* s = api->AddCustomOpDomain(options, domain)) return s;
  }
  return nullptr;
}

}  // namespace

extern "C" {

// The entry point ONNX Runtime calls when the library is loaded into a session's options
// (SessionOptions::RegisterCustomOpsLibrary in C++, register_custom_ops_library in Python).
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                               const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(kMinOrtApiVersion);
  if (!api) {
    // Every runtime serves version 1 of the API, which is enough to say why we stop here.
    const std::string message = std::string("libgradops_onnxruntime needs ONNX Runtime ") + kMinOrtRelease +
                                " or newer (C API version " + std::to_string(kMinOrtApiVersion) +
                                "); this runtime is " + api_base->GetVersionString();
    return api_base->GetApi(1)->CreateStatus(ORT_FAIL, message.c_str());
  }
  g_api23.store(api_base->GetApi(23), std::memory_order_relaxed);
  try {
    return register_all(options, api_base, api);
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, (std::string("libgradops_onnxruntime: ") + e.what()).c_str());
  }
}

}  // extern "C"
