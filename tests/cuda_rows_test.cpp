// Every CUDA implementation row names the kernel that runs: for each row, calls that the row
// takes (each kernel choice of each family, LayerNorm's in both directions, BatchNorm's in both
// layouts), whose implementation_name is that row, whose GRADOPS_VERBOSE=dispatch log says that
// row's run() ran (and it launches only its own kernel), and whose outputs match the float64
// oracle. Reports SKIPPED where no GPU is visible.
#include <cstdlib>
#include <set>
#include <sstream>
#include <string_view>

#include "cuda_support.hpp"

namespace gradops::check {
namespace {

// gradops reads GRADOPS_VERBOSE once, at its first call: this executable turns the dispatch log on
// before any.
const bool kDispatchLogOn = [] { return setenv("GRADOPS_VERBOSE", "dispatch", 1) == 0; }();

// The row that the dispatch log says ran: the last "gradops: dispatch <op>: <row> runs".
std::string row_that_ran(const std::string& log, std::string_view op) {
  const std::string prefix = "gradops: dispatch " + std::string(op) + ": ";
  constexpr std::string_view kRuns = " runs";
  std::string ran;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(prefix) && line.ends_with(kRuns))
      ran = line.substr(prefix.size(), line.size() - prefix.size() - kRuns.size());
  return ran;
}

// Runs call(&named), which checks its outputs against the oracle and sets named to the call's
// implementation_name, with stderr captured; then expects `row` to be that name and the row that
// the dispatch log says ran.
template <class F>
void expect_row_runs(const char* row, OpId id, DType t, F&& call) {
  const std::string_view op = op_schema(id).name;
  std::string named;
  testing::internal::CaptureStderr();
  call(&named);
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_FALSE(testing::Test::HasFatalFailure()) << op << " (" << dtype_name(t) << ") for " << row << "\n" << log;
  EXPECT_EQ(named, row) << op << " (" << dtype_name(t) << "): implementation_name\n" << log;
  EXPECT_EQ(row_that_ran(log, op), row) << op << " (" << dtype_name(t) << "): the dispatch log\n" << log;
}

struct RowCase {
  const char* row;
  OpId op;
  DType t;
  std::vector<int64_t> shape;
  int64_t axis;
  std::vector<int> offsets;        // elements past a 256-byte boundary, per tensor, cycled
  std::vector<bool> skip_output;   // {false, true}: no dB
};

// Every CUDA row of the activation, softmax and LayerNorm families, in the order the op layer tries
// them (softmax and LayerNorm share the names block_per_row and cluster_per_row).
const char* const kRows[] = {
    "cuda:flat_bias_vec16", "cuda:bias_row_vec16", "cuda:bias_2d_vec16", "cuda:flat_vec16",
    "cuda:bias_2d_scalar",  "cuda:flat_scalar",    "cuda:warp_per_row",  "cuda:block_per_row",
    "cuda:cluster_per_row", "cuda:two_pass",       "cuda:strided_held",  "cuda:strided",
    "cuda:rows_per_warp",   "cuda:general",
};

TEST_F(Cuda, EveryRowNamesTheKernelThatRuns) {
  ASSERT_TRUE(kDispatchLogOn);
  const std::vector<bool> no_db = {false, true};
  const RowCase cases[] = {
      // Bias gradients without dB, rows of whole packs from a 16-byte boundary.
      {"cuda:flat_bias_vec16", OpId::BiasGeluGrad_dX, DType::f32, {64, 256}, 0, {0}, no_db},
      {"cuda:flat_bias_vec16", OpId::BiasFastGeluGrad_dX, DType::bf16, {64, 256}, 0, {0}, no_db},
      // 16-bit bias gradients with dB on such rows.
      {"cuda:bias_row_vec16", OpId::BiasGeluGrad_dX, DType::bf16, {64, 256}, 0, {0}, {}},
      {"cuda:bias_row_vec16", OpId::BiasFastGeluGrad_dX, DType::f16, {64, 256}, 0, {0}, {}},
      // The other bias calls in packs: f32 with dB, f64, rows off the boundary, the forwards.
      {"cuda:bias_2d_vec16", OpId::BiasGeluGrad_dX, DType::f32, {64, 256}, 0, {0}, {}},
      {"cuda:bias_2d_vec16", OpId::BiasGeluGrad_dX, DType::f64, {64, 256}, 0, {0}, no_db},
      {"cuda:bias_2d_vec16", OpId::BiasFastGeluGrad_dX, DType::bf16, {64, 256}, 0, {1}, no_db},
      {"cuda:bias_2d_vec16", OpId::BiasFastGeluGrad_dX, DType::bf16, {64, 256}, 0, {1}, {}},
      {"cuda:bias_2d_vec16", OpId::BiasGelu, DType::f32, {64, 256}, 0, {0}, {}},
      // No bias, the tensors at one offset from a 16-byte boundary.
      {"cuda:flat_vec16", OpId::GeluGrad, DType::f32, {1000}, 0, {0}, {}},
      {"cuda:flat_vec16", OpId::SigmoidGrad, DType::f16, {37, 129}, 0, {3}, {}},
      // One element per access: rows not of whole packs, or tensors at unrelated offsets.
      {"cuda:bias_2d_scalar", OpId::BiasGeluGrad_dX, DType::f32, {64, 257}, 0, {0}, {}},
      {"cuda:bias_2d_scalar", OpId::BiasGelu, DType::f16, {37, 129}, 0, {1, 2, 0}, {}},
      {"cuda:flat_scalar", OpId::GeluGrad, DType::f32, {37, 129}, 0, {1, 2, 0}, {}},
      // Softmax rows by length.
      {"cuda:warp_per_row", OpId::SoftmaxGrad_13, DType::f32, {64, 128}, -1, {0}, {}},
      {"cuda:warp_per_row", OpId::LogSoftmax_13, DType::bf16, {33, 77}, -1, {1, 2, 0}, {}},
      {"cuda:block_per_row", OpId::SoftmaxGrad_13, DType::f32, {9, 1025}, -1, {0}, {}},
      {"cuda:block_per_row", OpId::Softmax_13, DType::f16, {7, 300}, -1, {1, 2, 0}, {}},
      {"cuda:cluster_per_row", OpId::SoftmaxGrad_13, DType::f32, {2, 32768}, -1, {0}, {}},
      {"cuda:cluster_per_row", OpId::Softmax_13, DType::bf16, {2, 65536}, -1, {1}, {}},
      {"cuda:two_pass", OpId::SoftmaxGrad_13, DType::f32, {1, 262144}, -1, {0}, {}},
      // f64 at 2 packs a thread in the gradients and 4 in the forwards: 2,048 and 4,096 elements a
      // block; two passes past 16,384 (gradients, Softmax) and 4,096 (LogSoftmax), where they were
      // measured faster.
      {"cuda:block_per_row", OpId::SoftmaxGrad_13, DType::f64, {2, 2048}, -1, {0}, {}},
      {"cuda:cluster_per_row", OpId::LogSoftmaxGrad_13, DType::f64, {2, 16384}, -1, {0}, {}},
      {"cuda:two_pass", OpId::LogSoftmaxGrad_13, DType::f64, {2, 16386}, -1, {0}, {}},
      {"cuda:block_per_row", OpId::Softmax_13, DType::f64, {2, 4096}, -1, {0}, {}},
      {"cuda:cluster_per_row", OpId::Softmax_13, DType::f64, {2, 4098}, -1, {0}, {}},
      {"cuda:two_pass", OpId::Softmax_13, DType::f64, {2, 16386}, -1, {0}, {}},
      {"cuda:two_pass", OpId::LogSoftmax_13, DType::f64, {2, 4098}, -1, {0}, {}},
      {"cuda:two_pass", OpId::LogSoftmaxGrad_13, DType::f32, {3, 5000}, -1, {1, 2, 0}, {}},
      // Other axes: held in registers by one block or a cluster of up to 16, else walked in passes
      // (f32 gradients in 16-byte packs at inner 32: tiles down to 2 packs wide, so 128 lanes of 8
      // packs a block and an axis past 16384 too long; one 2-byte element a thread on misaligned
      // tensors: 36 lanes of 16, past 9216).
      {"cuda:strided_held", OpId::SoftmaxGrad_13, DType::f32, {31, 33}, 0, {0}, {}},
      {"cuda:strided_held", OpId::LogSoftmax_13, DType::f16, {30, 50, 7}, 1, {1, 2, 0}, {}},
      {"cuda:strided_held", OpId::SoftmaxGrad_13, DType::f32, {2, 2048, 32}, 1, {0}, {}},
      // Forwards held by clusters too: 8 blocks here, and 16 of 64-byte tiles for bf16 at inner 64.
      {"cuda:strided_held", OpId::Softmax_13, DType::f32, {2, 2048, 32}, 1, {0}, {}},
      {"cuda:strided_held", OpId::LogSoftmax_13, DType::bf16, {2, 8192, 64}, 1, {0}, {}},
      // f64 at 8 packs a thread too: one block for a folded inner of 3, 16 blocks at inner 2 (read
      // twice at 4 packs), and past 16 x 256 x 8 = 32768 rows read twice.
      {"cuda:strided_held", OpId::LogSoftmaxGrad_13, DType::f64, {5, 1000, 3}, 1, {0}, {}},
      {"cuda:strided_held", OpId::SoftmaxGrad_13, DType::f64, {2, 32768, 2}, 1, {0}, {}},
      {"cuda:strided_held", OpId::Softmax_13, DType::f64, {2, 32768, 2}, 1, {0}, {}},
      {"cuda:strided_held", OpId::LogSoftmax_13, DType::f64, {2, 32768, 2}, 1, {0}, {}},
      {"cuda:strided", OpId::LogSoftmax_13, DType::f64, {2, 32770, 2}, 1, {0}, {}},
      {"cuda:strided", OpId::SoftmaxGrad_13, DType::f32, {2, 16385, 32}, 1, {0}, {}},
      {"cuda:strided", OpId::LogSoftmax_13, DType::f16, {2, 10000, 7}, 1, {1, 2, 0}, {}},
      // LayerNorm, the gradients and the forwards (each direction its own kernels), by row length:
      // rows held by lanes of a warp, by a block, by a cluster of up to 16 (the forwards hold 8
      // packs a thread where the gradients hold 4, so 16384 columns are a block's for them), else
      // the general kernel (rows not of whole 16-byte packs, or too long for a cluster).
      {"cuda:rows_per_warp", OpId::LayerNormalizationGrad, DType::f32, {64, 128}, 1, {0}, {}},
      {"cuda:rows_per_warp", OpId::LayerNormalization, DType::f32, {64, 128}, 1, {0}, {}},
      {"cuda:block_per_row", OpId::SimplifiedLayerNormalizationGrad, DType::f32, {64, 768}, 1, {0}, {}},
      {"cuda:block_per_row", OpId::SimplifiedLayerNormalization, DType::f64, {64, 768}, 1, {0}, {}},
      {"cuda:block_per_row", OpId::LayerNormalization, DType::f32, {4, 16384}, 1, {0}, {}},
      {"cuda:cluster_per_row", OpId::InvertibleLayerNormalizationGrad, DType::f32, {4, 16384}, 1, {0}, {}},
      {"cuda:cluster_per_row", OpId::LayerNormalizationGrad, DType::f32, {2, 65536}, 1, {0}, {}},
      {"cuda:cluster_per_row", OpId::LayerNormalization, DType::f32, {1, 131072}, 1, {0}, {}},
      // Clusters of 16 (non-portable): 131,072 f32 gradients, 65,536 f64, 262,144 f32 forwards.
      {"cuda:cluster_per_row", OpId::LayerNormalizationGrad, DType::f32, {1, 131072}, 1, {0}, {}},
      {"cuda:cluster_per_row", OpId::InvertibleLayerNormalizationGrad, DType::f64, {2, 65536}, 1, {0}, {}},
      {"cuda:cluster_per_row", OpId::SimplifiedLayerNormalization, DType::f32, {1, 262144}, 1, {0}, {}},
      {"cuda:general", OpId::LayerNormalizationGrad, DType::f32, {1, 262144}, 1, {0}, {}},
      {"cuda:general", OpId::SimplifiedLayerNormalizationGrad, DType::f64, {2, 65538}, 1, {0}, {}},
      {"cuda:general", OpId::SimplifiedLayerNormalizationGrad, DType::f32, {64, 541}, 1, {0}, {}},
      {"cuda:general", OpId::LayerNormalization, DType::f32, {64, 768}, 1, {1, 2, 0}, {}},
      {"cuda:general", OpId::SimplifiedLayerNormalization, DType::f32, {1, 524288}, 1, {0}, {}},
  };
  std::set<std::string> covered;
  for (const RowCase& c : cases) {
    expect_row_runs(c.row, c.op, c.t, [&](std::string* named) {
      check_offsets(c.op, c.t, c.shape, c.axis, {}, named, c.offsets, c.skip_output);
    });
    ASSERT_FALSE(HasFatalFailure());
    covered.insert(c.row);
  }
  for (const char* row : kRows) EXPECT_EQ(covered.count(row), 1u) << row << " has no case here";
}

// BatchNorm: runs along NCHW's spatial axis in 16-byte packs, 8-byte packs or single elements,
// and NHWC's channel columns in 16-byte packs or single elements; both fused ops.
TEST_F(Cuda, EveryBatchNormRowNamesTheKernelThatRuns) {
  ASSERT_TRUE(kDispatchLogOn);
  struct BnCase {
    const char* row;
    DType t;
    std::vector<int64_t> shape;
    bool channels_last;
  };
  const BnCase cases[] = {
      {"cuda:runs_vec16", DType::f32, {2, 16, 8, 8}, false}, {"cuda:runs_vec8", DType::bf16, {2, 16, 14, 14}, false},
      {"cuda:runs", DType::f32, {2, 16, 7, 7}, false},       {"cuda:columns_vec16", DType::f32, {2, 8, 8, 16}, true},
      {"cuda:columns", DType::f32, {2, 8, 8, 15}, true},
  };
  std::set<std::string> covered;
  for (OpId id : {OpId::BatchNormalizationGrad, OpId::BatchNormInternal})
    for (const BnCase& c : cases) {
      Problem p;
      p.op = id;
      p.sig = {{c.t, c.t, DType::f32}};
      p.shape = c.shape;
      p.attrs = {{"channels_last", c.channels_last ? 1.0 : 0.0}};
      p.device = Device::cuda();
      expect_row_runs(c.row, id, c.t, [&](std::string* named) {
        Case k(p);
        ASSERT_TRUE(k.implementation(named).is_ok());
        k.poison_outputs();
        const Status s = k.run();
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        const Report r = k.compare();
        EXPECT_TRUE(r.pass) << c.row << ": " << r.detail;
      });
      ASSERT_FALSE(HasFatalFailure());
      covered.insert(c.row);
    }
  EXPECT_EQ(covered.size(), std::size(cases));
}

}  // namespace
}  // namespace gradops::check
