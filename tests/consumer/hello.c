/* A C consumer of the installed package, built with the link line of docs/c_api.md: ReluGrad on
 * five values, checked exactly, then the error path. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <gradops/gradops.h>

static gradops_tensor f32_tensor(void* data, const int64_t* shape) {
  gradops_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.type = GRADOPS_DEVICE_CPU;
  t.rank = 1;
  t.dtype = GRADOPS_DTYPE_F32;
  t.shape = shape;
  return t;
}

int main(void) {
  float dy[5] = {1.5f, -2.0f, 3.0f, 4.25f, 5.0f}, x[5] = {-1.0f, 0.0f, 0.5f, 2.0f, -3.0f};
  float dx[5] = {NAN, NAN, NAN, NAN, NAN};
  const float want[5] = {0.0f, 0.0f, 3.0f, 4.25f, 0.0f};
  const int64_t shape[1] = {5}, short_shape[1] = {4};
  gradops_tensor tdy = f32_tensor(dy, shape), tx = f32_tensor(x, shape), tdx = f32_tensor(dx, shape);
  const gradops_tensor* in[2] = {&tdy, &tx};
  const gradops_tensor* out[1] = {&tdx};
  if (gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) != GRADOPS_OK) {
    fprintf(stderr, "ReluGrad failed: %s\n", gradops_last_error());
    return 1;
  }
  for (int i = 0; i < 5; ++i)
    if (dx[i] != want[i]) {
      fprintf(stderr, "dx[%d] = %g, expected %g\n", i, dx[i], want[i]);
      return 1;
    }
  tx = f32_tensor(x, short_shape);
  if (gradops_run("ReluGrad", in, 2, out, 1, NULL, 0, NULL) != GRADOPS_INVALID_ARGUMENT) {
    fprintf(stderr, "a shape mismatch was not refused\n");
    return 1;
  }
  printf("ReluGrad ok; a bad call says: %s\n", gradops_last_error());
  return 0;
}
