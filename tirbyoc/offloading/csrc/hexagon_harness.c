/*
 * tirbyoc's Hexagon harness: runs one TVM-generated PrimFunc (the `__tvm_ffi_main` of an
 * object TVM built for an `llvm -mtriple=hexagon` target) under qemu-hexagon, with no C
 * library, no TVM runtime and no Hexagon SDK.
 *
 *   qemu-hexagon harness.elf IN OUT
 *
 * IN describes the call (written by tirbyoc.offloading.hexagon):
 *   "TBYH" u32 version=1, u32 nargs, u32 vtcm_bytes,
 *   per argument: u8 dtype code, u8 bits, u16 lanes, u32 ndim, u32 flags (1: the buffer
 *                 lives in VTCM), u32 0, i64 shape[ndim], u64 nbytes, nbytes of data,
 *                 zero padding to 8 bytes.
 * OUT receives every argument's bytes after the call, in order (inputs included).
 * stdout gets "vtcm_high_water N" (bytes of VTCM in use at most). Exit codes: 0 ran, 2 the
 * function reported an error (its message on stderr), 3 VTCM or memory exhausted, 4 bad IN,
 * 5 a DMA copy outside its buffers.
 *
 * What the generated code needs, and what stands in for it here:
 *   - workspace (TVMBackendAllocWorkspace through the __TVMBackend* pointers): a bump heap;
 *   - parallel loops (TVMBackendParallelLaunch): run as one task, serially;
 *   - VTCM (TirbyocHexagonVTCMAlloc, what tirbyoc lowers `global.vtcm` allocations to): a
 *     separate 2 KiB-aligned region of the template's capacity, overflow is an error;
 *   - error reporting (TVMFFIErrorSetRaisedFromCStrParts): the message to stderr;
 *   - the Hexagon DMA engine (the packed `device_api.hexagon.dma_copy_dltensor`): a memcpy
 *     that checks the destination lies in VTCM and both tensors hold the bytes copied;
 *   - the C and compiler runtime pieces LLVM calls (memcpy, memset, integer division).
 * Linux system calls go through trap0(#1): the number in r6, arguments in r0-r5.
 */
#include <tvm/ffi/c_api.h>

typedef unsigned int u32;
typedef unsigned long long u64;

/* ------------------------------------------------------------------ system calls */
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
  register long r0 __asm__("r0") = a;
  register long r1 __asm__("r1") = b;
  register long r2 __asm__("r2") = c;
  register long r3 __asm__("r3") = d;
  register long r4 __asm__("r4") = e;
  register long r5 __asm__("r5") = f;
  register long r6 __asm__("r6") = n;
  __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r3), "r"(r4), "r"(r5), "r"(r6)
                   : "memory");
  return r0;
}
#define SYS_openat 56
#define SYS_close 57
#define SYS_read 63
#define SYS_write 64
#define SYS_exit 93
#define SYS_mmap2 222
#define AT_FDCWD (-100)

static void sys_exit(int code) {
  sys6(SYS_exit, code, 0, 0, 0, 0, 0);
  for (;;) {
  }
}

/* ------------------------------------------------------------- C runtime pieces */
void* memcpy(void* dst, const void* src, unsigned n) {
  unsigned char* d = dst;
  const unsigned char* s = src;
  while (n--) *d++ = *s++;
  return dst;
}
void* memmove(void* dst, const void* src, unsigned n) {
  unsigned char* d = dst;
  const unsigned char* s = src;
  if (d < s) {
    while (n--) *d++ = *s++;
  } else {
    while (n--) d[n] = s[n];
  }
  return dst;
}
void* memset(void* dst, int c, unsigned n) {
  unsigned char* d = dst;
  while (n--) *d++ = (unsigned char)c;
  return dst;
}
/* LLVM's Hexagon backend calls this for large aligned copies. */
void* __hexagon_memcpy_likely_aligned_min32bytes_mult8bytes(void* dst, const void* src, unsigned n) {
  return memcpy(dst, src, n);
}

static u64 udivmod64(u64 n, u64 d, u64* rem) {
  u64 q = 0, r = 0;
  for (int i = 63; i >= 0; --i) {
    r = (r << 1) | ((n >> i) & 1);
    if (r >= d) {
      r -= d;
      q |= 1ULL << i;
    }
  }
  if (rem) *rem = r;
  return q;
}
static long long sdiv64(long long a, long long b, int want_rem) {
  int neg_q = (a < 0) != (b < 0), neg_r = a < 0;
  u64 ua = a < 0 ? -(u64)a : (u64)a, ub = b < 0 ? -(u64)b : (u64)b, r;
  u64 q = udivmod64(ua, ub, &r);
  if (want_rem) return neg_r ? -(long long)r : (long long)r;
  return neg_q ? -(long long)q : (long long)q;
}
/* Integer division: Hexagon has no divide instruction. */
u32 __hexagon_udivsi3(u32 a, u32 b) { return (u32)udivmod64(a, b, 0); }
u32 __hexagon_umodsi3(u32 a, u32 b) { u64 r; udivmod64(a, b, &r); return (u32)r; }
int __hexagon_divsi3(int a, int b) { return (int)sdiv64(a, b, 0); }
int __hexagon_modsi3(int a, int b) { return (int)sdiv64(a, b, 1); }
u64 __hexagon_udivdi3(u64 a, u64 b) { return udivmod64(a, b, 0); }
u64 __hexagon_umoddi3(u64 a, u64 b) { u64 r; udivmod64(a, b, &r); return r; }
long long __hexagon_divdi3(long long a, long long b) { return sdiv64(a, b, 0); }
long long __hexagon_moddi3(long long a, long long b) { return sdiv64(a, b, 1); }

/* ------------------------------------------------------------------- output */
static unsigned cstrlen(const char* s) {
  unsigned n = 0;
  while (s[n]) ++n;
  return n;
}
static void put(int fd, const char* s) { sys6(SYS_write, fd, (long)s, cstrlen(s), 0, 0, 0); }
static void put_u64(int fd, u64 v) {
  char buf[24];
  int i = 23;
  buf[i] = 0;
  do {
    buf[--i] = (char)('0' + (int)(v - udivmod64(v, 10, 0) * 10));
    v = udivmod64(v, 10, 0);
  } while (v);
  put(fd, buf + i);
}
static void fail(int code, const char* what, const char* detail) {
  put(2, "tirbyoc hexagon harness: ");
  put(2, what);
  if (detail) put(2, detail);
  put(2, "\n");
  sys_exit(code);
}

/* ------------------------------------------------------------------- memory */
static unsigned char* heap_cur;
static unsigned char* heap_end;

static void* map(u64 bytes) {
  long p = sys6(SYS_mmap2, 0, (long)bytes, 3 /* read|write */, 0x22 /* private|anon */, -1, 0);
  if (p < 0 && p > -4096) return 0;
  return (void*)p;
}
static void* heap_alloc(u64 bytes) {
  u64 need = (bytes + 127) & ~127ULL;
  if (!heap_cur || (u64)(heap_end - heap_cur) < need) {
    u64 chunk = need > (16u << 20) ? need : (16u << 20);
    heap_cur = map(chunk);
    if (!heap_cur) fail(3, "out of memory", 0);
    heap_end = heap_cur + chunk;
  }
  void* p = heap_cur;
  heap_cur += need;
  return p;
}

static unsigned char* vtcm_base;
static u64 vtcm_size, vtcm_used, vtcm_high;

void* TirbyocHexagonVTCMAlloc(u64 bytes) {
  u64 need = (bytes + 127) & ~127ULL;
  if (vtcm_used + need > vtcm_size) {
    put(2, "tirbyoc hexagon harness: VTCM exhausted: ");
    put_u64(2, need);
    put(2, " bytes more with ");
    put_u64(2, vtcm_used);
    put(2, " of ");
    put_u64(2, vtcm_size);
    put(2, " in use\n");
    sys_exit(3);
  }
  void* p = vtcm_base + vtcm_used;
  vtcm_used += need;
  if (vtcm_used > vtcm_high) vtcm_high = vtcm_used;
  return p;
}

static void* workspace_alloc(int dev_type, int dev_id, u64 size, int code, int bits) {
  (void)dev_type, (void)dev_id, (void)code, (void)bits;
  return heap_alloc(size ? size : 1);
}
static int workspace_free(int dev_type, int dev_id, void* ptr) {
  (void)dev_type, (void)dev_id, (void)ptr;
  return 0;
}
/* TVM's object defines these (weak, null) when it allocates, for the runtime loader to fill
   in; the weak definitions here stand for them when it does not. */
__attribute__((weak)) void* (*__TVMBackendAllocWorkspace)(int, int, u64, int, int);
__attribute__((weak)) int (*__TVMBackendFreeWorkspace)(int, int, void*);

/* Parallel loops: one task does all the work (a barrier in one task is a no-op). */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} ParallelGroupEnv;
typedef int (*ParallelLambda)(int task_id, ParallelGroupEnv* env, void* cdata);
static int parallel_launch(ParallelLambda lambda, void* cdata, int num_task) {
  (void)num_task;
  ParallelGroupEnv env = {0, 1};
  return lambda(0, &env, cdata);
}
static int parallel_barrier(int task_id, ParallelGroupEnv* env) {
  (void)task_id, (void)env;
  return 0;
}
__attribute__((weak)) int (*__TVMBackendParallelLaunch)(ParallelLambda, void*, int);
__attribute__((weak)) int (*__TVMBackendParallelBarrier)(int, ParallelGroupEnv*);

/* ------------------------------------------------------------------- errors */
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  put(2, kind);
  put(2, ": ");
  for (int i = 0; i < n; ++i) put(2, parts[i]);
  put(2, "\n");
}
void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  put(2, kind);
  put(2, ": ");
  put(2, message);
  put(2, "\n");
}

/* ------------------------------------------- packed calls: the DMA engine */
static int dma_function; /* its address is the handle of device_api.hexagon.dma_copy_dltensor */

static int in_vtcm(const unsigned char* p, u64 n) {
  return vtcm_base && p >= vtcm_base && p + n <= vtcm_base + vtcm_size;
}

static int cstreq(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

static int handle_init_once(void** addr, int (*init)(void**)) { return *addr ? 0 : init(addr); }

static int env_lookup(void* library_ctx, const char* name, void** out) {
  (void)library_ctx;
  if (cstreq(name, "device_api.hexagon.dma_copy_dltensor")) {
    *out = &dma_function;
    return 0;
  }
  put(2, "tirbyoc hexagon harness: the generated code calls the packed function ");
  put(2, name);
  put(2, ", which this harness does not provide\n");
  return -1;
}

static u64 tensor_bytes(const DLTensor* t);

/* dma_copy_dltensor(dst, src, bytes, bypass_cache): a synchronous copy into VTCM. */
static int dma_copy(const TVMFFIAny* a, int32_t n) {
  if (n != 4 || a[0].type_index != kTVMFFIDLTensorPtr || a[1].type_index != kTVMFFIDLTensorPtr ||
      a[2].type_index != kTVMFFIInt)
    fail(5, "dma_copy_dltensor: expected (DLTensor* dst, DLTensor* src, int bytes, bool)", 0);
  const DLTensor* dst = a[0].v_ptr;
  const DLTensor* src = a[1].v_ptr;
  u64 bytes = (u64)a[2].v_int64;
  unsigned char* d = (unsigned char*)dst->data + dst->byte_offset;
  const unsigned char* s = (const unsigned char*)src->data + src->byte_offset;
  if (bytes > tensor_bytes(dst) || bytes > tensor_bytes(src))
    fail(5, "dma_copy_dltensor: the copy is larger than its tensors", 0);
  if (!in_vtcm(d, bytes)) fail(5, "dma_copy_dltensor: the destination is not in VTCM", 0);
  memcpy(d, s, (unsigned)bytes);
  return 0;
}

static int function_call(void* handle, TVMFFIAny* a, int32_t n, TVMFFIAny* result) {
  if (handle != &dma_function) fail(5, "a packed call through an unknown handle", 0);
  result->type_index = kTVMFFINone;
  return dma_copy(a, n);
}
/* Likewise for packed calls. */
__attribute__((weak)) int (*__TVMFFIHandleInitOnce)(void**, int (*)(void**));
__attribute__((weak)) int (*__TVMFFIEnvModLookupFromImports)(void*, const char*, void**);
__attribute__((weak)) int (*__TVMFFIFunctionCall)(void*, TVMFFIAny*, int32_t, TVMFFIAny*);

/* --------------------------------------------------------------- the call */
extern int __tvm_ffi_main(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

#define MAX_ARGS 64
#define MAX_DIMS 8
static DLTensor tensors[MAX_ARGS];
static int64_t shapes[MAX_ARGS][MAX_DIMS];
static TVMFFIAny args[MAX_ARGS];

static unsigned char* in_cur;
static unsigned char* in_end;
static void take(void* dst, u64 n) {
  if ((u64)(in_end - in_cur) < n) fail(4, "input file truncated", 0);
  memcpy(dst, in_cur, (unsigned)n);
  in_cur += n;
}

static unsigned char* read_file(const char* path, u64* size) {
  int fd = (int)sys6(SYS_openat, AT_FDCWD, (long)path, 0, 0, 0, 0);
  if (fd < 0) fail(4, "cannot open ", path);
  u64 cap = 1u << 20, len = 0;
  unsigned char* buf = heap_alloc(cap);
  for (;;) {
    if (len == cap) {
      unsigned char* bigger = heap_alloc(cap * 2);
      memcpy(bigger, buf, (unsigned)len);
      buf = bigger;
      cap *= 2;
    }
    long got = sys6(SYS_read, fd, (long)(buf + len), (long)(cap - len), 0, 0, 0);
    if (got < 0) fail(4, "cannot read ", path);
    if (got == 0) break;
    len += (u64)got;
  }
  sys6(SYS_close, fd, 0, 0, 0, 0, 0);
  *size = len;
  return buf;
}

static void write_all(int fd, const unsigned char* p, u64 n) {
  while (n) {
    long put_n = sys6(SYS_write, fd, (long)p, (long)(n > (1u << 30) ? (1u << 30) : n), 0, 0, 0);
    if (put_n <= 0) fail(4, "cannot write the output file", 0);
    p += put_n;
    n -= (u64)put_n;
  }
}

static u64 tensor_bytes(const DLTensor* t) {
  u64 n = 1;
  for (int d = 0; d < t->ndim; ++d) n *= (u64)t->shape[d];
  return n * ((t->dtype.bits * t->dtype.lanes + 7) / 8);
}

static int harness_main(int argc, char** argv) {
  if (argc != 3) fail(4, "usage: harness IN OUT", 0);
  u64 size;
  in_cur = read_file(argv[1], &size);
  in_end = in_cur + size;
  u32 head[4];
  take(head, sizeof head);
  if (head[0] != 0x48594254u /* "TBYH" */ || head[1] != 1) fail(4, "not a harness input file", 0);
  u32 nargs = head[2];
  if (nargs > MAX_ARGS) fail(4, "too many arguments", 0);
  vtcm_size = head[3];
  vtcm_base = vtcm_size ? map((vtcm_size + 2047) & ~2047ULL) : 0;
  if (vtcm_size && !vtcm_base) fail(3, "cannot map the VTCM region", 0);
  __TVMBackendAllocWorkspace = workspace_alloc;
  __TVMBackendFreeWorkspace = workspace_free;
  __TVMBackendParallelLaunch = parallel_launch;
  __TVMBackendParallelBarrier = parallel_barrier;
  __TVMFFIHandleInitOnce = handle_init_once;
  __TVMFFIEnvModLookupFromImports = env_lookup;
  __TVMFFIFunctionCall = function_call;

  for (u32 i = 0; i < nargs; ++i) {
    DLTensor* t = &tensors[i];
    unsigned char code_bits[4];
    u32 ndim, flags[2];
    u64 nbytes;
    take(code_bits, 4);
    take(&ndim, 4);
    take(flags, 8);
    if (ndim > MAX_DIMS) fail(4, "too many dimensions", 0);
    take(shapes[i], 8ULL * ndim);
    take(&nbytes, 8);
    t->dtype.code = code_bits[0];
    t->dtype.bits = code_bits[1];
    t->dtype.lanes = (uint16_t)(code_bits[2] | (code_bits[3] << 8));
    t->ndim = (int32_t)ndim;
    t->shape = shapes[i];
    t->strides = 0;
    t->byte_offset = 0;
    t->device.device_type = kDLCPU;
    t->device.device_id = 0;
    if (tensor_bytes(t) != nbytes) fail(4, "argument size disagrees with its shape", 0);
    t->data = (flags[0] & 1) ? TirbyocHexagonVTCMAlloc(nbytes) : heap_alloc(nbytes);
    take(t->data, nbytes);
    in_cur += (8 - (nbytes & 7)) & 7;
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].zero_padding = 0;
    args[i].v_int64 = 0;
    args[i].v_ptr = t;
  }

  TVMFFIAny result;
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  if (__tvm_ffi_main(0, args, (int32_t)nargs, &result) != 0) fail(2, "the function reported an error", 0);

  int fd = (int)sys6(SYS_openat, AT_FDCWD, (long)argv[2], 01 | 0100 | 01000 /* wronly|creat|trunc */,
                     0644, 0, 0);
  if (fd < 0) fail(4, "cannot create ", argv[2]);
  for (u32 i = 0; i < nargs; ++i) write_all(fd, tensors[i].data, tensor_bytes(&tensors[i]));
  sys6(SYS_close, fd, 0, 0, 0, 0, 0);
  put(1, "vtcm_high_water ");
  put_u64(1, vtcm_high);
  put(1, "\n");
  return 0;
}

void harness_start(long* sp) { sys_exit(harness_main((int)sp[0], (char**)(sp + 1))); }

__attribute__((naked)) void _start(void) {
  __asm__ volatile(
      "r0 = r29\n"
      "r29 = and(r29, #-128)\n"
      "jump harness_start\n");
}
