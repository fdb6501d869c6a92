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

int tirbyoc_blas_sgemm(int trans_b, int m, int n, int k, const float* a, int lda,
                       const float* b, int ldb, float beta, float* c, int ldc);
int tirbyoc_blas_sgemv(int trans_b, int n, int k, const float* a, const float* b, int ldb,
                       float beta, float* c);
void tirbyoc_blas_threads(int n);
extern int tirbyoc_blas_outer;

/* TVM's thread pool, reached as the code TVM generates reaches it: TVM's module loader sets
 * this pointer when it loads the library (weak: a library TVM links it into has one copy). */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} tirbyoc_parallel_env;
typedef int (*tirbyoc_parallel_lambda)(int task_id, tirbyoc_parallel_env* penv, void* cdata);
__attribute__((weak)) int (*__TVMBackendParallelLaunch)(tirbyoc_parallel_lambda, void*, int);

/* One whole matmul, cut into tasks. A packed kernel runs between TVM's parallel loops; were
 * OpenBLAS to thread it with its own pool, that pool's threads would spin on the cores TVM's
 * threads want next (and TVM's on theirs): BERT-base's elementwise functions, run in parallel
 * between such matmuls, ran 3x slower. So the kernel runs on TVM's pool, each task a
 * single-threaded GEMM on a block of C's columns (or rows, where C has more rows than
 * columns: the operand every task reads whole, and packs, is the smaller one). */
typedef struct {
  int trans_b;
  int64_t batch, m, n, k;
  const float* a;
  const float* b;
  float* c;
} job;

static int64_t block(int64_t extent, int task, int tasks, int64_t* begin) {
  int64_t step = (extent + tasks - 1) / tasks;
  step = (step + 15) / 16 * 16; /* whole 64-byte lines of C per task */
  *begin = step * task;
  if (*begin >= extent) return 0;
  return extent - *begin < step ? extent - *begin : step;
}

static int run_block(int task, tirbyoc_parallel_env* env, void* data) {
  const job* j = (const job*)data;
  int tasks = env ? env->num_task : 1;
  int by_rows = j->m > j->n;
  int64_t begin, len = block(by_rows ? j->m : j->n, task, tasks, &begin);
  if (len == 0) return 0;
  for (int64_t i = 0; i < j->batch; ++i) {
    const float* a = j->a + i * j->m * j->k;
    const float* b = j->b + i * j->k * j->n;
    float* c = j->c + i * j->m * j->n;
    int ldb = j->trans_b ? (int)j->k : (int)j->n;
    if (j->m == 1) /* one row (a token's projection): a matrix-vector product, as fast as it gets */
      tirbyoc_blas_sgemv(j->trans_b, (int)len, (int)j->k, a, b + (j->trans_b ? begin * j->k : begin), ldb,
                         0.0f, c + begin);
    else if (by_rows)
      tirbyoc_blas_sgemm(j->trans_b, (int)len, (int)j->n, (int)j->k, a + begin * j->k, (int)j->k,
                         b, ldb, 0.0f, c + begin * j->n, (int)j->n);
    else
      tirbyoc_blas_sgemm(j->trans_b, (int)j->m, (int)len, (int)j->k, a, (int)j->k,
                         b + (j->trans_b ? begin * j->k : begin), ldb, 0.0f, c + begin,
                         (int)j->n);
  }
  return 0;
}

/* TIRBYOC_BLAS_THREADS=n runs a whole matmul on OpenBLAS's own n threads instead. */
static int openblas_threads(void) {
  const char* env = getenv("TIRBYOC_BLAS_THREADS");
  return env ? atoi(env) : 0;
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
    /* B may be one [K, N] matrix shared by every batch of A (a Linear layer's weight) */
    int rank_ok = t[i]->ndim == t[0]->ndim || (i == 1 && t[1]->ndim == 2);
    if (t[i]->ndim < 2 || !rank_ok || !tirbyoc_compact(t[i]))
      return tirbyoc_fail("ValueError", "%s: argument %s must be compact with the rank of A (>= 2; "
                          "B may be 2-D)", fn, names[i]);
  }
  int nd = t[0]->ndim, nb = t[1]->ndim;
  int shared_b = nb == 2 && nd > 2; /* one GEMM over all of A's rows, batches included */
  int64_t batch = 1, rows = 1;
  for (int d = 0; d < nd - 2; ++d) {
    if (t[2]->shape[d] != t[0]->shape[d] || (!shared_b && t[1]->shape[d] != t[0]->shape[d]))
      return tirbyoc_fail("ValueError", "%s: batch dimensions of A, B and C differ", fn);
    if (shared_b) rows *= t[0]->shape[d];
    else batch *= t[0]->shape[d];
  }
  int64_t m = t[0]->shape[nd - 2] * rows, k = t[0]->shape[nd - 1];
  int64_t n = trans_b ? t[1]->shape[nb - 2] : t[1]->shape[nb - 1];
  int64_t kb = trans_b ? t[1]->shape[nb - 1] : t[1]->shape[nb - 2];
  if (kb != k || t[2]->shape[nd - 2] != t[0]->shape[nd - 2] || t[2]->shape[nd - 1] != n)
    return tirbyoc_fail("ValueError", "%s: shapes of A, B and C do not chain", fn);
  if (m > 0x7fffffff || n > 0x7fffffff || k > 0x7fffffff)
    return tirbyoc_fail("ValueError", "%s: a matrix dimension exceeds 2^31 - 1", fn);
  const float* a = (const float*)tirbyoc_data(t[0]);
  const float* b = (const float*)tirbyoc_data(t[1]);
  float* c = (float*)tirbyoc_data(t[2]);
  job j = {trans_b, batch, m, n, k, a, b, c};
  int threads = openblas_threads();
  if (threads > 0 || __TVMBackendParallelLaunch == NULL) {
    tirbyoc_blas_threads(threads > 0 ? threads : 1);
    tirbyoc_blas_outer = 1;
    run_block(0, NULL, &j);
    tirbyoc_blas_outer = 0;
  } else if (__TVMBackendParallelLaunch(run_block, &j, 0) != 0) {
    return tirbyoc_fail("RuntimeError", "%s: TVM's thread pool failed to run the matmul", fn);
  }
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
