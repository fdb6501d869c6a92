/* tirbyoc blas shim: destination-passing fp32 GEMM entry points over OpenBLAS.
 *
 * Called from TIR through T.call_extern. Every matrix is a row-major window given by a
 * pointer (already offset to the window's first element) and a leading stride in elements,
 * so windows of larger buffers work without copies. C is accumulated into (beta = 1) or
 * overwritten (beta = 0). Returns 0, or -1 on a negative size.
 */
#include <cblas.h>

/* OpenBLAS threads. These entry points are called from inside TVM's parallel loops, one call
 * per tile on each of TVM's threads: OpenBLAS's own pool would then fight TVM's for the same
 * cores (20-70 ms instead of 1 ms for a small CNN). So OpenBLAS runs single-threaded unless a
 * caller that runs outside TVM's parallel regions (the whole-matmul packed kernels) asks for
 * more with tirbyoc_blas_threads(n) around its own call. */
int tirbyoc_blas_outer = 0; /* set while a packed kernel (outside TVM's parallel loops) runs */

/* OpenBLAS's thread count is one global of the process, shared by every library linking it
 * (this shim and the packed kernels are two): read it, never cache it. */
void tirbyoc_blas_threads(int n) {
  if (n < 1) n = 1;
  if (scipy_openblas_get_num_threads() != n) scipy_openblas_set_num_threads(n);
}

int tirbyoc_blas_sgemm(int trans_b, int m, int n, int k, const float* a, int lda,
                       const float* b, int ldb, float beta, float* c, int ldc) {
  if (m < 0 || n < 0 || k < 0) return -1;
  if (!tirbyoc_blas_outer) tirbyoc_blas_threads(1);
  if (m == 0 || n == 0) return 0;
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                    1.0f, a, lda, b, ldb, beta, c, ldc);
  return 0;
}

int tirbyoc_blas_sgemm_batched(int trans_b, int batch, int m, int n, int k, const float* a,
                               int lda, long long stride_a, const float* b, int ldb,
                               long long stride_b, float beta, float* c, int ldc,
                               long long stride_c) {
  if (batch < 0 || m < 0 || n < 0 || k < 0) return -1;
  for (int i = 0; i < batch; ++i) {
    int rc = tirbyoc_blas_sgemm(trans_b, m, n, k, a + i * stride_a, lda, b + i * stride_b, ldb,
                                beta, c + i * stride_c, ldc);
    if (rc) return rc;
  }
  return 0;
}

/* c[n] += a[k] . B, B row-major [k, n] (trans_b = 0) or [n, k] (trans_b = 1), leading stride ldb;
 * a and c contiguous. */
int tirbyoc_blas_sgemv(int trans_b, int n, int k, const float* a, const float* b, int ldb,
                       float beta, float* c) {
  if (n < 0 || k < 0) return -1;
  tirbyoc_blas_threads(1);
  if (n == 0) return 0;
  if (trans_b)
    scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, b, ldb, a, 1, beta, c, 1);
  else
    scipy_cblas_sgemv(CblasRowMajor, CblasTrans, k, n, 1.0f, b, ldb, a, 1, beta, c, 1);
  return 0;
}
