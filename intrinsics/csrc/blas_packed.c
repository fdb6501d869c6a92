/* tirbyoc blas packed kernels: whole matmuls called from Relax through R.call_dps_packed.
 *
 * TVM FFI packed functions (exported as __tvm_ffi_<name>, loaded as a TVM runtime module and
 * attached to the Relax module's external_mods). Arguments: A, B, C tensors, destination last.
 *   tirbyoc_blas_matmul_nn: C[b.., m, n] = A[b.., m, k] @ B[b.., k, n]
 *   tirbyoc_blas_matmul_nt: C[b.., m, n] = A[b.., m, k] @ B[b.., n, k]^T
 * Rank 2 or batched (equal leading dimensions), float32, compact row-major, on the CPU.
 * Anything else raises a TVM error naming the argument, never reads out of bounds.
 */
#include <tirbyoc_ffi.h>

#include <stdlib.h>
#include <unistd.h>

int tirbyoc_blas_sgemm(int trans_b, int m, int n, int k, const float* a, int lda,
                       const float* b, int ldb, float beta, float* c, int ldc);
void tirbyoc_blas_threads(int n);
extern int tirbyoc_blas_outer;

/* Threads for a whole matmul: TIRBYOC_BLAS_THREADS, else every online core. A packed kernel
 * runs on the Relax VM's thread, outside TVM's parallel loops, so it may use them all. */
static int packed_threads(void) {
  const char* env = getenv("TIRBYOC_BLAS_THREADS");
  int n = env ? atoi(env) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

static int matmul(int trans_b, const char* fn, const TVMFFIAny* args, int32_t num_args,
                  TVMFFIAny* rv) {
  static const char* names[3] = {"A", "B", "C"};
  if (num_args != 3) return tirbyoc_fail("TypeError", "%s: expects 3 tensors (A, B, C)", fn);
  DLTensor* t[3];
  for (int i = 0; i < 3; ++i) {
    t[i] = tirbyoc_tensor_arg(&args[i]);
    if (t[i] == NULL) return tirbyoc_fail("TypeError", "%s: argument %s is not a tensor", fn, names[i]);
    if (t[i]->dtype.code != kDLFloat || t[i]->dtype.bits != 32 || t[i]->dtype.lanes != 1)
      return tirbyoc_fail("TypeError", "%s: argument %s is not float32", fn, names[i]);
    if (t[i]->device.device_type != kDLCPU)
      return tirbyoc_fail("ValueError", "%s: argument %s is not in CPU memory", fn, names[i]);
    if (t[i]->ndim < 2 || t[i]->ndim != t[0]->ndim || !tirbyoc_compact(t[i]))
      return tirbyoc_fail("ValueError", "%s: argument %s must be compact with the rank of A (>= 2)",
                          fn, names[i]);
  }
  int nd = t[0]->ndim;
  int64_t batch = 1;
  for (int d = 0; d < nd - 2; ++d) {
    if (t[1]->shape[d] != t[0]->shape[d] || t[2]->shape[d] != t[0]->shape[d])
      return tirbyoc_fail("ValueError", "%s: batch dimensions of A, B and C differ", fn);
    batch *= t[0]->shape[d];
  }
  int64_t m = t[0]->shape[nd - 2], k = t[0]->shape[nd - 1];
  int64_t n = trans_b ? t[1]->shape[nd - 2] : t[1]->shape[nd - 1];
  int64_t kb = trans_b ? t[1]->shape[nd - 1] : t[1]->shape[nd - 2];
  if (kb != k || t[2]->shape[nd - 2] != m || t[2]->shape[nd - 1] != n)
    return tirbyoc_fail("ValueError", "%s: shapes of A, B and C do not chain", fn);
  if (m > 0x7fffffff || n > 0x7fffffff || k > 0x7fffffff)
    return tirbyoc_fail("ValueError", "%s: a matrix dimension exceeds 2^31 - 1", fn);
  const float* a = (const float*)tirbyoc_data(t[0]);
  const float* b = (const float*)tirbyoc_data(t[1]);
  float* c = (float*)tirbyoc_data(t[2]);
  tirbyoc_blas_threads(packed_threads());
  tirbyoc_blas_outer = 1;
  for (int64_t i = 0; i < batch; ++i) {
    tirbyoc_blas_sgemm(trans_b, (int)m, (int)n, (int)k, a + i * m * k, (int)k, b + i * k * n,
                       trans_b ? (int)k : (int)n, 0.0f, c + i * m * n, (int)n);
  }
  tirbyoc_blas_outer = 0;
  return tirbyoc_return_none(rv);
}

int __tvm_ffi_tirbyoc_blas_matmul_nn(void* self, const TVMFFIAny* args, int32_t num_args,
                                     TVMFFIAny* rv) {
  (void)self;
  return matmul(0, "tirbyoc_blas_matmul_nn", args, num_args, rv);
}

int __tvm_ffi_tirbyoc_blas_matmul_nt(void* self, const TVMFFIAny* args, int32_t num_args,
                                     TVMFFIAny* rv) {
  (void)self;
  return matmul(1, "tirbyoc_blas_matmul_nt", args, num_args, rv);
}
