/* A vendor's convolution library, as a TVM FFI packed function (see examples/conv_relu_extern.py).
 *
 * vendor_conv2d_relu(data[N,C,H,W], weight[K,C,R,S], stride, pad, out[N,K,P,Q]):
 *   out = max(conv2d(data, weight, stride, pad), 0), float32, NCHW / OIHW, compact.
 * The kernel checks everything it is given and raises a TVM error instead of reading out of
 * bounds.
 */
#include <tirbyoc_ffi.h>  /* tirbyoc's helpers over TVM's <tvm/ffi/c_api.h> */

static int f32_4d(const DLTensor* t) {
  return t && t->ndim == 4 && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
         t->dtype.lanes == 1 && tirbyoc_compact(t) && t->device.device_type == kDLCPU;
}

int __tvm_ffi_vendor_conv2d_relu(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  if (n != 5) return tirbyoc_fail("TypeError", "vendor_conv2d_relu: expects (data, weight, stride, pad, out)");
  DLTensor *x = tirbyoc_tensor_arg(&args[0]), *w = tirbyoc_tensor_arg(&args[1]), *y = tirbyoc_tensor_arg(&args[4]);
  if (!f32_4d(x) || !f32_4d(w) || !f32_4d(y))
    return tirbyoc_fail("ValueError", "vendor_conv2d_relu: data, weight and out must be compact 4-d float32 CPU tensors");
  if (args[2].type_index != kTVMFFIInt || args[3].type_index != kTVMFFIInt)
    return tirbyoc_fail("ValueError", "vendor_conv2d_relu: stride and pad must be integers");
  int64_t stride = args[2].v_int64, pad = args[3].v_int64;
  int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  int64_t K = w->shape[0], R = w->shape[2], S = w->shape[3];
  if (stride < 1 || pad < 0 || w->shape[1] != C) return tirbyoc_fail("ValueError", "vendor_conv2d_relu: bad stride, pad or channels");
  int64_t P = (H + 2 * pad - R) / stride + 1, Q = (W + 2 * pad - S) / stride + 1;
  if (y->shape[0] != N || y->shape[1] != K || y->shape[2] != P || y->shape[3] != Q)
    return tirbyoc_fail("ValueError", "vendor_conv2d_relu: out has the wrong shape");
  const float* xd = (const float*)tirbyoc_data(x);
  const float* wd = (const float*)tirbyoc_data(w);
  float* yd = (float*)tirbyoc_data(y);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          float acc = 0.0f;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t r = 0; r < R; ++r) {
              int64_t h = p * stride - pad + r;
              if (h < 0 || h >= H) continue;
              for (int64_t s = 0; s < S; ++s) {
                int64_t v = q * stride - pad + s;
                if (v < 0 || v >= W) continue;
                acc += xd[((b * C + c) * H + h) * W + v] * wd[((k * C + c) * R + r) * S + s];
              }
            }
          yd[((b * K + k) * P + p) * Q + q] = acc > 0.0f ? acc : 0.0f;
        }
  return tirbyoc_return_none(rv);
}
