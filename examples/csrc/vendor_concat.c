/* A library concatenation, as a TVM FFI packed function (see examples/concat_dispatch.py).
 *
 * vendor_concat(t0, ..., tn-1, axis, out): out = concatenate(t0..tn-1, axis), any dtype of
 * 1, 2, 4 or 8 bytes, compact row-major CPU tensors of equal rank. Checks shapes first.
 */
#include <string.h>
#include <tirbyoc_ffi.h>  /* tirbyoc's helpers over TVM's <tvm/ffi/c_api.h> */

int __tvm_ffi_vendor_concat(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  if (n < 3) return tirbyoc_fail("ValueError", "vendor_concat: expects (inputs..., axis, out)");
  DLTensor* out = tirbyoc_tensor_arg(&args[n - 1]);
  if (args[n - 2].type_index != kTVMFFIInt) return tirbyoc_fail("ValueError", "vendor_concat: axis must be an integer");
  int64_t axis = args[n - 2].v_int64;
  if (!out || !tirbyoc_compact(out) || out->device.device_type != kDLCPU)
    return tirbyoc_fail("ValueError", "vendor_concat: out must be a compact CPU tensor");
  if (axis < 0 || axis >= out->ndim) return tirbyoc_fail("ValueError", "vendor_concat: axis out of range");
  int64_t elem = (out->dtype.bits * out->dtype.lanes + 7) / 8;
  int64_t outer = 1, inner = elem;
  for (int d = 0; d < axis; ++d) outer *= out->shape[d];
  for (int d = axis + 1; d < out->ndim; ++d) inner *= out->shape[d];
  int64_t total = 0;
  for (int i = 0; i < n - 2; ++i) {
    DLTensor* t = tirbyoc_tensor_arg(&args[i]);
    if (!t || !tirbyoc_compact(t) || t->ndim != out->ndim || t->device.device_type != kDLCPU ||
        t->dtype.code != out->dtype.code || t->dtype.bits != out->dtype.bits)
      return tirbyoc_fail("ValueError", "vendor_concat: every input must be a compact CPU tensor of out's rank and dtype");
    for (int d = 0; d < out->ndim; ++d)
      if (d != axis && t->shape[d] != out->shape[d]) return tirbyoc_fail("ValueError", "vendor_concat: shapes differ off the axis");
    total += t->shape[axis];
  }
  if (total != out->shape[axis]) return tirbyoc_fail("ValueError", "vendor_concat: input extents do not add up to out's");
  char* dst = (char*)tirbyoc_data(out);
  int64_t row = out->shape[axis] * inner, offset = 0;
  for (int i = 0; i < n - 2; ++i) {
    DLTensor* t = tirbyoc_tensor_arg(&args[i]);
    const char* src = (const char*)tirbyoc_data(t);
    int64_t chunk = t->shape[axis] * inner;
    for (int64_t o = 0; o < outer; ++o) memcpy(dst + o * row + offset, src + o * chunk, (size_t)chunk);
    offset += chunk;
  }
  return tirbyoc_return_none(rv);
}
