/* The library's own cost per call through the C ABI: gradops_run on 2x8 f32 tensors (the kernel's
 * work is a few nanoseconds), timed in this thread's CPU time, after each op's output is checked
 * against a float64 formula. lab/cpu/NOTES.md, section 13.
 *
 *   cmake --preset bench && cmake --build build/bench --target gradops
 *   gcc -O2 -c lab/cpu/call_overhead.c -Iinclude -o /tmp/call_overhead.o
 *   g++ /tmp/call_overhead.o build/bench/libgradops.a -lhwy -lsleef -fopenmp -lm -o /tmp/call_overhead
 *   /tmp/call_overhead [CALLS]
 */
#include <gradops/gradops.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROWS = 2, COLS = 8, N = ROWS * COLS };
static float x[N], scale[COLS], bias[COLS], y[N], mean[ROWS], inv_std[ROWS];
static int64_t shape2[2] = {ROWS, COLS}, shape1[1] = {COLS}, shape_stat[2] = {ROWS, 1};

static gradops_tensor view(float* data, int rank, const int64_t* shape) {
  gradops_tensor t = {data, {GRADOPS_DEVICE_CPU, 0}, rank, GRADOPS_DTYPE_F32, shape, NULL};
  return t;
}

static gradops_status call(const char* op) {
  const gradops_context ctx = {1, NULL, NULL};
  gradops_tensor tx = view(x, 2, shape2), ts = view(scale, 1, shape1), tb = view(bias, 1, shape1);
  gradops_tensor ty = view(y, 2, shape2), tm = view(mean, 2, shape_stat), tr = view(inv_std, 2, shape_stat);
  if (!strcmp(op, "LayerNormalization")) {
    const gradops_tensor* in[3] = {&tx, &ts, &tb};
    const gradops_tensor* out[3] = {&ty, &tm, &tr};
    return gradops_run(op, in, 3, out, 3, NULL, 0, &ctx);
  }
  const gradops_tensor* in[1] = {&tx};
  const gradops_tensor* out[1] = {&ty};
  return gradops_run(op, in, 1, out, 1, NULL, 0, &ctx);
}

/* The largest absolute difference from float64 formulas. */
static double check(const char* op) {
  double worst = 0;
  for (int r = 0; r < ROWS; ++r) {
    double m = 0, v = 0, mx = -INFINITY, z = 0;
    for (int c = 0; c < COLS; ++c) m += x[r * COLS + c] / COLS, mx = fmax(mx, x[r * COLS + c]);
    for (int c = 0; c < COLS; ++c) v += pow(x[r * COLS + c] - m, 2) / COLS, z += exp(x[r * COLS + c] - mx);
    for (int c = 0; c < COLS; ++c) {
      const double xv = x[r * COLS + c];
      double want;
      if (!strcmp(op, "Gelu")) want = 0.5 * xv * erfc(-xv / sqrt(2.0));
      else if (!strcmp(op, "Softmax_13")) want = exp(xv - mx) / z;
      else want = (xv - m) / sqrt(v + 1e-5) * scale[c] + bias[c];
      worst = fmax(worst, fabs(want - y[r * COLS + c]));
    }
  }
  return worst;
}

int main(int argc, char** argv) {
  const long calls = argc > 1 ? atol(argv[1]) : 2000000;
  for (int i = 0; i < N; ++i) x[i] = 0.37f * (float)(i % 7) - 1.1f;
  for (int c = 0; c < COLS; ++c) scale[c] = 1.0f + 0.1f * c, bias[c] = 0.05f * c;
  const char* ops[] = {"Gelu", "Softmax_13", "LayerNormalization"};
  for (int k = 0; k < 3; ++k) {
    memset(y, 0xff, sizeof y); /* NaN: an output the call did not write fails the check */
    if (call(ops[k]) != GRADOPS_OK) return fprintf(stderr, "%s: %s\n", ops[k], gradops_last_error()), 1;
    const double err = check(ops[k]);
    if (!(err < 1e-5)) return fprintf(stderr, "%s: off by %g from float64\n", ops[k], err), 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long i = 0; i < calls; ++i) call(ops[k]);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)calls;
    printf("%-20s checked (max error %.1e), %7.1f ns a call\n", ops[k], err, ns);
  }
  return 0;
}
