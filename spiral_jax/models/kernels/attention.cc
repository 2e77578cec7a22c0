// One decode step's attention, reading the KV cache in place, for XLA:CPU.
//
// For one query per row, XLA:CPU spends most of the time copying the layer's window out of the
// [layers, batch, kv_heads, slots, head_dim] cache before its batched matmuls. The flops are few (a
// tiny Qwen3 at 32 rows: 4 M a layer), so this kernel reads each row's keys and values where they are,
// once: per (row, KV head), the scores of that head's query group, a softmax, and the weighted sum of
// the values.
// Built by cpu_kernels.py with the host's compiler for the host's CPU (-march=native).

#include <limits>
#include <vector>

#include "common.h"

namespace spiral {
namespace {

// The lanes of a and b numbered I (b's from 8 up): GCC and clang spell it differently (GCC only has
// __builtin_shufflevector from version 12).
template <int... I>
inline Vec Pick(Vec a, Vec b) {
#if defined(__clang__)
  return __builtin_shufflevector(a, b, I...);
#else
  return __builtin_shuffle(a, b, VecI{I...});
#endif
}

// (sum(a[0]), ..., sum(a[7])): eight horizontal sums at once, by adding halves of pairs three times.
inline Vec SumEach(const Vec (&a)[kLanes]) {
  Vec b[4], c[2];
  for (int i = 0; i < 4; ++i) {
    const Vec x = a[2 * i], y = a[2 * i + 1];
    b[i] = Pick<0, 8, 2, 10, 4, 12, 6, 14>(x, y) + Pick<1, 9, 3, 11, 5, 13, 7, 15>(x, y);
  }
  for (int i = 0; i < 2; ++i) {
    const Vec x = b[2 * i], y = b[2 * i + 1];
    c[i] = Pick<0, 1, 8, 9, 4, 5, 12, 13>(x, y) + Pick<2, 3, 10, 11, 6, 7, 14, 15>(x, y);
  }
  return Pick<0, 1, 2, 3, 8, 9, 10, 11>(c[0], c[1]) + Pick<4, 5, 6, 7, 12, 13, 14, 15>(c[0], c[1]);
}

inline float Sum(Vec v) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

inline Vec Max(Vec a, Vec b) { return a > b ? a : b; }

// exp(x) for x <= 0 (the inputs here), within 1.02 ulp over [-87, 0] (measured against double exp):
// 2^n exp(r) with n = round(x / ln 2), |r| <= ln(2) / 2, exp(r) by a degree-7 polynomial (Cephes'
// expf coefficients). Where float exp underflows (x < -87.3, and -inf), 0; a NaN stays NaN.
inline Vec Exp(Vec x) {
  const VecI under = x < -87.3f;
  x = under ? Vec{} - 87.3f : x;
  const Vec n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  Vec r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  Vec p = Vec{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Vec y = p * r * r + r + 1.0f;
  const VecI two_n = (__builtin_convertvector(n, VecI) + 127) << 23;  // 2^n, as float bits
  return (Vec)((VecI)(y * (Vec)two_n) & ~under);
}

struct Shape {
  int64_t rows, slots, window, kv_heads, group, head_dim;
};

// out[j] = sum over s < n of p[s] * v[s * stride + j] / norm, for the C vectors of j at v. Even and odd
// slots go to separate accumulators: one chain of adds per vector would wait on each add's latency.
template <int C>
void WeightedSum(const float* p, const float* v, int64_t stride, int64_t n, float norm, float* out) {
  Vec even[C] = {}, odd[C] = {};
  int64_t s = 0;
  for (; s + 2 <= n; s += 2) {
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) {
      even[j] += p[s] * Load(v + s * stride + j * kLanes);
      odd[j] += p[s + 1] * Load(v + (s + 1) * stride + j * kLanes);
    }
  }
  for (; s < n; ++s)
    for (int j = 0; j < C; ++j) even[j] += p[s] * Load(v + s * stride + j * kLanes);
  for (int j = 0; j < C; ++j) Store(out + j * kLanes, (even[j] + odd[j]) / norm);
}

// Per-thread working memory for AttendOne, per slot of the window rounded up to whole vectors: keep the
// score (all bits set) or replace it with `fill` (masked, or -inf past the window, where it then adds
// nothing to the softmax); the scores of a query group.
struct Scratch {
  explicit Scratch(const Shape& d)
      : padded((d.window + kLanes - 1) / kLanes * kLanes), keep(padded), fill(padded), scores(d.group * padded) {}
  int64_t padded;
  std::vector<int32_t> keep;
  std::vector<float> fill, scores;
};

// Row b, KV head h: out[b, h * group + g] for every g of the group.
void AttendOne(const Shape& d, const float* q, const float* k, const float* v, const bool* allowed,
               float scale, float masked, int64_t b, int64_t h, Scratch& scratch, float* out) {
  const int64_t hd = d.head_dim, nv = hd / kLanes, stride = hd;
  const int64_t padded = scratch.padded;
  const float* kb = k + (b * d.kv_heads + h) * d.slots * hd;  // slot s at kb + s * stride
  const float* vb = v + (b * d.kv_heads + h) * d.slots * hd;
  const float* qb = q + (b * d.kv_heads * d.group + h * d.group) * hd;
  const bool* ab = allowed + b * d.window;
  int32_t* keep = scratch.keep.data();
  float* fill = scratch.fill.data();
  float* scores = scratch.scores.data();
  for (int64_t s = 0; s < padded; ++s) {
    keep[s] = s < d.window && ab[s] ? -1 : 0;
    fill[s] = s < d.window ? masked : -std::numeric_limits<float>::infinity();
  }
  for (int64_t g = 0; g < d.group; ++g) {
    float* sg = scores + g * padded;
    Vec top = Vec{} - std::numeric_limits<float>::infinity();
    for (int64_t s0 = 0; s0 < padded; s0 += kLanes) {
      // Eight slots at a time; lanes past the window read the last slot again, and are filled.
      Vec acc[kLanes] = {};
      const float* rows[kLanes];
      for (int i = 0; i < kLanes; ++i) rows[i] = kb + std::min(s0 + i, d.window - 1) * stride;
      for (int64_t j = 0; j < nv; ++j) {
        const Vec qj = Load(qb + g * hd + j * kLanes);
#pragma GCC unroll 8
        for (int i = 0; i < kLanes; ++i) acc[i] += Load(rows[i] + j * kLanes) * qj;
      }
      const VecI kept = *reinterpret_cast<const VecI*>(keep + s0);
      const Vec sc = (Vec)(((VecI)(SumEach(acc) * scale) & kept) | ((VecI)Load(fill + s0) & ~kept));
      Store(sg + s0, sc);
      top = Max(top, sc);
    }
    float m = top[0];
    for (int i = 1; i < kLanes; ++i) m = std::max(m, top[i]);
    Vec total = {};
    for (int64_t s = 0; s < padded; s += kLanes) {
      const Vec p = Exp(Load(sg + s) - m);
      Store(sg + s, p);
      total += p;
    }
    const float norm = Sum(total);
    float* og = out + (b * d.kv_heads * d.group + h * d.group + g) * hd;
    int64_t j = 0;
    for (; j + 4 <= nv; j += 4) WeightedSum<4>(sg, vb + j * kLanes, stride, d.window, norm, og + j * kLanes);
    for (; j < nv; ++j) WeightedSum<1>(sg, vb + j * kLanes, stride, d.window, norm, og + j * kLanes);
  }
}

// q [B, H, hd]; k, v [layers, B, KV, slots, hd]; layer []; allowed [B, window] -> out [B, H, hd]. The
// first `window` slots of the layer are attended; masked ones score `masked`, as in the model's attention.
ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::PRED> allowed,
                           ffi::ResultBuffer<ffi::F32> out, float scale, float masked) {
  const auto qd = q.dimensions(), kd = k.dimensions(), ad = allowed.dimensions();
  if (qd.size() != 3 || kd.size() != 5 || ad.size() != 2 || !(v.dimensions() == kd) || kd[1] != qd[0] ||
      kd[4] != qd[2] || qd[2] % kLanes != 0 || qd[1] % kd[2] != 0 || ad[0] != qd[0] || ad[1] < 1 || ad[1] > kd[3] ||
      !(out->dimensions() == qd))
    return ffi::Error::InvalidArgument(
        "decode_attention: expected q [B, H, hd], k and v [layers, B, KV, slots, hd], allowed [B, window] "
        "with 1 <= window <= slots, H a multiple of KV and hd of 8");
  const int32_t l = *layer.typed_data();
  if (l < 0 || l >= kd[0]) return ffi::Error::InvalidArgument("decode_attention: layer out of range");
  const Shape d{qd[0], kd[3], ad[1], kd[2], qd[1] / kd[2], qd[2]};
  const int64_t layer_size = d.rows * d.slots * d.kv_heads * d.head_dim;
  const float* kp = k.typed_data() + l * layer_size;
  const float* vp = v.typed_data() + l * layer_size;
  const float* qp = q.typed_data();
  const bool* ap = allowed.typed_data();
  float* op = out->typed_data();
  ParallelFor(pool, d.rows * d.kv_heads, 4, [=](int64_t i0, int64_t i1) {
    Scratch scratch(d);
    for (int64_t i = i0; i < i1; ++i)
      AttendOne(d, qp, kp, vp, ap, scale, masked, i / d.kv_heads, i % d.kv_heads, scratch, op);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace spiral

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpiralDecodeAttention, spiral::DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("masked"));
