/* tirbyoc_ffi.h: small helpers for library kernels written as TVM FFI packed functions.
 *
 * An ExternLibrary declared with ffi=True is compiled with this header on its include path
 * (beside TVM's <tvm/ffi/c_api.h>). A kernel is
 *   int __tvm_ffi_<name>(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* rv)
 * and reads its tensors with tirbyoc_tensor_arg, checks them with tirbyoc_compact, reports
 * bad arguments with tirbyoc_fail (a Python exception on the caller's side, never a crash),
 * and ends with tirbyoc_return_none(rv).
 */
#ifndef TIRBYOC_FFI_H_
#define TIRBYOC_FFI_H_

#include <stdarg.h>
#include <stdio.h>
#include <tvm/ffi/c_api.h>

/* The DLTensor behind an argument (a TVM Tensor object or a raw DLTensor*), or NULL. */
static inline DLTensor* tirbyoc_tensor_arg(const TVMFFIAny* arg) {
  if (arg->type_index == kTVMFFIDLTensorPtr) return (DLTensor*)arg->v_ptr;
  if (arg->type_index == kTVMFFITensor)
    return (DLTensor*)((char*)arg->v_obj + sizeof(TVMFFIObject));
  return NULL;
}

/* 1 if the tensor is dense row-major (no strides, or strides that say so). */
static inline int tirbyoc_compact(const DLTensor* t) {
  if (t->strides == NULL) return 1;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expect) return 0;
    expect *= t->shape[i];
  }
  return 1;
}

/* The first element, byte offset applied. */
static inline void* tirbyoc_data(const DLTensor* t) { return (char*)t->data + t->byte_offset; }

/* Raise `kind` ("ValueError", "TypeError") with a printf-style message; returns -1. */
static inline int tirbyoc_fail(const char* kind, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  TVMFFIErrorSetRaisedFromCStr(kind, msg);
  return -1;
}

static inline int tirbyoc_return_none(TVMFFIAny* rv) {
  rv->type_index = kTVMFFINone;
  rv->zero_padding = 0;
  rv->v_int64 = 0;
  return 0;
}

#endif /* TIRBYOC_FFI_H_ */
