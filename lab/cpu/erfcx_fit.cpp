// The erfcx fits of the GELU kernels (src/cpu/activation.cpp, src/cuda/activation_kernels.cuh):
// (1 + 2t) erfcx(t) - 1 as a polynomial P in u = (t - K)/(t + K), interpolated at N Chebyshev
// nodes in long double (erfcx from exp(t^2) erfc(t) below t = 25, its asymptotic series above),
// truncated to degree D and converted to monomial coefficients; then h = (1 + P(u))/(1 + 2t)
// evaluated in double as the kernels do, against the long double erfcx on [0, 3e4]. Prints the
// worst relative error and, with a third argument, the coefficients (lowest first).
//
//   g++ -O2 lab/cpu/erfcx_fit.cpp -o /tmp/erfcx_fit && /tmp/erfcx_fit 3 24 print
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
typedef long double LD;
const LD PI = 3.141592653589793238462643383279502884L;
LD erfcx_ld(LD t) {
  if (t < 25) return std::exp(t * t) * std::erfc(t);
  LD s = 1, term = 1, x = 1 / (2 * t * t);
  for (int n = 1; n < 60; ++n) { term *= -(2 * n - 1) * x; s += term; if (std::fabs(term) < 1e-40L) break; }
  return s / (t * std::sqrt(PI));
}
LD f(LD u, LD K) { if (u >= 1) return 2 / std::sqrt(PI) - 1; LD t = K * (1 + u) / (1 - u); return (1 + 2 * t) * erfcx_ld(t) - 1; }
int main(int argc, char** argv) {
  const LD K = std::atof(argv[1]); const int D = std::atoi(argv[2]); const int N = 200;
  std::vector<LD> c(D + 1, 0);
  for (int j = 0; j <= D; ++j) {
    LD s = 0;
    for (int i = 0; i < N; ++i) { LD th = PI * (i + 0.5L) / N; s += f(std::cos(th), K) * std::cos(j * th); }
    c[j] = 2 * s / N;
  }
  c[0] /= 2;
  // Chebyshev -> monomial (long double)
  std::vector<std::vector<LD>> T(D + 1, std::vector<LD>(D + 1, 0));
  T[0][0] = 1; if (D >= 1) T[1][1] = 1;
  for (int k = 2; k <= D; ++k) for (int m = 0; m <= k; ++m) T[k][m] = (m ? 2 * T[k-1][m-1] : 0) - T[k-2][m];
  std::vector<double> a(D + 1);
  for (int m = 0; m <= D; ++m) { LD s = 0; for (int k = 0; k <= D; ++k) s += c[k] * T[k][m]; a[m] = (double)s; }
  // check in double: h = (1 + P(u)) / (1 + 2t) against erfcx
  double worst = 0, wt = 0;
  for (int i = 0; i <= 400000; ++i) {
    double t = (i < 200000) ? 30.0 * i / 200000 : 30.0 * std::pow(1000.0, (i - 200000) / 200000.0);
    double q = t + (double)K, den = std::fma(2.0, t, 1.0);
    double r = 1.0 / (q * den);
    double u = (t - (double)K) * den * r, inv_den = q * r;
    double p = a[D]; for (int k = D - 1; k >= 0; --k) p = std::fma(p, u, a[k]);
    double h = std::fma(p, inv_den, inv_den);
    LD ref = erfcx_ld(t);
    double e = std::fabs((LD)h - ref) / ref;
    if (e > worst) { worst = e; wt = t; }
  }
  std::printf("K=%g D=%d worst rel %.3g at t=%g; max|a|=", (double)K, D, worst, wt);
  double mx = 0; for (double v : a) mx = std::fmax(mx, std::fabs(v)); std::printf("%.3g  tail c[D]=%.3Lg\n", mx, c[D]);
  if (argc > 3) for (int m = 0; m <= D; ++m) std::printf("%.17g,\n", a[m]);
}
