// out[n, b] = sum_k w[n, k] * x[b, k]: a large weight times a few rows, for XLA:CPU.
//
// A decode step's products have this shape (a weight of thousands of rows, a batch of 16-64 rows), and
// XLA:CPU's library kernels run them at about half the machine's FLOP rate (docs/performance.md).
// Each thread takes chunks of weight rows; a tile of 6 rows is multiplied against 16 batch columns
// held in registers, the weight is read in place (no packing copy), and the rows a few tiles ahead
// are prefetched so that the cores do not wait on memory.
// Built by cpu_kernels.py with the host's compiler for the host's CPU (-march=native).

#include <cstring>
#include <vector>

#include "common.h"

namespace spiral {
namespace {

constexpr int kRows = 6;  // weight rows per tile: 6 x 2 vector accumulators, of AVX2's 16 registers
constexpr int kPrefetchTiles = 4;  // how many tiles ahead the weight rows are prefetched (into L2)
constexpr int kFloatsPerLine = 16;
constexpr int64_t kBlockK = 128;  // contraction block: 128 x 32 floats of x, 16 KB

// acc[r][j] = sum over k < kc of w[r * ldw + k] * xt[k * ldx + 8j : 8j + 8]; lane i of it is added to
// (or, for the first block of k, stored in) out[r * ldo + 8j + i], for the first `rows` rows and `cols`
// columns. The R * NV accumulators stay in registers. xt is x transposed, [K, ldx], zero-padded past
// the batch (by the caller, where XLA fuses it into the op that makes x).
template <int R, int NV>
void Tile(const float* w, int64_t ldw, int64_t kc, const float* xt, int64_t ldx, const float* prefetch,
          float* out, int64_t ldo, int rows, int cols, bool accumulate) {
  Vec acc[R][NV] = {};
  for (int64_t k = 0; k < kc; ++k) {
    Vec x[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) x[j] = Load(xt + k * ldx + j * kLanes);
    if (prefetch != nullptr && k % kFloatsPerLine == 0) {
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) __builtin_prefetch(prefetch + r * ldw + k, 0, 2);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float wk = w[r * ldw + k];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] += wk * x[j];
    }
  }
  // Results go out through Vec pointers: taking acc's address would keep it in memory, not registers.
  if (rows == R && cols == NV * kLanes) {
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < NV; ++j) {
        Vec* o = reinterpret_cast<Vec*>(out + r * ldo + j * kLanes);
        *o = accumulate ? *o + acc[r][j] : acc[r][j];
      }
    }
    return;
  }
  float tile[R][NV * kLanes];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) *reinterpret_cast<Vec*>(&tile[r][j * kLanes]) = acc[r][j];
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[r * ldo + c] = (accumulate ? out[r * ldo + c] : 0.0f) + tile[r][c];
}

// Rows [n0, n1) of out, every column, in blocks of kBlockK of the contraction: a block of x stays
// in the first-level cache while every tile of kRows weight rows meets it, for each column group (16
// columns, and a last 8) while the tile is in cache too.
void RowRange(const float* w, int64_t N, int64_t K, const float* xt, int64_t ldx, int64_t B, float* out,
              int64_t n0, int64_t n1) {
  std::vector<float> pad;
  for (int64_t k = 0; k < K; k += kBlockK) {
    const int64_t kc = std::min<int64_t>(kBlockK, K - k);
    for (int64_t n = n0; n < n1; n += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, n1 - n));
      const float* tile_w = w + n * K;
      if (rows < kRows) {  // the matrix's last tile: padded with zero rows
        pad.assign(kRows * K, 0.0f);
        std::memcpy(pad.data(), tile_w, rows * K * sizeof(float));
        tile_w = pad.data();
      }
      const int64_t ahead = n + kRows * kPrefetchTiles;
      const float* prefetch = ahead + kRows <= N ? w + ahead * K + k : nullptr;
      for (int64_t c = 0; c < ldx; c += 2 * kLanes) {
        // Only the first column group streams the weight in from memory; the rest find it in cache.
        const float* next = c == 0 ? prefetch : nullptr;
        const int cols = static_cast<int>(std::min<int64_t>(2 * kLanes, B - c));
        auto tile = ldx - c >= 2 * kLanes ? Tile<kRows, 2> : Tile<kRows, 1>;
        tile(tile_w + k, K, kc, xt + k * ldx + c, ldx, next, out + n * B + c, B, rows, cols, k > 0);
      }
    }
  }
}

ffi::Error WeightMajorMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> xt,
                             ffi::ResultBuffer<ffi::F32> out) {
  const auto wd = w.dimensions(), xd = xt.dimensions(), od = out->dimensions();
  if (wd.size() != 2 || xd.size() != 2 || od.size() != 2 || wd[1] != xd[0] || od[0] != wd[0] ||
      xd[1] % kLanes != 0 || od[1] > xd[1])
    return ffi::Error::InvalidArgument(
        "weight_major_matmul: expected w [N, K], xt [K, L] with L a multiple of 8, out [N, B <= L]");
  const int64_t N = wd[0], K = wd[1], ldx = xd[1], B = od[1];
  // Chunks of at most 16 tiles, and at least 4 per thread where the weight has that many tiles, so
  // that a thread that starts late or runs slow leaves little for the others to wait on.
  const int64_t tiles = (N + kRows - 1) / kRows;
  const int64_t threads = std::max<int64_t>(pool.num_threads(), 1);
  const int64_t chunk_rows = kRows * std::clamp<int64_t>(tiles / (4 * threads), 1, 16);
  const float* wp = w.typed_data();
  const float* xp = xt.typed_data();
  float* op = out->typed_data();
  ParallelFor(pool, N, chunk_rows,
              [=](int64_t n0, int64_t n1) { RowRange(wp, N, K, xp, ldx, B, op, n0, n1); });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace spiral

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpiralWeightMajorMatmul, spiral::WeightMajorMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
