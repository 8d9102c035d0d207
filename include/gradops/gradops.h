/* gradops C ABI: run any operator by its ONNX Runtime name over DLPack-shaped tensor descriptors.
 *
 * A thin layer over the C++ API (gradops::run): the same op table, the same validation, the same
 * messages. Every function returning gradops_status (and gradops_op_name / gradops_op_find, which
 * signal failure with NULL / -1) records a message for the calling thread on failure, readable
 * with gradops_last_error(), and clears it on success. No C++ exception crosses this interface;
 * running out of host memory is GRADOPS_OUT_OF_MEMORY.
 *
 * Strings returned by the introspection functions are static: valid for the life of the program.
 * C11 or C++; link with a C++ toolchain (or the C++ runtime and OpenMP) when gradops is static.
 */
#ifndef GRADOPS_GRADOPS_H
#define GRADOPS_GRADOPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define GRADOPS_NOEXCEPT noexcept
extern "C" {
#else
#define GRADOPS_NOEXCEPT
#endif

/* ---- status ---------------------------------------------------------------------------------- */

/* The codes of gradops::StatusCode, with the same values. */
typedef enum gradops_status {
  GRADOPS_OK = 0,
  GRADOPS_INVALID_ARGUMENT = 1, /* the call breaks the op's contract */
  GRADOPS_UNIMPLEMENTED = 2,    /* a valid call that no implementation in this build accepts */
  GRADOPS_OUT_OF_MEMORY = 3,
  GRADOPS_DEVICE_ERROR = 4,     /* an error reported by the device runtime (CUDA) */
  GRADOPS_INTERNAL = 5          /* a bug in gradops */
} gradops_status;

/* "ok", "invalid_argument", ...; "unknown" for a value outside the enum. */
const char* gradops_status_string(gradops_status code) GRADOPS_NOEXCEPT;

/* The message of the calling thread's last failed call ("ReluGrad: 'X' has shape [4], expected
 * [5] (the shape of 'dY')"), or "" if its last call succeeded. Valid until the thread's next
 * gradops call. */
const char* gradops_last_error(void) GRADOPS_NOEXCEPT;

/* ---- tensors --------------------------------------------------------------------------------- */

/* The values of gradops::DType and gradops::DeviceType. */
typedef enum gradops_dtype {
  GRADOPS_DTYPE_F32 = 0,
  GRADOPS_DTYPE_F64 = 1,
  GRADOPS_DTYPE_F16 = 2,  /* IEEE binary16 */
  GRADOPS_DTYPE_BF16 = 3  /* bfloat16 */
} gradops_dtype;

typedef enum gradops_device_type { GRADOPS_DEVICE_CPU = 0, GRADOPS_DEVICE_CUDA = 1 } gradops_device_type;

/* "f32", "f64", "f16", "bf16"; "unknown" otherwise. */
const char* gradops_dtype_name(int32_t dtype) GRADOPS_NOEXCEPT;

#define GRADOPS_MAX_RANK 8
/* No operator has more inputs, or more outputs, than this. */
#define GRADOPS_MAX_ARGS 6

typedef struct gradops_device {
  int32_t type;  /* a gradops_device_type */
  int32_t index; /* CUDA ordinal; 0 for the CPU */
} gradops_device;

/* A view of a dense row-major tensor, laid out like DLPack's DLTensor (see docs/c_api.md for the
 * mapping). The base pointer may have any alignment. */
typedef struct gradops_tensor {
  void* data;             /* NULL only when the tensor has no elements */
  gradops_device device;
  int32_t rank;           /* 0 to GRADOPS_MAX_RANK */
  int32_t dtype;          /* a gradops_dtype */
  const int64_t* shape;   /* rank dims; may be NULL when rank is 0 */
  const int64_t* strides; /* in elements, as in DLPack; NULL means dense row-major. Anything else
                             must describe the dense row-major layout (strides of size-1 dims are
                             ignored): gradops has no strided kernels and says so. */
} gradops_tensor;

/* A named attribute. INT attributes take integral values; FLOAT ones are rounded to float. */
typedef struct gradops_attribute {
  const char* name;
  double value;
} gradops_attribute;

/* ---- context ------------------------------------------------------------------------------------ */

/* Scratch memory for kernels that need it; the function-pointer shape of
 * gradops::WorkspaceAllocator. allocate returns NULL on failure; memory must be usable on `device`
 * and aligned to 64 bytes. */
typedef struct gradops_allocator {
  void* (*allocate)(void* user, gradops_device device, size_t bytes);
  void (*deallocate)(void* user, gradops_device device, void* ptr, size_t bytes);
  void* user;
} gradops_allocator;

/* All-zero (or a NULL context pointer) means the defaults. */
typedef struct gradops_context {
  int32_t num_threads;                /* CPU threads; 0: the OpenMP default. Results never depend on it. */
  void* cuda_stream;                  /* cudaStream_t for CUDA tensors; NULL: the legacy default stream */
  const gradops_allocator* allocator; /* NULL: gradops' default allocator */
} gradops_context;

/* ---- running ops ----------------------------------------------------------------------------- */

/* Runs the operator `op_name` (an ORT name: "GeluGrad", "LayerNormalizationGrad", ...). inputs and
 * outputs are in the schema's order; a NULL entry is an absent optional, and trailing optional ones
 * may be left out of the counts. Unlisted attributes take the schema's defaults. The whole call is
 * validated before anything is written: on failure every output byte is untouched. */
gradops_status gradops_run(const char* op_name, const gradops_tensor* const* inputs, size_t num_inputs,
                           const gradops_tensor* const* outputs, size_t num_outputs,
                           const gradops_attribute* attributes, size_t num_attributes,
                           const gradops_context* ctx) GRADOPS_NOEXCEPT;

/* Validates the call exactly as gradops_run does, without reading or writing tensor data, and
 * writes the display name of the implementation that would run it ("cpu:simd [AVX3]") into
 * name[0..capacity), NUL-terminated and truncated to fit (capacity 64 is plenty). */
gradops_status gradops_implementation_name(const char* op_name, const gradops_tensor* const* inputs,
                                           size_t num_inputs, const gradops_tensor* const* outputs,
                                           size_t num_outputs, const gradops_attribute* attributes,
                                           size_t num_attributes, const gradops_context* ctx, char* name,
                                           size_t capacity) GRADOPS_NOEXCEPT;

/* ---- output shapes and what this build runs ----------------------------------------------------- */

/* The dtype and shape of every output of `op_name` (optional ones included, in the schema's order)
 * for these inputs and attributes, from the op table's per-output rules. Inputs are read for their
 * dtype, shape and device only: `data` may be NULL. The call is validated as gradops_run would
 * validate it with every output present at the inferred shapes, except for data pointers; a valid
 * call that this build has no kernel for (gradops_supports says 0) still gets its shapes.
 *   output_dims:   num_outputs rows of GRADOPS_MAX_RANK int64 values; row o holds output o's dims,
 *                  the entries past its rank set to 0
 *   output_ranks:  num_outputs values
 *   output_dtypes: num_outputs gradops_dtype values, or NULL when not wanted
 *   num_outputs:   at least the op's number of outputs (gradops_op_info.num_outputs, at most
 *                  GRADOPS_MAX_ARGS); entries past them get rank -1 and dtype -1.
 * On failure nothing is written. */
gradops_status gradops_infer_output_shapes(const char* op_name, const gradops_tensor* const* inputs,
                                           size_t num_inputs, const gradops_attribute* attributes,
                                           size_t num_attributes, int64_t* output_dims, int32_t* output_ranks,
                                           int32_t* output_dtypes, size_t num_outputs) GRADOPS_NOEXCEPT;

/* Whether this build has a kernel for operator `op` (a number from gradops_op_find) on devices of
 * type `device_type` (a gradops_device_type): *supported is 1 or 0. dtypes holds one gradops_dtype
 * per type variable of the op (num_dtypes = gradops_op_info.num_type_vars, in the order of
 * gradops_op_get_type_var); dtypes NULL with num_dtypes 0 asks for any signature of the op. A
 * dtype combination that is not one of the op's signatures is not supported (0, not an error).
 * A static fact of the build, the same for every call: what gradops_run can dispatch to before a
 * kernel's own limits on a particular call pick among the implementations. */
gradops_status gradops_supports(int32_t op, int32_t device_type, const int32_t* dtypes, size_t num_dtypes,
                                int32_t* supported) GRADOPS_NOEXCEPT;

/* ---- the op table ------------------------------------------------------------------------------ */

typedef enum gradops_attribute_type { GRADOPS_ATTRIBUTE_INT = 0, GRADOPS_ATTRIBUTE_FLOAT = 1 } gradops_attribute_type;

#define GRADOPS_MAX_TYPE_VARS 4

typedef struct gradops_op_info {
  const char* name;        /* ORT's op name */
  const char* domain;      /* "com.microsoft", or "" for the ONNX domain */
  const char* family;      /* "activation", "softmax", "layer_norm", "batch_norm" */
  const char* summary;
  int32_t since_version;
  int32_t gradient;        /* 1 for the 17 gradient operators, 0 for the others */
  int32_t num_inputs;
  int32_t num_outputs;
  int32_t num_attributes;
  int32_t num_type_vars;   /* "T", or "T","U","V", or "T","T1","T2", or "T","T1","T2","S" */
  int32_t num_signatures;  /* allowed dtype assignments to the type variables */
  int32_t num_aliases;     /* (output, input) pairs that may share one buffer */
  const char* origin;      /* "onnxruntime": ORT's operator (the ORT adapter registers these);
                              "gradops": gradops' own, registered in no ORT domain */
} gradops_op_info;

typedef struct gradops_arg_info {
  const char* name;        /* ORT's name */
  const char* type_var;    /* "T", "U", ... */
  const char* doc;
  int32_t type_var_index;
  int32_t optional;
  int32_t extension;       /* 1: gradops-only, not in ORT's schema */
} gradops_arg_info;

typedef struct gradops_attribute_info {
  const char* name;
  const char* doc;
  double default_value;    /* meaningless when required */
  int32_t type;            /* a gradops_attribute_type */
  int32_t required;
  int32_t extension;       /* 1: gradops-only, not in ORT's schema */
} gradops_attribute_info;

/* Operators are numbered 0 .. count-1: the 17 gradient operators first, then the forwards, then
 * gradops' own operators (origin "gradops"). */
int32_t gradops_op_count(void) GRADOPS_NOEXCEPT;
/* NULL if op is out of range. */
const char* gradops_op_name(int32_t op) GRADOPS_NOEXCEPT;
/* The number of the operator with this ORT name, or -1. */
int32_t gradops_op_find(const char* name) GRADOPS_NOEXCEPT;

gradops_status gradops_op_get_info(int32_t op, gradops_op_info* info) GRADOPS_NOEXCEPT;
gradops_status gradops_op_get_input(int32_t op, int32_t index, gradops_arg_info* info) GRADOPS_NOEXCEPT;
gradops_status gradops_op_get_output(int32_t op, int32_t index, gradops_arg_info* info) GRADOPS_NOEXCEPT;
gradops_status gradops_op_get_attribute(int32_t op, int32_t index, gradops_attribute_info* info) GRADOPS_NOEXCEPT;
/* The name of type variable `index` ("T", "U", ...). */
gradops_status gradops_op_get_type_var(int32_t op, int32_t index, const char** name) GRADOPS_NOEXCEPT;
/* Signature `index`: dtypes[v] is the gradops_dtype of type variable v, for v < num_type_vars; the
 * remaining entries of the GRADOPS_MAX_TYPE_VARS are set to -1. */
gradops_status gradops_op_get_signature(int32_t op, int32_t index,
                                        int32_t dtypes[GRADOPS_MAX_TYPE_VARS]) GRADOPS_NOEXCEPT;
/* Alias rule `index`: output `*output` may be the very same buffer as input `*input`. */
gradops_status gradops_op_get_alias(int32_t op, int32_t index, int32_t* output, int32_t* input) GRADOPS_NOEXCEPT;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* GRADOPS_GRADOPS_H */
