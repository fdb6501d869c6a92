/* tirbyoc accelerator simulator: functional results and a decoupled access-execute timing
 * model for GEMM accelerators with scratchpads (VTA style). See docs/simulator.md.
 *
 * The tensorized code of a simulated template calls these packed functions (registered as
 * tirbyoc.sim.<op> by tirbyoc/sim.py) once per tile operation:
 *   gemm(C, A, B)                 C[b, o] += sum_i A[b, i] * B[o, i]   (compute unit)
 *   fill_zero(C)                  C = 0                                (compute unit)
 *   alu_add / alu_max(Z, X, Y)    Z = X op Y                           (compute unit)
 *   alu_relu(Z, X), alu_shift_clip(Z, X, shift, lo, hi)                (compute unit)
 *   alu_imm(Z, X, op, imm)        Z = X op imm, op 0 add, 1 max, 2 min, 3 shift right
 *   alu_tensor(Z, X, Y, op, m...) Z = X op Y (op 0 add, 1 max, 2 min) with Y broadcast:
 *                                 Y's dimension d follows Z's dimension m[d] (-1: a unit
 *                                 dimension, always index 0)
 *                                 (VTA's ALU instruction: one op over a whole accumulator
 *                                 tile; Z, X: N-D views with as many elements, walked in
 *                                 row-major order like a DMA's; X may be Z: in place)
 *   dma_load(D, S, scope)         DRAM window S -> scratchpad window D (load unit)
 *   dma_store(D, S, scope)        scratchpad window S -> DRAM window D (store unit)
 *                                 D and S are N-D strided views (up to 6 dimensions) with as
 *                                 many elements, copied in the row-major order of each: one
 *                                 intrinsic tile, or a whole scratchpad tile at once
 *   scratchpad_begin(b0, b1, b2) / scratchpad_end(b0, b1, b2)
 *                                 a program holds b_s bytes of scratchpad s while it runs
 *                                 (the rewrite brackets each offloaded PrimFunc with them):
 *                                 high-water marks, and an error past a capacity; the end of a
 *                                 program is a barrier (every unit done, tiles forgotten)
 * Tiles are 1-D or 2-D, possibly strided windows; values are computed exactly as the untouched
 * program computes them (integer arithmetic, wrap-around narrowing on store).
 *
 * Timing: each unit executes its operations in program order; an operation starts when its
 * unit is free and its dependences are met (read-after-write on the tiles it reads,
 * write-after-read and write-after-write on the tiles it writes, tracked per tile address),
 * tracked per 16-byte granule of scratchpad, so a DMA of a whole scratchpad tile and the GEMMs
 * that read intrinsic tiles inside it find each other), which is what VTA's dependence tokens
 * enforce. So a load overlaps compute whenever the program's tiles allow. Durations: GEMM
 * ceil(b*i*o / core MACs), ALU ceil(lanes / alu lanes), reset 1, DMA: one descriptor per 2-D
 * block of its DRAM side (rows of contiguous bytes at a stride, as VTA's load and store
 * instructions move), each paying the latency, plus ceil(bytes / bytes per cycle).
 */
#include <stdint.h>
#include <string.h>
#include <tirbyoc_ffi.h>

enum { UNIT_LOAD = 0, UNIT_COMPUTE = 1, UNIT_STORE = 2, N_UNITS = 3 };
enum { N_SCOPES = 3 };  /* 0: input, 1: weight, 2: accumulator scratchpad */
enum { CFG_CORE_MACS, CFG_ALU_LANES, CFG_DMA_BPC, CFG_DMA_LATENCY, CFG_CAP0, CFG_CAP1, CFG_CAP2, N_CFG };
enum {
  ST_CYCLES, ST_BUSY_LOAD, ST_BUSY_COMPUTE, ST_BUSY_STORE, ST_LOAD_BYTES0, ST_LOAD_BYTES1,
  ST_LOAD_BYTES2, ST_STORE_BYTES, ST_TILES0, ST_TILES1, ST_TILES2, ST_OPS_GEMM, ST_OPS_ALU,
  ST_OPS_LOAD, ST_OPS_STORE, ST_MACS, ST_HIGH0, ST_HIGH1, ST_HIGH2, N_STATS
};

#define TABLE (1 << 17) /* scratchpad granules tracked for dependences (open addressing) */
#define GRANULE 16       /* bytes: dependences are tracked per granule of scratchpad */
#define MAX_DIMS 6

typedef struct {
  uintptr_t addr;   /* first byte of the granule; 0 = empty slot */
  int64_t ready;    /* cycle its last write completes */
  int64_t read_end; /* cycle its last read completes */
  int64_t bytes;
  int scope;        /* scratchpad scope, or -1 before its first write */
} Tile;

/* A deployed library is compiled with its template's configuration (-DTIRBYOC_SIM_CONFIG=...);
 * in-process runs call configure() instead. */
#ifndef TIRBYOC_SIM_CONFIG
#define TIRBYOC_SIM_CONFIG 256, 16, 8, 64, 32768, 262144, 131072
#endif
static int64_t cfg[N_CFG] = {TIRBYOC_SIM_CONFIG};
static int64_t stats[N_STATS];
static int64_t held[N_SCOPES]; /* scratchpad bytes held by the programs running now */
static int64_t unit_free[N_UNITS];
static Tile tiles[TABLE];

static size_t tiles_used;

static Tile* find_slot(uintptr_t addr) {
  size_t h = (size_t)((addr >> 4) * 2654435761u) & (TABLE - 1);
  while (tiles[h].addr != 0 && tiles[h].addr != addr) h = (h + 1) & (TABLE - 1);
  return &tiles[h];
}

/* Forget tiles no later operation can wait for: every unit is past their last use. */
static void purge(void) {
  static Tile keep[TABLE];
  int64_t horizon = unit_free[0];
  for (int u = 1; u < N_UNITS; ++u)
    if (unit_free[u] < horizon) horizon = unit_free[u];
  size_t kept = 0;
  for (size_t h = 0; h < TABLE; ++h)
    if (tiles[h].addr && (tiles[h].ready > horizon || tiles[h].read_end > horizon)) keep[kept++] = tiles[h];
  memset(tiles, 0, sizeof tiles);
  for (size_t k = 0; k < kept; ++k) *find_slot(keep[k].addr) = keep[k];
  tiles_used = kept;
}

static Tile* tile_of(uintptr_t addr) {
  Tile* t = find_slot(addr);
  if (t->addr == addr) return t;
  if (tiles_used + 1 >= TABLE) return NULL;
  t->addr = addr;
  t->ready = t->read_end = t->bytes = 0;
  t->scope = -1;
  ++tiles_used;
  return t;
}

/* The end of a program (an offloaded PrimFunc) is a synchronisation point: the host runs
 * whatever comes between two programs, so every unit finishes before the next one starts,
 * and no dependence crosses the boundary. Tiles are tracked by their host addresses, which
 * another program may reuse for other data depending on what the process allocated before:
 * forgetting them here keeps a program's cycles independent of the process's history. */
static void barrier(void) {
  int64_t t = stats[ST_CYCLES];
  for (int u = 0; u < N_UNITS; ++u)
    if (unit_free[u] > t) t = unit_free[u];
  for (int u = 0; u < N_UNITS; ++u) unit_free[u] = t;
  memset(tiles, 0, sizeof tiles);
  tiles_used = 0;
}

static void reset_state(void) {
  memset(stats, 0, sizeof stats);
  memset(held, 0, sizeof held);
  memset(unit_free, 0, sizeof unit_free);
  memset(tiles, 0, sizeof tiles);
  tiles_used = 0;
}

/* ---------------------------------------------------------------- element access */
static inline uintptr_t elem_addr(const DLTensor* t, int64_t i, int64_t j) {
  int64_t bytes = t->dtype.bits / 8;
  int64_t off;
  if (t->ndim == 1) {
    off = (t->strides ? t->strides[0] : 1) * j;
  } else {
    int64_t s0 = t->strides ? t->strides[0] : t->shape[1];
    int64_t s1 = t->strides ? t->strides[1] : 1;
    off = i * s0 + j * s1;
  }
  return (uintptr_t)tirbyoc_data(t) + (uintptr_t)(off * bytes);
}

/* The value at address p of t's dtype, widened (each branch on its own: a ?: of int32_t and
 * uint32_t would be unsigned); store_at narrows by keeping the low bits, as a cast does. */
static inline int64_t load_at(const DLTensor* t, uintptr_t p) {
  int signed_int = t->dtype.code == kDLInt;
  switch (t->dtype.bits) {
    case 8: return signed_int ? (int64_t)*(const int8_t*)p : (int64_t)*(const uint8_t*)p;
    case 16: return signed_int ? (int64_t)*(const int16_t*)p : (int64_t)*(const uint16_t*)p;
    case 32: return signed_int ? (int64_t)*(const int32_t*)p : (int64_t)*(const uint32_t*)p;
    default: return *(const int64_t*)p;
  }
}

static inline void store_at(const DLTensor* t, uintptr_t p, int64_t v) {
  switch (t->dtype.bits) {
    case 8: *(uint8_t*)p = (uint8_t)v; break;
    case 16: *(uint16_t*)p = (uint16_t)v; break;
    case 32: *(uint32_t*)p = (uint32_t)v; break;
    default: *(int64_t*)p = v;
  }
}

static inline int64_t load(const DLTensor* t, int64_t i, int64_t j) { return load_at(t, elem_addr(t, i, j)); }

static inline void store(const DLTensor* t, int64_t i, int64_t j, int64_t v) { store_at(t, elem_addr(t, i, j), v); }

static int64_t col_stride(const DLTensor* t) {
  return t->strides ? t->strides[t->ndim - 1] : 1;
}

static int rows(const DLTensor* t) { return t->ndim == 1 ? 1 : (int)t->shape[0]; }
static int cols(const DLTensor* t) { return (int)t->shape[t->ndim - 1]; }

/* An integer tensor in host memory of 1 to max_dims dimensions; `what` names the shape wanted. */
static int check_array(const char* fn, const char* name, const DLTensor* t, int max_dims, const char* what) {
  if (t == NULL) return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: %s is not a tensor", fn, name);
  if (t->ndim < 1 || t->ndim > max_dims || t->dtype.code == kDLFloat || t->dtype.lanes != 1 ||
      (t->dtype.bits != 8 && t->dtype.bits != 16 && t->dtype.bits != 32 && t->dtype.bits != 64))
    return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: %s must be %s", fn, name, what);
  if (t->device.device_type != kDLCPU)
    return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: %s is not in host memory", fn, name);
  return 0;
}

/* Operands of GEMM, reset and ALU ops: one intrinsic tile. */
static int check_tile(const char* fn, const char* name, const DLTensor* t) {
  return check_array(fn, name, t, 2, "a 1-D or 2-D integer tile");
}

/* ---------------------------------------------------------------- timing */
typedef struct {
  const DLTensor* t;
  int scope;
} Access;

/* A view's memory as runs of contiguous bytes: dimensions merged where contiguous; the last
 * merged dimension is the run when its stride is 1 (else every element is a run of one). */
typedef struct {
  int n;                   /* outer dimensions iterated to reach each run */
  int64_t ext[MAX_DIMS];   /* their extents */
  int64_t str[MAX_DIMS];   /* their strides, in elements */
  int64_t run;             /* elements per run */
  int64_t elem;            /* bytes per element */
} Runs;

static void runs_of(const DLTensor* t, Runs* r) {
  int64_t ext[MAX_DIMS], str[MAX_DIMS];
  int n = t->ndim, m = 0;
  int64_t compact = 1;
  for (int d = n - 1; d >= 0; --d) {
    str[d] = t->strides ? t->strides[d] : compact;
    compact *= t->shape[d];
    ext[d] = t->shape[d];
  }
  r->elem = t->dtype.bits / 8;
  /* drop unit dimensions, then merge from the innermost while contiguous */
  int64_t e2[MAX_DIMS], s2[MAX_DIMS];
  for (int d = 0; d < n; ++d)
    if (ext[d] != 1) e2[m] = ext[d], s2[m] = str[d], ++m;
  if (m == 0) e2[0] = 1, s2[0] = 1, m = 1;
  int k = m - 1;
  while (k > 0 && s2[k - 1] == e2[k] * s2[k]) {
    e2[k - 1] *= e2[k];
    s2[k - 1] = s2[k];
    --k;
  }
  if (s2[k] == 1) {
    r->run = e2[k];
    r->n = k;
  } else {
    r->run = 1;
    r->n = k + 1;
  }
  for (int d = 0; d < r->n; ++d) r->ext[d] = e2[d], r->str[d] = s2[d];
}

/* Calls fn(granule address, ctx) for every granule the view touches, run by run. */
typedef int (*GranuleFn)(uintptr_t g, void* ctx);
static int for_each_granule(const DLTensor* t, GranuleFn fn, void* ctx) {
  Runs r;
  runs_of(t, &r);
  int64_t idx[MAX_DIMS] = {0};
  uintptr_t base = (uintptr_t)tirbyoc_data(t);
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < r.n; ++d) off += idx[d] * r.str[d];
    uintptr_t lo = base + (uintptr_t)(off * r.elem), hi = lo + (uintptr_t)(r.run * r.elem) - 1;
    for (uintptr_t g = lo & ~(uintptr_t)(GRANULE - 1); g <= hi; g += GRANULE)
      if (fn(g, ctx)) return -1;
    int d = r.n - 1;
    while (d >= 0 && ++idx[d] == r.ext[d]) idx[d--] = 0;
    if (d < 0) return 0;
  }
}

typedef struct {
  int64_t start, end;
  int write, scope;
  const DLTensor* t;
} Visit;

static int earliest(uintptr_t g, void* ctx) { /* the dependences one granule imposes */
  Visit* v = ctx;
  Tile* tile = tile_of(g);
  if (!tile) return -1;
  if (tile->ready > v->start) v->start = tile->ready; /* RAW, and WAW for a write */
  if (v->write && tile->read_end > v->start) v->start = tile->read_end; /* WAR */
  return 0;
}

static int record(uintptr_t g, void* ctx) {
  Visit* v = ctx;
  Tile* tile = tile_of(g);
  if (!tile) return -1;
  if (!v->write) {
    if (tile->read_end < v->end) tile->read_end = v->end;
    return 0;
  }
  tile->ready = v->end;
  if (tile->scope < 0) { /* scratchpad bytes written for the first time */
    tile->scope = v->scope;
    tile->bytes = GRANULE;
    stats[ST_TILES0 + v->scope] += GRANULE;
  }
  return 0;
}

static int issue(const char* fn, int unit, int64_t duration, const Access* reads, int nr,
                 const Access* writes, int nw) {
  if (tiles_used * 4 >= TABLE * 3) purge(); /* before any lookup: purging moves tiles */
  Visit v = {unit_free[unit], 0, 0, 0, NULL};
  /* DRAM accesses (scope < 0) are ordered by the host between programs */
  for (int k = 0; k < nr + nw; ++k) {
    const Access* a = k < nr ? &reads[k] : &writes[k - nr];
    if (a->scope < 0) continue;
    v.write = k >= nr;
    if (for_each_granule(a->t, earliest, &v))
      return tirbyoc_fail("RuntimeError", "tirbyoc.sim.%s: more than %d live scratchpad granules", fn, TABLE);
  }
  v.end = v.start + duration;
  for (int k = 0; k < nr + nw; ++k) {
    const Access* a = k < nr ? &reads[k] : &writes[k - nr];
    if (a->scope < 0) continue;
    v.write = k >= nr;
    v.scope = a->scope;
    if (for_each_granule(a->t, record, &v))
      return tirbyoc_fail("RuntimeError", "tirbyoc.sim.%s: more than %d live scratchpad granules", fn, TABLE);
  }
  unit_free[unit] = v.end;
  stats[ST_BUSY_LOAD + unit] += duration;
  if (v.end > stats[ST_CYCLES]) stats[ST_CYCLES] = v.end;
  return 0;
}

static int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : a; }

/* ---------------------------------------------------------------- operations */
int __tvm_ffi_tirbyoc_sim_gemm(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  if (n != 3) return tirbyoc_fail("TypeError", "tirbyoc.sim.gemm: expects (C, A, B)");
  DLTensor *c = tirbyoc_tensor_arg(&args[0]), *a = tirbyoc_tensor_arg(&args[1]), *b = tirbyoc_tensor_arg(&args[2]);
  if (check_tile("gemm", "C", c) || check_tile("gemm", "A", a) || check_tile("gemm", "B", b)) return -1;
  int batch = rows(a), in = cols(a), out = rows(b);
  if (cols(b) != in || rows(c) != batch || cols(c) != out)
    return tirbyoc_fail("ValueError", "tirbyoc.sim.gemm: C %dx%d, A %dx%d, B %dx%d do not chain",
                        rows(c), cols(c), batch, in, rows(b), cols(b));
  if (a->dtype.bits == 8 && b->dtype.bits == 8 && c->dtype.bits == 32 && a->dtype.code == kDLInt &&
      b->dtype.code == kDLInt && b->ndim == 2) {
    int64_t sa = col_stride(a), sb = col_stride(b);
    for (int i = 0; i < batch; ++i)
      for (int o = 0; o < out; ++o) {
        const int8_t* ap = (const int8_t*)elem_addr(a, i, 0);
        const int8_t* bp = (const int8_t*)elem_addr(b, o, 0);
        int32_t acc = 0;
        for (int k = 0; k < in; ++k) acc += (int32_t)ap[k * sa] * (int32_t)bp[k * sb];
        int32_t* cp = (int32_t*)elem_addr(c, i, o);
        *cp = (int32_t)((uint32_t)*cp + (uint32_t)acc);
      }
  } else {
    for (int i = 0; i < batch; ++i)
      for (int o = 0; o < out; ++o) {
        int64_t acc = load(c, i, o);
        for (int k = 0; k < in; ++k) acc += load(a, i, k) * load(b, o, k);
        store(c, i, o, acc);
      }
  }
  int64_t macs = (int64_t)batch * in * out;
  stats[ST_OPS_GEMM] += 1;
  stats[ST_MACS] += macs;
  Access r[3] = {{a, 0}, {b, 1}, {c, 2}}, w[1] = {{c, 2}};
  if (issue("gemm", UNIT_COMPUTE, ceil_div(macs, cfg[CFG_CORE_MACS]), r, 3, w, 1)) return -1;
  return tirbyoc_return_none(rv);
}

int __tvm_ffi_tirbyoc_sim_fill_zero(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  if (n != 1) return tirbyoc_fail("TypeError", "tirbyoc.sim.fill_zero: expects (C)");
  DLTensor* c = tirbyoc_tensor_arg(&args[0]);
  if (check_tile("fill_zero", "C", c)) return -1;
  for (int i = 0; i < rows(c); ++i)
    for (int j = 0; j < cols(c); ++j) store(c, i, j, 0);
  stats[ST_OPS_ALU] += 1;
  Access w[1] = {{c, 2}};
  if (issue("fill_zero", UNIT_COMPUTE, 1, NULL, 0, w, 1)) return -1;
  return tirbyoc_return_none(rv);
}

/* DMA operands: a strided view of up to MAX_DIMS (6) dimensions. */
static int check_view(const char* fn, const char* name, const DLTensor* t) {
  return check_array(fn, name, t, MAX_DIMS, "an integer view of 1 to 6 dimensions");
}

static int64_t count(const DLTensor* t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

/* Walks a view's elements in row-major order, one address step at a time. */
typedef struct {
  int n;
  int64_t idx[MAX_DIMS], ext[MAX_DIMS], step[MAX_DIMS]; /* step: bytes per index */
  uintptr_t addr;
} Cursor;

static void cursor_init(Cursor* c, const DLTensor* t) {
  int64_t compact = 1, elem = t->dtype.bits / 8;
  c->n = t->ndim;
  for (int d = t->ndim - 1; d >= 0; --d) {
    c->idx[d] = 0;
    c->ext[d] = t->shape[d];
    c->step[d] = (t->strides ? t->strides[d] : compact) * elem;
    compact *= t->shape[d];
  }
  c->addr = (uintptr_t)tirbyoc_data(t);
}

static void cursor_next(Cursor* c) {
  for (int d = c->n - 1; d >= 0; --d) {
    c->addr += (uintptr_t)c->step[d];
    if (++c->idx[d] < c->ext[d]) return;
    c->addr -= (uintptr_t)(c->step[d] * c->ext[d]);
    c->idx[d] = 0;
  }
}

/* DMA descriptors for a DRAM view: one per 2-D block (rows of contiguous runs at a stride). */
static int64_t descriptors(const DLTensor* dram) {
  Runs r;
  runs_of(dram, &r);
  int64_t n = 1;
  for (int d = 0; d + 1 < r.n; ++d) n *= r.ext[d];
  return n;
}

static int dma(int is_load, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  const char* fn = is_load ? "dma_load" : "dma_store";
  if (n != 3 || args[2].type_index != kTVMFFIInt)
    return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: expects (D, S, scope)", fn);
  DLTensor *d = tirbyoc_tensor_arg(&args[0]), *s = tirbyoc_tensor_arg(&args[1]);
  int64_t scope = args[2].v_int64;
  if (check_view(fn, "D", d) || check_view(fn, "S", s)) return -1;
  if (scope < 0 || scope >= N_SCOPES) return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: scope %lld", fn, (long long)scope);
  int64_t elems = count(s);
  if (count(d) != elems)
    return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: D has %lld elements, S %lld", fn,
                        (long long)count(d), (long long)elems);
  if (d->ndim == s->ndim && d->ndim <= 2) { /* one intrinsic tile: the common case, fast */
    if (rows(d) != rows(s) || cols(d) != cols(s))
      return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: D and S differ in shape", fn);
    for (int i = 0; i < rows(s); ++i)
      for (int j = 0; j < cols(s); ++j) store(d, i, j, load(s, i, j));
  } else {
    Cursor cd, cs;
    cursor_init(&cd, d);
    cursor_init(&cs, s);
    for (int64_t i = 0; i < elems; ++i, cursor_next(&cd), cursor_next(&cs))
      store_at(d, cd.addr, load_at(s, cs.addr));
  }
  const DLTensor* dram = is_load ? s : d;
  int64_t bytes = elems * (dram->dtype.bits / 8);
  int64_t duration = descriptors(dram) * cfg[CFG_DMA_LATENCY] + ceil_div(bytes, cfg[CFG_DMA_BPC]);
  stats[is_load ? ST_OPS_LOAD : ST_OPS_STORE] += 1;
  if (is_load) {
    stats[ST_LOAD_BYTES0 + scope] += bytes;
    Access r[1] = {{s, -1}}, w[1] = {{d, (int)scope}};
    if (issue(fn, UNIT_LOAD, duration, r, 1, w, 1)) return -1;
  } else {
    stats[ST_STORE_BYTES] += bytes;
    Access r[1] = {{s, (int)scope}}, w[1] = {{d, -1}};
    if (issue(fn, UNIT_STORE, duration, r, 1, w, 1)) return -1;
  }
  return tirbyoc_return_none(rv);
}

int __tvm_ffi_tirbyoc_sim_dma_load(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  return dma(1, args, n, rv);
}

int __tvm_ffi_tirbyoc_sim_dma_store(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  return dma(0, args, n, rv);
}

static int alu(const char* fn, int op, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  int binary = op <= 1;
  int want = binary ? 3 : (op == 2 ? 2 : 5);
  if (n != want) return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: expects %d arguments", fn, want);
  DLTensor *z = tirbyoc_tensor_arg(&args[0]), *x = tirbyoc_tensor_arg(&args[1]);
  DLTensor* y = binary ? tirbyoc_tensor_arg(&args[2]) : NULL;
  if (check_tile(fn, "Z", z) || check_tile(fn, "X", x) || (binary && check_tile(fn, "Y", y))) return -1;
  int64_t shift = 0, lo = 0, hi = 0;
  if (op == 3) {
    if (args[2].type_index != kTVMFFIInt || args[3].type_index != kTVMFFIInt || args[4].type_index != kTVMFFIInt)
      return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: shift, lo and hi must be integers", fn);
    shift = args[2].v_int64, lo = args[3].v_int64, hi = args[4].v_int64;
  }
  for (int i = 0; i < rows(x); ++i)
    for (int j = 0; j < cols(x); ++j) {
      int64_t a = load(x, i, j), v;
      switch (op) {
        case 0: v = (int32_t)((uint32_t)a + (uint32_t)load(y, i, j)); break;
        case 1: { int64_t b = load(y, i, j); v = a > b ? a : b; break; }
        case 2: v = a > 0 ? a : 0; break;
        default: v = a >> shift; v = v < lo ? lo : (v > hi ? hi : v);
      }
      store(z, i, j, v);
    }
  stats[ST_OPS_ALU] += 1;
  Access r[2] = {{x, 2}, {y, 2}}, w[1] = {{z, 2}};
  int64_t lanes = (int64_t)rows(x) * cols(x);
  if (issue(fn, UNIT_COMPUTE, ceil_div(lanes, cfg[CFG_ALU_LANES]), r, binary ? 2 : 1, w, 1)) return -1;
  return tirbyoc_return_none(rv);
}

int __tvm_ffi_tirbyoc_sim_alu_add(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return alu("alu_add", 0, a, n, rv); }
int __tvm_ffi_tirbyoc_sim_alu_max(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return alu("alu_max", 1, a, n, rv); }
int __tvm_ffi_tirbyoc_sim_alu_relu(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return alu("alu_relu", 2, a, n, rv); }
int __tvm_ffi_tirbyoc_sim_alu_shift_clip(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return alu("alu_shift_clip", 3, a, n, rv); }

/* ALU over whole accumulator tiles (VTA's ALU instruction loops over a tile): Z and X are
 * N-D views walked in row-major order; Y (alu_tensor) is indexed by Z's position through the
 * dimension map. Values are int32 accumulator values; results wrap like the int32 arithmetic of
 * the code they replace (an arithmetic shift right by 0..31). */
static int64_t alu_apply(int op, int64_t a, int64_t b) {
  switch (op) {
    case 0: return (int32_t)((uint32_t)a + (uint32_t)b);
    case 1: return a > b ? a : b;
    case 2: return a < b ? a : b;
    default: return a >> b;
  }
}

static int alu_block(const char* fn, int tensor, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  if (n < 4) return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: too few arguments", fn);
  DLTensor *z = tirbyoc_tensor_arg(&args[0]), *x = tirbyoc_tensor_arg(&args[1]);
  DLTensor* y = tensor ? tirbyoc_tensor_arg(&args[2]) : NULL;
  if (check_view(fn, "Z", z) || check_view(fn, "X", x) || (tensor && check_view(fn, "Y", y))) return -1;
  const TVMFFIAny* opa = &args[tensor ? 3 : 2];
  if (opa->type_index != kTVMFFIInt || opa->v_int64 < 0 || opa->v_int64 > (tensor ? 2 : 3))
    return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: unknown ALU op", fn);
  int op = (int)opa->v_int64;
  int64_t imm = 0;
  int64_t map[MAX_DIMS] = {0};
  if (!tensor) {
    if (n != 4 || args[3].type_index != kTVMFFIInt)
      return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: expects (Z, X, op, imm)", fn);
    imm = args[3].v_int64;
    if (op == 3 && (imm < 0 || imm > 31))
      return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: shift by %lld", fn, (long long)imm);
  } else {
    if (n != 4 + y->ndim)
      return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: expects (Z, X, Y, op) and one dimension of Z per "
                          "dimension of Y", fn);
    for (int d = 0; d < y->ndim; ++d) {
      int64_t m = args[4 + d].type_index == kTVMFFIInt ? args[4 + d].v_int64 : -2;
      if (m == -1 && y->shape[d] == 1) { /* a unit dimension: always index 0 */
        map[d] = -1;
        continue;
      }
      if (m < 0 || m >= z->ndim || z->shape[m] != y->shape[d])
        return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: Y's dimension %d does not follow a dimension of Z "
                            "of its extent", fn, d);
      map[d] = args[4 + d].v_int64;
    }
  }
  int64_t elems = count(z);
  if (count(x) != elems)
    return tirbyoc_fail("ValueError", "tirbyoc.sim.%s: Z has %lld elements, X %lld", fn,
                        (long long)elems, (long long)count(x));
  int64_t ystride[MAX_DIMS] = {0}, compact = 1;
  if (tensor)
    for (int d = y->ndim - 1; d >= 0; --d) {
      ystride[d] = y->strides ? y->strides[d] : compact;
      compact *= y->shape[d];
    }
  Cursor cz, cx;
  cursor_init(&cz, z);
  cursor_init(&cx, x);
  uintptr_t ybase = tensor ? (uintptr_t)tirbyoc_data(y) : 0;
  int64_t ybytes = tensor ? y->dtype.bits / 8 : 0;
  for (int64_t i = 0; i < elems; ++i, cursor_next(&cz), cursor_next(&cx)) {
    int64_t b = imm;
    if (tensor) {
      int64_t off = 0;
      for (int d = 0; d < y->ndim; ++d)
        if (map[d] >= 0) off += ystride[d] * cz.idx[map[d]];
      b = load_at(y, ybase + (uintptr_t)(off * ybytes));
    }
    store_at(z, cz.addr, alu_apply(op, load_at(x, cx.addr), b));
  }
  stats[ST_OPS_ALU] += 1;
  Access r[2] = {{x, 2}, {y, 2}}, w[1] = {{z, 2}};
  if (issue(fn, UNIT_COMPUTE, ceil_div(elems, cfg[CFG_ALU_LANES]), r, tensor ? 2 : 1, w, 1)) return -1;
  return tirbyoc_return_none(rv);
}

int __tvm_ffi_tirbyoc_sim_alu_imm(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return alu_block("alu_imm", 0, a, n, rv); }
int __tvm_ffi_tirbyoc_sim_alu_tensor(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return alu_block("alu_tensor", 1, a, n, rv); }

static int scratchpad(int begin, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  const char* fn = begin ? "scratchpad_begin" : "scratchpad_end";
  static const char* names[N_SCOPES] = {"input", "weight", "accumulator"};
  if (n != N_SCOPES) return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: expects %d byte counts", fn, N_SCOPES);
  for (int s = 0; s < N_SCOPES; ++s)
    if (args[s].type_index != kTVMFFIInt || args[s].v_int64 < 0)
      return tirbyoc_fail("TypeError", "tirbyoc.sim.%s: byte counts must be non-negative integers", fn);
  for (int s = 0; s < N_SCOPES; ++s) {
    int64_t bytes = args[s].v_int64;
    if (!begin) {
      held[s] = held[s] > bytes ? held[s] - bytes : 0;
      continue;
    }
    if (held[s] + bytes > cfg[CFG_CAP0 + s])
      return tirbyoc_fail("RuntimeError",
                          "tirbyoc.sim: the %s scratchpad would hold %lld bytes (%lld for this program "
                          "on top of %lld), over its capacity of %lld bytes; the program was planned "
                          "for a larger scratchpad than the simulator is configured with",
                          names[s], (long long)(held[s] + bytes), (long long)bytes,
                          (long long)held[s], (long long)cfg[CFG_CAP0 + s]);
  }
  if (begin)
    for (int s = 0; s < N_SCOPES; ++s) {
      held[s] += args[s].v_int64;
      if (held[s] > stats[ST_HIGH0 + s]) stats[ST_HIGH0 + s] = held[s];
    }
  else
    barrier();
  return tirbyoc_return_none(rv);
}

int __tvm_ffi_tirbyoc_sim_scratchpad_begin(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return scratchpad(1, a, n, rv); }
int __tvm_ffi_tirbyoc_sim_scratchpad_end(void* s, const TVMFFIAny* a, int32_t n, TVMFFIAny* rv) { (void)s; return scratchpad(0, a, n, rv); }

/* ---------------------------------------------------------------- control */
static int int64_vector(const TVMFFIAny* arg, int64_t len, int64_t** out) {
  DLTensor* t = tirbyoc_tensor_arg(arg);
  if (!t || t->ndim != 1 || t->shape[0] != len || t->dtype.code != kDLInt || t->dtype.bits != 64 ||
      !tirbyoc_compact(t) || t->device.device_type != kDLCPU)
    return -1;
  *out = (int64_t*)tirbyoc_data(t);
  return 0;
}

/* configure(cfg: int64[N_CFG]): core MACs per cycle, ALU lanes per cycle, DMA bytes per cycle,
 * DMA latency, scratchpad capacities (input, weight, accumulator; reported beside the tile
 * bytes, the compile-time plan enforces them); resets the state. */
int __tvm_ffi_tirbyoc_sim_configure(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  int64_t* v;
  if (n != 1 || int64_vector(&args[0], N_CFG, &v))
    return tirbyoc_fail("TypeError", "tirbyoc.sim.configure: expects one int64[%d] tensor", N_CFG);
  for (int k = 0; k < N_CFG; ++k)
    if (v[k] <= 0 && k != CFG_DMA_LATENCY)
      return tirbyoc_fail("ValueError", "tirbyoc.sim.configure: parameter %d must be positive", k);
  memcpy(cfg, v, sizeof cfg);
  reset_state();
  return tirbyoc_return_none(rv);
}

int __tvm_ffi_tirbyoc_sim_reset(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self, (void)args, (void)n;
  reset_state();
  return tirbyoc_return_none(rv);
}

/* stats(out: int64[N_STATS]) */
int __tvm_ffi_tirbyoc_sim_stats(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* rv) {
  (void)self;
  int64_t* v;
  if (n != 1 || int64_vector(&args[0], N_STATS, &v))
    return tirbyoc_fail("TypeError", "tirbyoc.sim.stats: expects one int64[%d] tensor", N_STATS);
  memcpy(v, stats, sizeof stats);
  return tirbyoc_return_none(rv);
}
