/* The C ABI from a C11 program: values of real calls, error codes and messages, the thread-local
 * last error, the context's allocator, and the op table through introspection. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gradops/gradops.h"

#if !defined(__STDC_NO_THREADS__)
#include <threads.h>
#endif

static int g_failures = 0;

/* C has no other way to report the failing line. */
#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                           \
    }                                                                         \
  } while (0)

static gradops_tensor tensor(void* data, gradops_dtype dtype, int32_t rank, const int64_t* shape) {
  gradops_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.type = GRADOPS_DEVICE_CPU;
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  return t;
}

static int contains(const char* haystack, const char* needle) { return strstr(haystack, needle) != NULL; }

/* dX = X > 0 ? dY : 0, exactly. */
static void test_relu_grad(void) {
  float dy[5] = {1.5f, -2.0f, 3.0f, 4.25f, 5.0f};
  float x[5] = {-1.0f, 0.0f, 0.5f, 2.0f, -3.0f};
  float dx[5];
  const float want[5] = {0.0f, 0.0f, 3.0f, 4.25f, 0.0f};
  const int64_t shape[1] = {5};
  for (int i = 0; i < 5; ++i) dx[i] = NAN;
  gradops_tensor tdy = tensor(dy, GRADOPS_DTYPE_F32, 1, shape), tx = tensor(x, GRADOPS_DTYPE_F32, 1, shape),
                 tdx = tensor(dx, GRADOPS_DTYPE_F32, 1, shape);
  const gradops_tensor* in[2] = {&tdy, &tx};
  const gradops_tensor* out[1] = {&tdx};
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_OK);
  CHECK(strcmp(gradops_last_error(), "") == 0);
  for (int i = 0; i < 5; ++i) CHECK(dx[i] == want[i]);
}

/* dX = dY * Y * (1 - Y): these values are exact in binary, so f32 and f64 results are too. */
static void test_sigmoid_grad(void) {
  const double dy[4] = {1.0, 2.0, -1.0, 0.5};
  const double y[4] = {0.5, 0.25, 0.75, 0.125};
  const double want[4] = {0.25, 0.375, -0.1875, 0.0546875};
  const int64_t shape[2] = {2, 2};

  double dx64[4] = {NAN, NAN, NAN, NAN};
  gradops_tensor tdy = tensor((void*)dy, GRADOPS_DTYPE_F64, 2, shape), ty = tensor((void*)y, GRADOPS_DTYPE_F64, 2, shape),
                 tdx = tensor(dx64, GRADOPS_DTYPE_F64, 2, shape);
  const gradops_tensor* in[2] = {&tdy, &ty};
  const gradops_tensor* out[1] = {&tdx};
  gradops_context ctx = {1, NULL, NULL};  /* one thread */
  CHECK(gradops_run("SigmoidGrad", in, 2, out, 1, NULL, 0, &ctx) == GRADOPS_OK);
  for (int i = 0; i < 4; ++i) CHECK(dx64[i] == want[i]);

  float dy32[4], y32[4], dx32[4];
  for (int i = 0; i < 4; ++i) {
    dy32[i] = (float)dy[i];
    y32[i] = (float)y[i];
    dx32[i] = NAN;
  }
  tdy = tensor(dy32, GRADOPS_DTYPE_F32, 2, shape);
  ty = tensor(y32, GRADOPS_DTYPE_F32, 2, shape);
  tdx = tensor(dx32, GRADOPS_DTYPE_F32, 2, shape);
  CHECK(gradops_run("SigmoidGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_OK);
  for (int i = 0; i < 4; ++i) CHECK(fabs(dx32[i] - want[i]) <= 1e-7 * fabs(want[i]));

  /* In place: dX may be dY's buffer (the schema's alias rule). */
  tdx = tensor(dy32, GRADOPS_DTYPE_F32, 2, shape);
  CHECK(gradops_run("SigmoidGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_OK);
  for (int i = 0; i < 4; ++i) CHECK(fabs(dy32[i] - want[i]) <= 1e-7 * fabs(want[i]));
}

/* Attributes by name: alpha scales the gradient where Y <= 0. */
static void test_attributes(void) {
  float dy[3] = {3.0f, 3.0f, -2.0f}, y[3] = {1.0f, -1.0f, 0.0f}, dx[3] = {NAN, NAN, NAN};
  const int64_t shape[1] = {3};
  gradops_tensor tdy = tensor(dy, GRADOPS_DTYPE_F32, 1, shape), ty = tensor(y, GRADOPS_DTYPE_F32, 1, shape),
                 tdx = tensor(dx, GRADOPS_DTYPE_F32, 1, shape);
  const gradops_tensor* in[2] = {&tdy, &ty};
  const gradops_tensor* out[1] = {&tdx};
  const gradops_attribute alpha = {"alpha", 0.25};
  CHECK(gradops_run("LeakyReluGrad", in, 2, out, 1, &alpha, 1, NULL) == GRADOPS_OK);
  CHECK(dx[0] == 3.0f && dx[1] == 0.75f && dx[2] == -0.5f);

  /* The schema default (0.01) when the attribute is left out. */
  CHECK(gradops_run("LeakyReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_OK);
  CHECK(dx[1] == 3.0f * 0.01f);

  const gradops_attribute negative = {"alpha", -1.0};
  dx[0] = NAN;
  CHECK(gradops_run("LeakyReluGrad", in, 2, out, 1, &negative, 1, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "LeakyReluGrad") && contains(gradops_last_error(), "alpha"));
  CHECK(isnan(dx[0]));

  /* ReluGrad checks its attribute names. */
  const gradops_attribute unknown = {"gamma", 1.0};
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, &unknown, 1, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "ReluGrad") && contains(gradops_last_error(), "gamma"));
}

/* Bad calls: the right code, a message naming the op and the argument, outputs untouched, and a
 * successful call clears the message. */
static void test_errors(void) {
  float dy[5] = {1, 2, 3, 4, 5}, x[5] = {1, 1, 1, 1, 1}, dx[5];
  const int64_t shape5[1] = {5}, shape4[1] = {4};
  for (int i = 0; i < 5; ++i) dx[i] = NAN;
  gradops_tensor tdy = tensor(dy, GRADOPS_DTYPE_F32, 1, shape5), tx = tensor(x, GRADOPS_DTYPE_F32, 1, shape4),
                 tdx = tensor(dx, GRADOPS_DTYPE_F32, 1, shape5);
  const gradops_tensor* in[2] = {&tdy, &tx};
  const gradops_tensor* out[1] = {&tdx};

  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "ReluGrad") && contains(gradops_last_error(), "'X'") &&
        contains(gradops_last_error(), "[4]") && contains(gradops_last_error(), "[5]"));
  for (int i = 0; i < 5; ++i) CHECK(isnan(dx[i]));

  tx.shape = shape5;
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_OK);
  CHECK(strcmp(gradops_last_error(), "") == 0);
  CHECK(dx[0] == 1.0f);

  CHECK(gradops_run("NoSuchGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "NoSuchGrad"));
  CHECK(gradops_run(NULL, in, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "op_name"));

  /* A missing required input. */
  const gradops_tensor* missing[2] = {&tdy, NULL};
  CHECK(gradops_run("ReluGrad", missing, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "ReluGrad") && contains(gradops_last_error(), "'X'"));
  CHECK(gradops_run("ReluGrad", in, 3, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "3 inputs"));

  /* Codes the C side can get wrong: an unknown dtype, a rank without a shape, a bad device. */
  tdy.dtype = 7;
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "ReluGrad") && contains(gradops_last_error(), "'dY'") &&
        contains(gradops_last_error(), "dtype"));
  tdy.dtype = GRADOPS_DTYPE_F32;
  tdy.shape = NULL;
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "'dY'") && contains(gradops_last_error(), "NULL shape"));
  tdy.shape = shape5;
  tdx.device.type = 9;
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "output 'dX'") && contains(gradops_last_error(), "device"));
  tdx.device.type = GRADOPS_DEVICE_CPU;

  /* Mixed dtypes within one type variable. */
  tx.dtype = GRADOPS_DTYPE_F64;
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "'X'") && contains(gradops_last_error(), "f64"));
  tx.dtype = GRADOPS_DTYPE_F32;

  /* Strides: the dense row-major ones pass (any stride on a size-1 dim), others are refused. */
  float m[6] = {1, 2, 3, 4, 5, 6}, g[6] = {1, 1, 1, 1, 1, 1}, gm[6];
  const int64_t shape23[2] = {2, 3}, dense[2] = {3, 1}, transposed[2] = {1, 2};
  gradops_tensor tg = tensor(g, GRADOPS_DTYPE_F32, 2, shape23), tm = tensor(m, GRADOPS_DTYPE_F32, 2, shape23),
                 tgm = tensor(gm, GRADOPS_DTYPE_F32, 2, shape23);
  const gradops_tensor* in2[2] = {&tg, &tm};
  const gradops_tensor* out2[1] = {&tgm};
  tm.strides = dense;
  CHECK(gradops_run("ReluGrad", in2, 2, out2, 1, NULL, 0, NULL) == GRADOPS_OK);
  tm.strides = transposed;
  CHECK(gradops_run("ReluGrad", in2, 2, out2, 1, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "'X'") && contains(gradops_last_error(), "dense"));
  const int64_t shape13[2] = {1, 3}, odd_outer[2] = {99, 1};
  tm.shape = shape13;
  tm.strides = odd_outer;
  tg.shape = shape13;
  tgm.shape = shape13;
  CHECK(gradops_run("ReluGrad", in2, 2, out2, 1, NULL, 0, NULL) == GRADOPS_OK);

  /* A CUDA tensor in a build without CUDA is a valid call this build cannot run. */
#if !defined(GRADOPS_HAVE_CUDA)
  tdy.device.type = tx.device.type = tdx.device.type = GRADOPS_DEVICE_CUDA;
  CHECK(gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) == GRADOPS_UNIMPLEMENTED);
  CHECK(contains(gradops_last_error(), "ReluGrad") && contains(gradops_last_error(), "cuda"));
#endif
}

static void test_status_strings(void) {
  CHECK(strcmp(gradops_status_string(GRADOPS_OK), "ok") == 0);
  CHECK(strcmp(gradops_status_string(GRADOPS_INVALID_ARGUMENT), "invalid_argument") == 0);
  CHECK(strcmp(gradops_status_string(GRADOPS_UNIMPLEMENTED), "unimplemented") == 0);
  CHECK(strcmp(gradops_status_string(GRADOPS_OUT_OF_MEMORY), "out_of_memory") == 0);
  CHECK(strcmp(gradops_status_string(GRADOPS_DEVICE_ERROR), "device_error") == 0);
  CHECK(strcmp(gradops_status_string(GRADOPS_INTERNAL), "internal") == 0);
  /* Values outside the enum: the library must not read them as its C++ enum (UBSan's enum check). */
  CHECK(strcmp(gradops_status_string((gradops_status)42), "unknown") == 0);
  CHECK(strcmp(gradops_status_string((gradops_status)-1), "unknown") == 0);
  CHECK(strcmp(gradops_dtype_name(GRADOPS_DTYPE_BF16), "bf16") == 0);
  CHECK(strcmp(gradops_dtype_name(-1), "unknown") == 0);
}

/* A counting allocator: BiasGeluGrad_dX takes its dB partial sums from the context's allocator. */
typedef struct {
  int allocations, releases;
  size_t live;
} counting;
static _Alignas(64) unsigned char g_arena[1 << 16];
static void* count_allocate(void* user, gradops_device device, size_t bytes) {
  counting* c = (counting*)user;
  if (device.type != GRADOPS_DEVICE_CPU || bytes > sizeof g_arena || c->live) return NULL;
  ++c->allocations;
  c->live = bytes;
  return g_arena;
}
static void count_deallocate(void* user, gradops_device device, void* p, size_t bytes) {
  counting* c = (counting*)user;
  (void)device;
  if (p == g_arena && bytes == c->live) ++c->releases;
  c->live = 0;
}
static void* refuse(void* user, gradops_device device, size_t bytes) {
  (void)user, (void)device, (void)bytes;
  return NULL;
}

static void test_allocator(void) {
  enum { R = 3, C = 4 };
  float dy[R * C], x[R * C], b[C] = {0, 0, 0, 0}, dx[R * C], db[C];
  for (int i = 0; i < R * C; ++i) dy[i] = 1.0f, x[i] = 0.0f;  /* GeluGrad(0) = 0.5 exactly */
  const int64_t shape[2] = {R, C}, bshape[1] = {C};
  gradops_tensor tdy = tensor(dy, GRADOPS_DTYPE_F32, 2, shape), tx = tensor(x, GRADOPS_DTYPE_F32, 2, shape),
                 tb = tensor(b, GRADOPS_DTYPE_F32, 1, bshape), tdx = tensor(dx, GRADOPS_DTYPE_F32, 2, shape),
                 tdb = tensor(db, GRADOPS_DTYPE_F32, 1, bshape);
  const gradops_tensor* in[3] = {&tdy, &tx, &tb};
  const gradops_tensor* out[2] = {&tdx, &tdb};

  counting c = {0, 0, 0};
  gradops_allocator alloc = {count_allocate, count_deallocate, &c};
  gradops_context ctx = {0, NULL, &alloc};
  CHECK(gradops_run("BiasGeluGrad_dX", in, 3, out, 2, NULL, 0, &ctx) == GRADOPS_OK);
  for (int i = 0; i < R * C; ++i) CHECK(fabsf(dx[i] - 0.5f) <= 1e-7f);
  for (int j = 0; j < C; ++j) CHECK(fabsf(db[j] - 1.5f) <= 1e-6f);
  CHECK(c.allocations >= 1 && c.allocations == c.releases && c.live == 0);

  /* An allocator that fails turns into out_of_memory naming the op. */
  gradops_allocator none = {refuse, NULL, NULL};
  ctx.allocator = &none;
  CHECK(gradops_run("BiasGeluGrad_dX", in, 3, out, 2, NULL, 0, &ctx) == GRADOPS_OUT_OF_MEMORY);
  CHECK(contains(gradops_last_error(), "BiasGeluGrad_dX"));
}

static void test_implementation_name(void) {
  float a[2] = {1, -1}, d[2];
  const int64_t shape[1] = {2};
  gradops_tensor ta = tensor(a, GRADOPS_DTYPE_F32, 1, shape), td = tensor(d, GRADOPS_DTYPE_F32, 1, shape);
  const gradops_tensor* in[2] = {&ta, &ta};
  const gradops_tensor* out[1] = {&td};
  char name[64];
  d[0] = d[1] = NAN;
  CHECK(gradops_implementation_name("GeluGrad", in, 2, out, 1, NULL, 0, NULL, name, sizeof name) == GRADOPS_OK);
  CHECK(strncmp(name, "cpu:", 4) == 0);
  CHECK(isnan(d[0]) && isnan(d[1]));  /* resolved, not run */
  char tiny[4];
  CHECK(gradops_implementation_name("GeluGrad", in, 2, out, 1, NULL, 0, NULL, tiny, sizeof tiny) == GRADOPS_OK);
  CHECK(strlen(tiny) == 3 && strncmp(tiny, "cpu", 3) == 0);
  const int64_t bad[1] = {3};
  td.shape = bad;
  CHECK(gradops_implementation_name("GeluGrad", in, 2, out, 1, NULL, 0, NULL, name, sizeof name) ==
        GRADOPS_INVALID_ARGUMENT);
  CHECK(name[0] == '\0' && contains(gradops_last_error(), "GeluGrad"));
}

/* ORT's gradient operators gradops started with, in the table's order; others may follow or sit
   between them, so the counts below come from the table. */
static const char* const kGradients[] = {
    "GeluGrad", "FastGeluGrad", "BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "ReluGrad", "SigmoidGrad",
    "TanhGrad", "QuickGeluGrad", "LeakyReluGrad", "SoftmaxGrad", "SoftmaxGrad_13", "LogSoftmaxGrad",
    "LogSoftmaxGrad_13", "LayerNormalizationGrad", "InvertibleLayerNormalizationGrad",
    "SimplifiedLayerNormalizationGrad", "BatchNormalizationGrad"};
#define NUM_KNOWN_GRADIENTS ((int)(sizeof kGradients / sizeof kGradients[0]))

static void test_introspection(void) {
  const int32_t n = gradops_op_count();
  CHECK(n > NUM_KNOWN_GRADIENTS);
  int gradients = 0, forwards = 0;
  for (int32_t op = 0; op < n; ++op) {
    gradops_op_info info;
    CHECK(gradops_op_get_info(op, &info) == GRADOPS_OK);
    CHECK(strcmp(info.name, gradops_op_name(op)) == 0);
    CHECK(gradops_op_find(info.name) == op);
    CHECK(info.num_inputs >= 1 && info.num_outputs >= 1 && info.num_signatures >= 1);
    CHECK(info.num_type_vars >= 1 && info.num_type_vars <= GRADOPS_MAX_TYPE_VARS);
    if (info.gradient) {
      CHECK(forwards == 0); /* the gradients come first */
      ++gradients;
      CHECK(strcmp(info.domain, "com.microsoft") == 0);
    } else {
      ++forwards;
    }
    for (int32_t i = 0; i < info.num_inputs; ++i) {
      gradops_arg_info a;
      CHECK(gradops_op_get_input(op, i, &a) == GRADOPS_OK && a.name[0] != '\0');
      const char* tv = NULL;
      CHECK(gradops_op_get_type_var(op, a.type_var_index, &tv) == GRADOPS_OK && strcmp(tv, a.type_var) == 0);
    }
    for (int32_t s = 0; s < info.num_signatures; ++s) {
      int32_t dt[GRADOPS_MAX_TYPE_VARS];
      CHECK(gradops_op_get_signature(op, s, dt) == GRADOPS_OK);
      for (int v = 0; v < GRADOPS_MAX_TYPE_VARS; ++v)
        CHECK(v < info.num_type_vars ? (dt[v] >= GRADOPS_DTYPE_F32 && dt[v] <= GRADOPS_DTYPE_BF16) : dt[v] == -1);
    }
  }
  CHECK(gradients >= NUM_KNOWN_GRADIENTS && forwards >= 1 && gradients + forwards == n);
  /* The known gradient operators are gradients, in the table's order. */
  int32_t previous = -1;
  for (int i = 0; i < NUM_KNOWN_GRADIENTS; ++i) {
    const int32_t op = gradops_op_find(kGradients[i]);
    CHECK(op > previous && op < gradients);
    previous = op;
    gradops_op_info info;
    CHECK(gradops_op_get_info(op, &info) == GRADOPS_OK && info.gradient == 1);
  }

  /* A few entries in detail. */
  const int32_t relu = gradops_op_find("ReluGrad");
  gradops_op_info info;
  gradops_arg_info a;
  CHECK(gradops_op_get_info(relu, &info) == GRADOPS_OK);
  CHECK(info.num_inputs == 2 && info.num_outputs == 1 && info.num_attributes == 0 && info.num_signatures == 4);
  CHECK(gradops_op_get_input(relu, 0, &a) == GRADOPS_OK && strcmp(a.name, "dY") == 0 && !a.optional);
  CHECK(gradops_op_get_input(relu, 1, &a) == GRADOPS_OK && strcmp(a.name, "X") == 0 && strcmp(a.type_var, "T") == 0);
  CHECK(gradops_op_get_output(relu, 0, &a) == GRADOPS_OK && strcmp(a.name, "dX") == 0);
  int32_t o = -1, i = -1;
  CHECK(info.num_aliases == 1 && gradops_op_get_alias(relu, 0, &o, &i) == GRADOPS_OK && o == 0 && i == 0);

  const int32_t bias = gradops_op_find("BiasGeluGrad_dX");
  CHECK(gradops_op_get_output(bias, 1, &a) == GRADOPS_OK);
  CHECK(strcmp(a.name, "dB") == 0 && a.optional == 1 && a.extension == 1);

  const int32_t ln = gradops_op_find("LayerNormalizationGrad");
  gradops_attribute_info at;
  CHECK(gradops_op_get_info(ln, &info) == GRADOPS_OK && info.num_inputs == 5 && info.num_outputs == 3);
  CHECK(info.num_type_vars == 3 && strcmp(info.family, "layer_norm") == 0);
  CHECK(gradops_op_get_attribute(ln, 0, &at) == GRADOPS_OK && strcmp(at.name, "axis") == 0);
  CHECK(at.type == GRADOPS_ATTRIBUTE_INT && at.default_value == -1.0 && !at.required);
  CHECK(gradops_op_get_input(ln, 3, &a) == GRADOPS_OK && strcmp(a.name, "mean") == 0 && strcmp(a.type_var, "U") == 0);

  const int32_t bn = gradops_op_find("BatchNormalizationGrad");
  CHECK(gradops_op_get_attribute(bn, 0, &at) == GRADOPS_OK && strcmp(at.name, "epsilon") == 0);
  CHECK(at.type == GRADOPS_ATTRIBUTE_FLOAT && at.required == 1);
  CHECK(gradops_op_get_attribute(bn, 1, &at) == GRADOPS_OK && strcmp(at.name, "channels_last") == 0 && at.extension);

  const int32_t relu_fwd = gradops_op_find("Relu");
  CHECK(gradops_op_get_info(relu_fwd, &info) == GRADOPS_OK && strcmp(info.domain, "") == 0 && !info.gradient);

  /* Out of range: NULL / -1 / invalid_argument with a message; a good call clears it. */
  CHECK(gradops_op_name(n) == NULL && contains(gradops_last_error(), "out of range"));
  CHECK(gradops_op_name(0) != NULL && strcmp(gradops_last_error(), "") == 0);
  CHECK(gradops_op_find("Nope") == -1 && contains(gradops_last_error(), "Nope"));
  CHECK(gradops_op_get_info(-1, &info) == GRADOPS_INVALID_ARGUMENT);
  CHECK(gradops_op_get_input(relu, 2, &a) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "ReluGrad") && contains(gradops_last_error(), "2 inputs"));
  CHECK(gradops_op_get_attribute(relu, 0, &at) == GRADOPS_INVALID_ARGUMENT);
  CHECK(gradops_op_get_info(relu, NULL) == GRADOPS_INVALID_ARGUMENT);
}

#if !defined(__STDC_NO_THREADS__)
/* The last error belongs to the thread that made the call. */
static int fail_in_thread(void* arg) {
  (void)arg;
  const int bad = gradops_run("NoSuchOpInThread", NULL, 0, NULL, 0, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT;
  return bad && contains(gradops_last_error(), "NoSuchOpInThread");
}
static void test_thread_local_error(void) {
  CHECK(gradops_run("NoSuchOpInMain", NULL, 0, NULL, 0, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  thrd_t t;
  int result = 0;
  CHECK(thrd_create(&t, fail_in_thread, NULL) == thrd_success);
  CHECK(thrd_join(t, &result) == thrd_success && result == 1);
  CHECK(contains(gradops_last_error(), "NoSuchOpInMain"));
}
#endif

/* Output shapes from input descriptors alone (NULL data), as a ctypes caller would ask. */
static void test_infer_output_shapes(void) {
  const int64_t xs[] = {2, 3, 4};
  const int64_t cols[] = {4};
  gradops_tensor x = tensor(NULL, GRADOPS_DTYPE_F16, 3, xs);
  gradops_tensor scale = tensor(NULL, GRADOPS_DTYPE_F16, 1, cols);
  const gradops_tensor* in[] = {&x, &scale};
  const gradops_attribute axis = {"axis", 1};
  int64_t dims[GRADOPS_MAX_ARGS][GRADOPS_MAX_RANK];
  int32_t ranks[GRADOPS_MAX_ARGS], dtypes[GRADOPS_MAX_ARGS];
  /* LayerNormalization at axis 1 wants 12 scale values: the call is rejected, nothing written. */
  ranks[0] = 99;
  CHECK(gradops_infer_output_shapes("LayerNormalization", in, 2, &axis, 1, &dims[0][0], ranks, dtypes,
                                    GRADOPS_MAX_ARGS) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "LayerNormalization") && contains(gradops_last_error(), "'Scale'"));
  CHECK(ranks[0] == 99);
  /* At the last axis: Y like X, Mean and InvStdDev one per row with the normalized dims kept as 1. */
  CHECK(gradops_infer_output_shapes("LayerNormalization", in, 2, NULL, 0, &dims[0][0], ranks, dtypes,
                                    GRADOPS_MAX_ARGS) == GRADOPS_OK);
  CHECK(ranks[0] == 3 && dims[0][0] == 2 && dims[0][1] == 3 && dims[0][2] == 4 && dims[0][3] == 0);
  CHECK(dtypes[0] == GRADOPS_DTYPE_F16);
  CHECK(ranks[1] == 3 && dims[1][0] == 2 && dims[1][1] == 3 && dims[1][2] == 1);
  CHECK(dtypes[1] == GRADOPS_DTYPE_F32 && dtypes[2] == GRADOPS_DTYPE_F32);
  CHECK(ranks[3] == -1 && ranks[4] == -1 && dtypes[3] == -1);
  /* Room for fewer outputs than the op has: an error. */
  CHECK(gradops_infer_output_shapes("LayerNormalization", in, 2, NULL, 0, &dims[0][0], ranks, NULL, 2) ==
        GRADOPS_INVALID_ARGUMENT);
  /* BiasGeluGrad_dX: dB like B. */
  const int64_t bs[] = {4};
  gradops_tensor dy = tensor(NULL, GRADOPS_DTYPE_F32, 3, xs), x32 = tensor(NULL, GRADOPS_DTYPE_F32, 3, xs),
                 b = tensor(NULL, GRADOPS_DTYPE_F32, 1, bs);
  const gradops_tensor* bin[] = {&dy, &x32, &b};
  CHECK(gradops_infer_output_shapes("BiasGeluGrad_dX", bin, 3, NULL, 0, &dims[0][0], ranks, NULL, 2) == GRADOPS_OK);
  CHECK(ranks[0] == 3 && ranks[1] == 1 && dims[1][0] == 4);
}

static void test_supports(void) {
  const int32_t op = gradops_op_find("LayerNormalizationGrad");
  int32_t yes = -1;
  CHECK(gradops_supports(op, GRADOPS_DEVICE_CPU, NULL, 0, &yes) == GRADOPS_OK && yes == 1);
  const int32_t sig[] = {GRADOPS_DTYPE_F16, GRADOPS_DTYPE_F32, GRADOPS_DTYPE_F16};
  CHECK(gradops_supports(op, GRADOPS_DEVICE_CPU, sig, 3, &yes) == GRADOPS_OK && yes == 1);
  const int32_t unlisted[] = {GRADOPS_DTYPE_F16, GRADOPS_DTYPE_F64, GRADOPS_DTYPE_F16};
  CHECK(gradops_supports(op, GRADOPS_DEVICE_CPU, unlisted, 3, &yes) == GRADOPS_OK && yes == 0);
  CHECK(gradops_supports(op, GRADOPS_DEVICE_CPU, sig, 1, &yes) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "type variables"));
  CHECK(gradops_supports(op, 7, NULL, 0, &yes) == GRADOPS_INVALID_ARGUMENT);
  CHECK(gradops_supports(-1, GRADOPS_DEVICE_CPU, NULL, 0, &yes) == GRADOPS_INVALID_ARGUMENT);
  CHECK(gradops_supports(op, GRADOPS_DEVICE_CPU, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  /* Every op runs on the CPU; the answer for CUDA is whatever the build has (asked, not assumed). */
  for (int32_t i = 0; i < gradops_op_count(); ++i) {
    CHECK(gradops_supports(i, GRADOPS_DEVICE_CPU, NULL, 0, &yes) == GRADOPS_OK && yes == 1);
    CHECK(gradops_supports(i, GRADOPS_DEVICE_CUDA, NULL, 0, &yes) == GRADOPS_OK && (yes == 0 || yes == 1));
  }
  gradops_op_info info;
  CHECK(gradops_op_get_info(op, &info) == GRADOPS_OK && strcmp(info.origin, "onnxruntime") == 0);
}

/* The BatchNorm split by name: gradops' own operators, origin "gradops". BatchNormStatsReduce's sums
 * [S(x - K), S((x - K)^2), count] are exact for these values; BatchNormStatsApply on them gives
 * mean 2 and biased variance 1 (x = 1, 3), and its sums' shape comes from the shape rule. */
static void test_batch_norm_split(void) {
  float x[2] = {1.0f, 3.0f}, k[1] = {0.5f}, scale[1] = {2.0f}, bias[1] = {0.25f}, var[1] = {1.0f};
  double sums[3] = {NAN, NAN, NAN};
  float y[2] = {NAN, NAN}, saved_mean[1] = {NAN}, saved_istd[1] = {NAN};
  const int64_t xs[2] = {2, 1}, cs[1] = {1}, ss[1] = {3};
  gradops_tensor tx = tensor(x, GRADOPS_DTYPE_F32, 2, xs), tk = tensor(k, GRADOPS_DTYPE_F32, 1, cs),
                 tsums = tensor(sums, GRADOPS_DTYPE_F64, 1, ss);
  const gradops_tensor* rin[2] = {&tx, &tk};
  const gradops_tensor* rout[1] = {&tsums};
  CHECK(gradops_run("BatchNormStatsReduce", rin, 2, rout, 1, NULL, 0, NULL) == GRADOPS_OK);
  CHECK(sums[0] == 3.0 && sums[1] == 0.25 + 6.25 && sums[2] == 2.0);

  gradops_tensor tscale = tensor(scale, GRADOPS_DTYPE_F32, 1, cs), tb = tensor(bias, GRADOPS_DTYPE_F32, 1, cs),
                 tvar = tensor(var, GRADOPS_DTYPE_F32, 1, cs), ty = tensor(y, GRADOPS_DTYPE_F32, 2, xs),
                 tsm = tensor(saved_mean, GRADOPS_DTYPE_F32, 1, cs), tsi = tensor(saved_istd, GRADOPS_DTYPE_F32, 1, cs);
  const gradops_tensor* ain[6] = {&tx, &tscale, &tb, &tk, &tvar, &tsums};
  const gradops_tensor* aout[5] = {&ty, NULL, NULL, &tsm, &tsi};
  const gradops_attribute eps = {"epsilon", 0};
  CHECK(gradops_run("BatchNormStatsApply", ain, 6, aout, 5, &eps, 1, NULL) == GRADOPS_OK);
  CHECK(saved_mean[0] == 2.0f && saved_istd[0] == 1.0f && y[0] == -1.75f && y[1] == 2.25f);

  /* A sums tensor of the wrong length: named, with what was expected; nothing written. */
  const int64_t bad[1] = {2};
  gradops_tensor tbad = tensor(sums, GRADOPS_DTYPE_F64, 1, bad);
  const gradops_tensor* bin[6] = {&tx, &tscale, &tb, &tk, &tvar, &tbad};
  y[0] = 7.0f;
  CHECK(gradops_run("BatchNormStatsApply", bin, 6, aout, 5, NULL, 0, NULL) == GRADOPS_INVALID_ARGUMENT);
  CHECK(contains(gradops_last_error(), "BatchNormStatsApply") && contains(gradops_last_error(), "'sums'") &&
        contains(gradops_last_error(), "expected [3]"));
  CHECK(y[0] == 7.0f);

  int64_t dims[GRADOPS_MAX_ARGS][GRADOPS_MAX_RANK];
  int32_t ranks[GRADOPS_MAX_ARGS], dtypes[GRADOPS_MAX_ARGS];
  CHECK(gradops_infer_output_shapes("BatchNormGradReduce", (const gradops_tensor* const[]){&tx, &tx, &tk, &tk}, 4,
                                    NULL, 0, &dims[0][0], ranks, dtypes, GRADOPS_MAX_ARGS) == GRADOPS_OK);
  CHECK(ranks[0] == 1 && dims[0][0] == 3 && dtypes[0] == GRADOPS_DTYPE_F64);

  gradops_op_info info;
  const int32_t op = gradops_op_find("BatchNormGradApply");
  CHECK(op >= 0 && gradops_op_get_info(op, &info) == GRADOPS_OK);
  CHECK(strcmp(info.origin, "gradops") == 0 && strcmp(info.domain, "gradops") == 0 && info.num_inputs == 6 &&
        info.num_type_vars == 4 && info.gradient == 0);
  int32_t sig[GRADOPS_MAX_TYPE_VARS];
  CHECK(gradops_op_get_signature(op, 0, sig) == GRADOPS_OK && sig[3] == GRADOPS_DTYPE_F64);
}

int main(void) {
  test_relu_grad();
  test_sigmoid_grad();
  test_attributes();
  test_errors();
  test_status_strings();
  test_allocator();
  test_implementation_name();
  test_introspection();
  test_infer_output_shapes();
  test_supports();
  test_batch_norm_split();
#if !defined(__STDC_NO_THREADS__)
  test_thread_local_error();
#endif
  if (g_failures) {
    fprintf(stderr, "c_api_test: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
