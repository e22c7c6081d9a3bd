// indexer.cu — the lightning indexer's scores and top-k selection (spec §4.10 steps 4–6).
//
// indexer_scores_f32: q [T, heads, hd] f32 (index queries, rotated), k [N, hd] f32 (index keys),
//   w [T, heads] f32 (head weights, already scaled by heads^−1/2), scores [T, N] f32.
//   Query t is at absolute position pos0 + t; visible(t) = min((pos0 + t + 1) / ratio, N).
//   scores[t, j] = scale · Σ_h w[t, h]·max(q[t, h]·k[j], 0) for j < visible(t), −inf for the rest
//   (scale = hd^−1/2). Block (key tile, t): the query's heads·hd values go to shared memory
//   (float4), the tile's IDX_KT keys to a padded shared tile (row stride hd + 4: conflict-free
//   float4 reads); thread (j = tid % 16, g = tid / 16) sums heads g, g + 16, … of key j in head
//   order, then thread j < 16 adds the 16 group partials in group order → deterministic.
//   Launch: grid (ceil(N / IDX_KT), T), block 256; static shared memory
//   IDX_MAXQ·4 + IDX_KT·(IDX_MAXHD + 4)·4 + 256·4 = 42,240 bytes.
//   Limits: hd % 4 == 0, hd ≤ IDX_MAXHD (128), heads·hd ≤ IDX_MAXQ (8192), T ≤ 65535.
//
// indexer_topk_f32: scores [T, N] f32 (from indexer_scores_f32), offsets [T + 1] i32 (CSR, host-built:
//   count(t) = min(visible(t), k)), idx [offsets[T]] i32 out.
//   Writes the indices of the top-k scores among the visible entries of query t, ascending, to
//   idx[offsets[t] ..]: all visible entries when visible(t) ≤ k; otherwise the k largest under the
//   total order "higher score first (f32 total order, as Rust's total_cmp), then lower index".
//   Algorithm (exact, any N): a 4-pass MSB radix select over order-preserving u32 keys (256-bin
//   shared histograms, integer atomics only) finds the k-th key K and how many entries equal to K
//   are needed; then one ascending pass keeps every key > K and the lowest-index keys == K, and
//   compacts them with block-wide exclusive scans, so the output is ascending by construction.
//   Launch: grid (T), block IDX_TOPK_THREADS (256). Requires k ≥ 1.

#define IDX_KT 16
#define IDX_G 16
#define IDX_MAXHD 128
#define IDX_MAXQ 8192
#define IDX_TOPK_THREADS 256

extern "C" __global__ void __launch_bounds__(256)
indexer_scores_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ w,
                   float* __restrict__ scores, int heads, int hd, int n, int ratio, int pos0, float scale) {
    __shared__ float4 qs[IDX_MAXQ / 4];
    __shared__ float4 ks[IDX_KT * (IDX_MAXHD + 4) / 4];
    __shared__ float part[IDX_G * IDX_KT];

    const int t = blockIdx.y;
    const int j0 = blockIdx.x * IDX_KT;
    const int tid = threadIdx.x;
    const int visible = min((pos0 + t + 1) / ratio, n);
    float* srow = scores + (size_t)t * n;

    if (j0 >= visible) {  // block-uniform: the whole tile is masked
        if (tid < IDX_KT && j0 + tid < n) srow[j0 + tid] = __int_as_float(0xff800000);
        return;
    }

    const int hd4 = hd >> 2;
    const int ks_stride4 = hd4 + 1;  // (hd + 4) / 4
    const float4* q4 = reinterpret_cast<const float4*>(q + (size_t)t * heads * hd);
    for (int i = tid; i < heads * hd4; i += blockDim.x) qs[i] = q4[i];
    const float4* k4 = reinterpret_cast<const float4*>(k);
    for (int i = tid; i < IDX_KT * hd4; i += blockDim.x) {
        int jj = i / hd4, d4 = i - jj * hd4;
        int key = j0 + jj;
        ks[jj * ks_stride4 + d4] = key < visible ? k4[(size_t)key * hd4 + d4] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();

    const int j = tid % IDX_KT, g = tid / IDX_KT;
    const float* wt = w + (size_t)t * heads;
    float s = 0.f;
    for (int h = g; h < heads; h += IDX_G) {
        const float4* qh = qs + h * hd4;
        const float4* kj = ks + j * ks_stride4;
        float dot = 0.f;
        for (int d4 = 0; d4 < hd4; d4++) {
            float4 a = qh[d4], b = kj[d4];
            dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
        s += wt[h] * fmaxf(dot, 0.f);
    }
    part[g * IDX_KT + j] = s;
    __syncthreads();
    if (tid < IDX_KT) {
        const int key = j0 + tid;
        float total = 0.f;
        for (int gg = 0; gg < IDX_G; gg++) total += part[gg * IDX_KT + tid];
        if (key < n) srow[key] = key < visible ? total * scale : __int_as_float(0xff800000);
    }
}

// indexer_scores_tc: the same scores (same arguments and masking) on the tensor cores for
//   heads = 64, hd = 128 (the Flash indexer; switch INDEXER_TC). Block (512-key range, 2 tokens),
//   8 warps = 2 tokens × 4 groups of 16 heads. A warp keeps its 16 heads' queries as split bf16
//   A fragments in registers (q = hi + lo, 64 registers) for the whole block; per 64-key tile the
//   keys go to shared memory as split bf16 ([64][136] × 2 planes) and S = Q·Kᵀ [16 × 64] runs on
//   mma.sync m16n8k16 with three products (hi·hi, hi·lo, lo·hi; f32-level error), f32 accumulation.
//   Then w_h·max(S, 0) is summed over the warp's 16 heads (rows g and g + 8 per thread, then a
//   fixed butterfly over the 8 row groups) and over the 4 head groups in group order through shared
//   memory, times scale. Deterministic (fixed orders, no atomics); differs from indexer_scores_f32
//   by f32 rounding only. Tiles past both tokens' visible ranges are skipped.
//   Extra last arguments T (tokens; the second token of the last pair may not exist) and kb (keys
//   per block, a multiple of 64 up to 512: ITC_KB, or fewer for decode-sized calls to spread a
//   step's keys over more blocks, switch INDEXER_TC_DECODE_TILES; each key's score is the same
//   tile code's whatever kb is, so the same bits).
//   Launch: grid (ceil(N / kb), ceil(T / 2)), block 256, static shared memory
//   2·64·136·2 + 2·4·64·4 = 36,864 bytes.

#define ITC_KT 64          // keys per tile
#define ITC_KB 512         // keys per block
#define ITC_PITCH 136      // bf16 per shared key row (272 B: ldmatrix rows on distinct banks)

// The query side of indexer_scores_tc / indexer_topk_stream: warp (tt, hg) holds token t's heads
// 16·hg .. 16·hg + 15 as split-bf16 A fragments (rows g and g + 8, 8 k-steps of 16) and their weights.
struct ItcQuery {
    u32 qh[8][4], ql[8][4];
    float w0, w1;
};

__device__ __forceinline__ void itc_load_query(ItcQuery& Q, const float* __restrict__ q, const float* __restrict__ w, int t, int hg, int g, int c2) {
    const float* wt = w + (size_t)t * 64;
    const float* qrow0 = q + ((size_t)t * 64 + 16 * hg + g) * 128;
    const float* qrow1 = qrow0 + 8 * 128;
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float* src = ((r & 1) ? qrow1 : qrow0) + 16 * kk + c2 + ((r & 2) ? 8 : 0);
            const float2 v = *reinterpret_cast<const float2*>(src);
            const u32 h = gm_bf16x2(v.x, v.y);
            Q.qh[kk][r] = h;
            Q.ql[kk][r] = gm_bf16x2_lo(v.x, v.y, h);
        }
    }
    Q.w0 = wt[16 * hg + g];
    Q.w1 = wt[16 * hg + g + 8];
}

// One 64-key tile from key j0 (keys ≥ vis_max read as 0), in three steps so that the streaming
// kernel can fetch tile i + 1 while it multiplies tile i: itc_fetch (global → registers, 8 float4
// per thread), itc_store (→ split-bf16 shared tile, after a __syncthreads that ends the previous
// tile's reads), itc_mma (after another __syncthreads). On return of itc_mma part[tt][hg][j] holds
// Σ over warp (tt, hg)'s 16 heads of w_h·max(q_h·k_{j0+j}, 0); the caller adds the 4 head groups in
// group order (itc_total) after a __syncthreads.
struct ItcKeys {
    float4 v[8];
};

__device__ __forceinline__ void itc_fetch(ItcKeys& K, const float* __restrict__ k, int j0, int vis_max, int tid) {
#pragma unroll
    for (int m = 0; m < 8; m++) {
        const int i = tid + 256 * m, r = i >> 5, key = j0 + r;
        K.v[m] = key < vis_max ? __ldg(reinterpret_cast<const float4*>(k + (size_t)key * 128) + (i & 31)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

__device__ __forceinline__ void itc_store(const ItcKeys& K, u16* ks, int tid) {
#pragma unroll
    for (int m = 0; m < 8; m++) {
        const int i = tid + 256 * m, r = i >> 5, c4 = (i & 31) * 4;
        const float4 v = K.v[m];
        u16* hi = ks + r * ITC_PITCH + c4;
        u16* lo = hi + ITC_KT * ITC_PITCH;
        const u32 h0 = gm_bf16x2(v.x, v.y), h1 = gm_bf16x2(v.z, v.w);
        *reinterpret_cast<uint2*>(hi) = make_uint2(h0, h1);
        *reinterpret_cast<uint2*>(lo) = make_uint2(gm_bf16x2_lo(v.x, v.y, h0), gm_bf16x2_lo(v.z, v.w, h1));
    }
}

// A warp's 16 heads × 64 keys accumulator fragments, zeroed.
__device__ __forceinline__ void itc_zero(float (&acc)[8][4]) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
}

// Σ over the warp's heads of w·max(acc, 0): rows g, g + 8 per thread, then the 8 row groups (lanes
// xor 4, 8, 16) → part[tt][hg][key].
__device__ __forceinline__ void itc_heads_sum(float (&acc)[8][4], float w0, float w1, float (*part)[4][ITC_KT], int tt, int hg, int g, int c2) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float v = w0 * fmaxf(acc[j][e], 0.f) + w1 * fmaxf(acc[j][2 + e], 0.f);
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (g == 0) part[tt][hg][8 * j + c2 + e] = v;
        }
    }
}

__device__ __forceinline__ void itc_mma(const ItcQuery& Q, const u16* ks, float (*part)[4][ITC_KT], int lane, int tt, int hg, int g, int c2) {
    const u32 kbase = gm_smem(ks);
    float acc[8][4];
    itc_zero(acc);
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
#pragma unroll
        for (int np = 0; np < 4; np++) {
            const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            const u32 a = kbase + (row * ITC_PITCH + 16 * kk + ((lane >> 3) & 1) * 8) * 2;
            u32 bh[4], bl[4];
            gm_ldsm4(a, bh[0], bh[1], bh[2], bh[3]);
            gm_ldsm4(a + ITC_KT * ITC_PITCH * 2, bl[0], bl[1], bl[2], bl[3]);
#pragma unroll
            for (int x = 0; x < 2; x++) {
                gm_mma(acc[2 * np + x], Q.qh[kk], bh[2 * x], bh[2 * x + 1]);
                gm_mma(acc[2 * np + x], Q.qh[kk], bl[2 * x], bl[2 * x + 1]);
                gm_mma(acc[2 * np + x], Q.ql[kk], bh[2 * x], bh[2 * x + 1]);
            }
        }
    }
    itc_heads_sum(acc, Q.w0, Q.w1, part, tt, hg, g, c2);
}

// indexer_scores_tc's tile: all three steps (every thread of the block calls it).
__device__ __forceinline__ void itc_tile(const ItcQuery& Q, const float* __restrict__ k, int j0, int vis_max, u16* ks,
                                         float (*part)[4][ITC_KT], int tid, int lane, int tt, int hg, int g, int c2) {
    ItcKeys K;
    itc_fetch(K, k, j0, vis_max, tid);
    __syncthreads();  // previous tile's ks / part reads are done
    itc_store(K, ks, tid);
    __syncthreads();
    itc_mma(Q, ks, part, lane, tt, hg, g, c2);
}

// The FP8 scoring variant (INDEXER_FP8): queries and keys as e4m3 with one power-of-two scale per
// 128-wide row (act_quant_fp8: q8/sq [T·64 rows], k8/sk [N rows]); the head weight absorbs the query
// scale (w_h·s_q,h, exact: a power of two), the key scale multiplies the sum. One mma.sync m16n8k32
// e4m3 per 16 heads × 8 keys × 32 dims (the split-bf16 path needs six m16n8k16 for the same work).
// Shared key tile: [64][ITC8_PITCH] bytes (144: ldmatrix rows on distinct banks).
#define ITC8_PITCH 144
struct ItcQuery8 {
    u32 a[4][4];
    float w0, w1;
};

struct ItcKeys8 {
    uint4 v[2];
};

__device__ __forceinline__ void itc8_load_query(ItcQuery8& Q, const u8* __restrict__ q8, const float* __restrict__ sq, const float* __restrict__ w,
                                                int t, int hg, int g, int lane) {
    const size_t r0 = (size_t)t * 64 + 16 * hg + g, r1 = r0 + 8;
    const int c = (lane & 3) * 4;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        Q.a[kk][0] = *reinterpret_cast<const u32*>(q8 + r0 * 128 + 32 * kk + c);
        Q.a[kk][1] = *reinterpret_cast<const u32*>(q8 + r1 * 128 + 32 * kk + c);
        Q.a[kk][2] = *reinterpret_cast<const u32*>(q8 + r0 * 128 + 32 * kk + 16 + c);
        Q.a[kk][3] = *reinterpret_cast<const u32*>(q8 + r1 * 128 + 32 * kk + 16 + c);
    }
    Q.w0 = w[r0] * sq[r0];
    Q.w1 = w[r1] * sq[r1];
}

__device__ __forceinline__ void itc8_fetch(ItcKeys8& K, const u8* __restrict__ k8, int j0, int vis_max, int tid) {
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int i = tid + 256 * m, r = i >> 3, key = j0 + r;
        K.v[m] = key < vis_max ? __ldg(reinterpret_cast<const uint4*>(k8 + (size_t)key * 128) + (i & 7)) : make_uint4(0u, 0u, 0u, 0u);
    }
}

__device__ __forceinline__ void itc8_store(const ItcKeys8& K, u8* ks8, int tid) {
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const int i = tid + 256 * m, r = i >> 3;
        *reinterpret_cast<uint4*>(ks8 + r * ITC8_PITCH + (i & 7) * 16) = K.v[m];
    }
}

__device__ __forceinline__ void itc8_mma(const ItcQuery8& Q, const u8* ks8, float (*part)[4][ITC_KT], int lane, int tt, int hg, int g, int c2) {
    const u32 kbase = gm_smem(ks8);
    float acc[8][4];
    itc_zero(acc);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        u32 b[8][2];
#pragma unroll
        for (int np = 0; np < 4; np++) {
            const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            gm_ldsm4(kbase + row * ITC8_PITCH + 32 * kk + ((lane >> 3) & 1) * 16, b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1]);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) gm_mma_e4m3(acc[j], Q.a[kk], b[j][0], b[j][1]);
    }
    itc_heads_sum(acc, Q.w0, Q.w1, part, tt, hg, g, c2);
}

// The score of key j0 + kj for the block's token ti (before the visibility test), after itc_tile
// and a __syncthreads.
__device__ __forceinline__ float itc_total(float (*part)[4][ITC_KT], int ti, int kj, float scale) {
    return (((part[ti][0][kj] + part[ti][1][kj]) + part[ti][2][kj]) + part[ti][3][kj]) * scale;
}

extern "C" __global__ void __launch_bounds__(256, 1)
indexer_scores_tc(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ w,
                  float* __restrict__ scores, int heads, int hd, int n, int ratio, int pos0, float scale, int T, int kb) {
    __shared__ __align__(16) u16 ks[2 * ITC_KT * ITC_PITCH];
    __shared__ float part[2][4][ITC_KT];
    if (heads != 64 || hd != 128 || kb < ITC_KT || kb > ITC_KB || kb % ITC_KT != 0) __trap();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tt = warp >> 2, hg = warp & 3;
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int t0 = blockIdx.y * 2;
    const int t = t0 + tt;
    const bool tvalid = t < T;              // warp-uniform
    const bool second = t0 + 1 < T;         // the block's second token exists
    const int key0 = blockIdx.x * kb;
    // Visible ranges of the block's tokens (they grow with the position).
    const int vis0 = min((pos0 + t0 + 1) / ratio, n);
    const int vis1 = second ? min((pos0 + t0 + 2) / ratio, n) : vis0;
    const int vis_max = vis1;
    ItcQuery Q;
    itc_load_query(Q, q, w, tvalid ? t : t0, hg, g, c2);
    for (int j0 = key0; j0 < min(key0 + kb, n); j0 += ITC_KT) {  // block-uniform
        if (j0 >= vis_max) {
            // Masked tile for both tokens.
            for (int i = tid; i < 2 * ITC_KT; i += 256) {
                const int tk = t0 + i / ITC_KT, key = j0 + i % ITC_KT;
                if (key < n && (i / ITC_KT == 0 || second)) scores[(size_t)tk * n + key] = __int_as_float(0xff800000);
            }
            continue;
        }
        itc_tile(Q, k, j0, vis_max, ks, part, tid, lane, tt, hg, g, c2);
        __syncthreads();
        if (tid < 2 * ITC_KT) {
            const int ti = tid / ITC_KT, kj = tid % ITC_KT;
            const int key = j0 + kj;
            const int vis = ti == 0 ? vis0 : vis1;
            if (key < n && (ti == 0 || second)) scores[(size_t)(t0 + ti) * n + key] = key < vis ? itc_total(part, ti, kj, scale) : __int_as_float(0xff800000);
        }
    }
}

// Order-preserving map f32 → u32 (ascending floats → ascending keys; the same order as total_cmp:
// −NaN < −inf < … < −0 < +0 < … < +inf < +NaN).
__device__ __forceinline__ u32 fs_order_key(float f) {
    u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The threads that run a selection together (fs_block_excl_scan, fs_radix_kth, fs_compact_top):
// the whole block (FsBlock, __syncthreads) or one warpgroup of 128 threads (FsWarpGroup: named
// barrier 1 + id, so the warpgroups of a block select independently).
struct FsBlock {
    __device__ __forceinline__ unsigned tid() const { return threadIdx.x; }
    __device__ __forceinline__ unsigned size() const { return blockDim.x; }
    __device__ __forceinline__ void sync() const { __syncthreads(); }
};
struct FsWarpGroup {
    int id;
    __device__ __forceinline__ unsigned tid() const { return threadIdx.x & 127u; }
    __device__ __forceinline__ unsigned size() const { return 128u; }
    __device__ __forceinline__ void sync() const { asm volatile("bar.sync %0, 128;" ::"r"(1 + id) : "memory"); }
};

// Group-wide exclusive prefix sum of v (group size a multiple of 32, ≤ 1024); *total gets the
// group's sum. Every thread of the group must call it (it synchronizes); wsum holds ≥ 32 ints.
template <class G = FsBlock>
__device__ __forceinline__ int fs_block_excl_scan(int v, int* wsum, int* total, G grp = G()) {
    const int lane = grp.tid() & 31, warp = grp.tid() >> 5, nwarps = grp.size() >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) wsum[warp] = x;
    grp.sync();
    int before = 0, all = 0;
    for (int i = 0; i < nwarps; i++) {
        int s = wsum[i];
        if (i < warp) before += s;
        all += s;
    }
    grp.sync();  // wsum is reused by the next call
    *total = all;
    return before + x - v;
}

// Radix select of the k-th largest of n keys key_of(j) (order-preserving u32, j < n, k ≤ n): MSB
// passes of 8-bit digits over 256-bin shared histograms (integer atomics). Returns K; *want_out =
// how many keys == K belong to the top k (≥ 1). Every thread of the group calls it (it synchronizes).
// The digit holding the k-th key is found by the group's first warp (lane ℓ sums bins 8ℓ … 8ℓ + 7,
// a suffix sum over the lanes picks the lane, that lane walks its 8 bins): the digit and count of a
// walk from bin 255 down, in ~20 steps instead of up to 256. COMMON (for short buffers whose keys
// share their high bits, e.g. the indexer's candidates above a threshold): a first pass takes the
// keys' minimum and maximum, and the digits start at their highest differing bit — fewer passes, and
// the first one's keys spread over the bins instead of queueing on one bin's atomics. The same K and
// count either way (they are defined by the keys alone).
template <bool COMMON = false, class KeyOf, class G = FsBlock>
__device__ __forceinline__ u32 fs_radix_kth(KeyOf key_of, int n, int k, int* hist, u32* s_prefix, int* s_want, int* want_out, G grp = G()) {
    const int tid = grp.tid();
    u32 prefix = 0u, mask = 0u;
    int want = k;
    int top = 31;  // the highest bit the digits still have to cover
    if constexpr (COMMON) {
        u32 lo = 0xffffffffu, hi = 0u;
        for (int j = tid; j < n; j += grp.size()) {
            const u32 key = key_of(j);
            lo = min(lo, key);
            hi = max(hi, key);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        }
        const int nw = grp.size() >> 5;
        if ((tid & 31) == 0) {
            hist[2 * (tid >> 5)] = (int)lo;
            hist[2 * (tid >> 5) + 1] = (int)hi;
        }
        grp.sync();
        for (int w = 0; w < nw; w++) {
            lo = min(lo, (u32)hist[2 * w]);
            hi = max(hi, (u32)hist[2 * w + 1]);
        }
        grp.sync();  // hist is zeroed by the first pass
        if (lo == hi) {  // every key equal (n ≥ k ≥ 1): the k-th is that key, k of them wanted
            *want_out = k;
            return lo;
        }
        top = 31 - __clz(lo ^ hi);
        mask = top == 31 ? 0u : ~((2u << top) - 1u);
        prefix = lo & mask;
    }
    for (; top >= 0; top -= 8) {
        const int shift = max(top - 7, 0);
        const u32 dmask = (2u << (top - shift)) - 1u;  // the digit's bits (8, or fewer in the last pass)
        for (int i = tid; i < 256; i += grp.size()) hist[i] = 0;
        grp.sync();
        for (int j = tid; j < n; j += grp.size()) {
            const u32 key = key_of(j);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & dmask], 1);
        }
        grp.sync();
        if (tid < 32) {
            int c[8], lane_sum = 0;
#pragma unroll
            for (int b = 0; b < 8; b++) {
                c[b] = hist[8 * tid + b];
                lane_sum += c[b];
            }
            int suffix = lane_sum;  // Σ over lanes ≥ this one
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_down_sync(0xffffffffu, suffix, o);
                if (tid + o < 32) suffix += y;
            }
            const u32 reach = __ballot_sync(0xffffffffu, suffix >= want);
            const int L = reach ? 31 - __clz((int)reach) : 0;  // the highest lane whose suffix reaches want
            if (tid == L) {
                int above = suffix - lane_sum, d = 0;  // Σ over the bins above this lane's
                bool found = false;
#pragma unroll
                for (int b = 7; b > 0; b--) {  // unrolled: c stays in registers
                    if (!found) {
                        if (above + c[b] >= want) {
                            d = b;
                            found = true;
                        } else {
                            above += c[b];
                        }
                    }
                }
                *s_prefix = prefix | ((u32)(8 * L + d) << shift);
                *s_want = want - above;
            }
        }
        grp.sync();
        prefix = *s_prefix;
        want = *s_want;
        mask |= dmask << shift;
        grp.sync();  // everyone has read s_prefix/s_want and hist before the next pass
    }
    *want_out = want;
    return prefix;
}

// The top k of n keys in position order: keeps key_of(j) > K and the `want` first keys == K
// ((K, want) from fs_radix_kth), calling keep(at, key, val) with at = the rank among the kept
// (ascending in j) and val = val_of(j). Chunks of FS_COMPACT_E keys per thread (consecutive, so the
// threads' order is the keys'), one group-wide exclusive scan per chunk of the counts of keys > K
// and == K packed in one int (16 bits each: a chunk holds ≤ 4,096 keys): a key's rank among the
// kept is (keys > K before it) + min(keys == K before it, want). Every thread of the group calls
// it. Keys and values of a chunk are read before its scan (which synchronizes) and keep() runs after
// it, so keep may overwrite positions ≤ j (in-place compaction). The callers reading global memory
// (indexer_topk_f32, logits_topk_f32) take 4 too: the radix top-k over a 2,048 × 32,768 score matrix
// took 0.94 ms with 4 and 1.04 with 1 (H200, ae2d22f and 03cd713; 0.87 at 24ac732 with 1: run-to-run
// spread of ~10 % on this timing).
#define FS_COMPACT_E 4
template <int E = FS_COMPACT_E, class KeyOf, class ValOf, class Keep, class G = FsBlock>
__device__ __forceinline__ void fs_compact_top(KeyOf key_of, ValOf val_of, int n, u32 K, int want, int* wsum, Keep keep, G grp = G()) {
    int eq_base = 0, gt_base = 0;
    for (int b0 = 0; b0 < n; b0 += E * (int)grp.size()) {  // group-uniform trip count
        const int j0 = b0 + E * (int)grp.tid();
        u32 key[E];
        int val[E], flag[E], mine = 0;  // flag: 1 for a key > K, 0x10000 for a key == K
#pragma unroll
        for (int e = 0; e < E; e++) {
            const bool in = j0 + e < n;
            key[e] = in ? key_of(j0 + e) : 0u;
            val[e] = in ? val_of(j0 + e) : 0;
            flag[e] = !in ? 0 : key[e] > K ? 1 : key[e] == K ? 0x10000 : 0;
            mine += flag[e];
        }
        int total;
        int before = fs_block_excl_scan(mine, wsum, &total, grp);
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int gt_rank = gt_base + (before & 0xffff), eq_rank = eq_base + (before >> 16);
            if (flag[e] == 1 || (flag[e] != 0 && eq_rank < want)) keep(gt_rank + min(eq_rank, want), key[e], val[e]);
            before += flag[e];
        }
        gt_base += total & 0xffff;
        eq_base += total >> 16;
    }
    grp.sync();
}

extern "C" __global__ void __launch_bounds__(IDX_TOPK_THREADS)
indexer_topk_f32(const float* __restrict__ scores, const int* __restrict__ offsets, int* __restrict__ idx, int n,
                 int k, int ratio, int pos0) {
    __shared__ int hist[256];
    __shared__ int wsum[32];
    __shared__ u32 s_prefix;
    __shared__ int s_want;

    const int t = blockIdx.x;
    const int tid = threadIdx.x;
    const int visible = min((pos0 + t + 1) / ratio, n);
    const float* row = scores + (size_t)t * n;
    int* dst = idx + offsets[t];

    if (visible <= k) {  // block-uniform: every visible entry, ascending
        for (int j = tid; j < visible; j += blockDim.x) dst[j] = j;
        return;
    }
    auto key_of = [row](int j) { return fs_order_key(row[j]); };
    int want;
    const u32 K = fs_radix_kth(key_of, visible, k, hist, &s_prefix, &s_want, &want);
    fs_compact_top(key_of, [](int j) { return j; }, visible, K, want, wsum, [dst](int at, u32, int j) { dst[at] = j; });
}

// logits_topk_f32: sampling on the device (issue 5 §3; sampler.rs `TopLogits`, `Gpu::logits_top`):
//   per row r of logits [R, V] f32: info[2r] = entries ≠ −inf, info[2r + 1] = the lowest index holding
//   NaN or +inf (V if none); when there is none and some entry is unmasked, the kk = min(k, info[2r])
//   most likely tokens under the sampler's order — higher logit first (−0 equal to +0), then lower
//   id — go to ids[r·k ..] / vals[r·k ..] (the logit as stored), ascending by id (the host sorts).
//   The same radix select and compaction as indexer_topk_f32 (−inf keys rank below every finite
//   one, so with kk ≤ unmasked none is taken). Launch: grid R, block IDX_TOPK_THREADS. k ≥ 1.
extern "C" __global__ void __launch_bounds__(IDX_TOPK_THREADS)
logits_topk_f32(const float* __restrict__ logits, int V, int k, int* __restrict__ info, int* __restrict__ ids, float* __restrict__ vals) {
    __shared__ int hist[256];
    __shared__ int wsum[32];
    __shared__ u32 s_prefix;
    __shared__ int s_want, s_bad;
    const float* row = logits + (size_t)blockIdx.x * V;
    if (threadIdx.x == 0) s_bad = V;
    __syncthreads();
    int cnt = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = row[j];
        const bool inf = isinf(v);
        if (isnan(v) || (inf && v > 0.0f)) atomicMin(&s_bad, j);
        cnt += (inf && v < 0.0f) ? 0 : 1;
    }
    int unmasked;
    fs_block_excl_scan(cnt, wsum, &unmasked);  // synchronizes: s_bad is final
    const int bad = s_bad;
    if (threadIdx.x == 0) {
        info[2 * blockIdx.x] = unmasked;
        info[2 * blockIdx.x + 1] = bad;
    }
    if (bad < V || unmasked == 0) return;  // block-uniform
    const int kk = min(k, unmasked);
    auto key_of = [row](int j) {
        const float v = row[j];
        return fs_order_key(v == 0.0f ? 0.0f : v);
    };
    int want;
    const u32 K = fs_radix_kth(key_of, V, kk, hist, &s_prefix, &s_want, &want);
    int* oid = ids + (size_t)blockIdx.x * k;
    float* oval = vals + (size_t)blockIdx.x * k;
    fs_compact_top(key_of, [](int j) { return j; }, V, K, want, wsum, [oid, oval, row](int at, u32, int j) {
        oid[at] = j;
        oval[at] = row[j];
    });
}

// indexer_topk_stream: INDEXER_STREAM_TOPK (issue 6 §3) — indexer_scores_tc's scores and
//   indexer_topk_f32's selection in one streaming pass, never writing the [T, N] score matrix.
//   Arguments: indexer_scores_tc's (q, k, w, heads = 64, hd = 128, n, ratio, pos0, scale, T) plus
//   indexer_topk_f32's offsets and idx and the top-k size; idx gets the same lists (ascending).
//   Block = 2 tokens (as indexer_scores_tc), streaming every visible key in 64-key tiles (itc_store +
//   itc_mma: the same products in the same order, so the same score bits; the next tile's keys are
//   fetched into registers while the current one is multiplied). Per token a shared buffer of up to
//   ITS_CAP (order key, entry index) pairs, appended in index order (ballot + prefix count): every
//   score enters until the buffer is first cut, after that only keys above the k-th key K of the
//   last cut (an equal key has a higher index than every kept one, so it ranks below them: the rule
//   "higher score first, then lower index" is kept exactly). When a buffer could overflow (more
//   than ITS_CAP − 64 pairs) it is cut to its top k (fs_radix_kth + fs_compact_top, in place, order
//   kept) and K updated; at the end the top k of the buffer are written. Tokens with at most k
//   visible entries get 0 .. visible − 1 (as indexer_topk_f32); a pair where both tokens have at
//   most k costs no scoring. Deterministic: integer atomics and fixed orders only.
//   Launch: grid (ceil(T / 2)), block 256, static shared 36,864 + 1,200 bytes, dynamic ITS_SMEM
//   (2·ITS_CAP·8 = 32,768) bytes. Requires k ≤ ITS_CAP − 2·ITC_KT (1,920, with a tile of slack);
//   traps otherwise.
#define ITS_CAP 2048
#define ITS_SMEM (2 * ITS_CAP * 8)

// Cuts a buffer of n (order key, entry index) pairs bk / bi to its top k in place, index order
// kept (fs_radix_kth<COMMON> + fs_compact_top on group grp); returns the k-th key K. Every thread of
// the group calls it. COMMON: see fs_radix_kth; E: fs_compact_top's keys per thread.
template <bool COMMON = true, int E = FS_COMPACT_E, class G = FsBlock>
__device__ __forceinline__ u32 fs_cut_pairs(u32* bk, int* bi, int n, int k, int* hist, int* wsum, u32* s_prefix, int* s_want, G grp = G()) {
    auto key_of = [bk](int j) { return bk[j]; };
    int want;
    const u32 K = fs_radix_kth<COMMON>(key_of, n, k, hist, s_prefix, s_want, &want, grp);
    fs_compact_top<E>(
        key_of, [bi](int j) { return bi[j]; }, n, K, want, wsum,
        [bk, bi](int at, u32 key, int e) {
            bk[at] = key;
            bi[at] = e;
        },
        grp);
    return K;
}

// fs_cut_pairs on a warpgroup, out of line: the split-bf16 indexer_topk_wgmma (its queries held in
// registers, 128 of them) spilled in its per-tile loop with the cut inlined.
__device__ __noinline__ u32 fs_cut_pairs_wg(u32* bk, int* bi, int n, int k, int* hist, int* wsum, u32* s_prefix, int* s_want, int wg) {
    return fs_cut_pairs(bk, bi, n, k, hist, wsum, s_prefix, s_want, FsWarpGroup{wg});
}

// Cuts buffer ti to its top k (in place, index order kept) and sets its threshold.
__device__ __forceinline__ void its_cut(u32* bkey, int* bidx, int* cnt, u32* thr, int* have_thr, int ti, int k,
                                        int* hist, int* wsum, u32* s_prefix, int* s_want) {
    const u32 K = fs_cut_pairs(bkey + ti * ITS_CAP, bidx + ti * ITS_CAP, cnt[ti], k, hist, wsum, s_prefix, s_want);
    if (threadIdx.x == 0) {
        cnt[ti] = k;
        thr[ti] = K;
        have_thr[ti] = 1;
    }
    __syncthreads();
}

template <bool FP8>
__device__ __forceinline__ void its_body(const float* __restrict__ q, const u8* __restrict__ q8, const float* __restrict__ sq,
                                         const float* __restrict__ k, const u8* __restrict__ k8, const float* __restrict__ sk,
                                         const float* __restrict__ w, const int* __restrict__ offsets, int* __restrict__ idx,
                                         int heads, int hd, int n, int ratio, int pos0, float scale, int T, int topk) {
    __shared__ __align__(16) u16 ks[2 * ITC_KT * ITC_PITCH];  // split bf16, or e4m3 [64][ITC8_PITCH]
    __shared__ float part[2][4][ITC_KT];
    __shared__ int hist[256];
    __shared__ int wsum[32];
    __shared__ u32 s_prefix;
    __shared__ int s_want;
    __shared__ int cnt[2], have_thr[2];
    __shared__ u32 thr[2];
    __shared__ u32 bal[4];
    extern __shared__ __align__(16) u8 its_sh[];
    {
        u32 dsz;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsz));
        if (dsz < (u32)ITS_SMEM || heads != 64 || hd != 128 || topk < 1 || topk > ITS_CAP - 2 * ITC_KT) __trap();
    }
    u32* bkey = reinterpret_cast<u32*>(its_sh);              // [2][ITS_CAP]
    int* bidx = reinterpret_cast<int*>(bkey + 2 * ITS_CAP);  // [2][ITS_CAP]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tt = warp >> 2, hg = warp & 3;
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int t0 = blockIdx.x * 2;
    const bool second = t0 + 1 < T;
    const int vis[2] = {min((pos0 + t0 + 1) / ratio, n), second ? min((pos0 + t0 + 2) / ratio, n) : 0};
    const bool sel[2] = {vis[0] > topk, second && vis[1] > topk};
    for (int ti = 0; ti < 2; ti++) {
        if ((ti == 0 || second) && !sel[ti]) {
            int* dst = idx + offsets[t0 + ti];
            for (int j = tid; j < vis[ti]; j += blockDim.x) dst[j] = j;
        }
    }
    if (!sel[0] && !sel[1]) return;  // block-uniform
    if (tid < 2) {
        cnt[tid] = 0;
        have_thr[tid] = 0;
    }
    const int tq = (tt == 1 && second) ? t0 + 1 : t0;
    ItcQuery Q;
    ItcQuery8 Q8;
    ItcKeys K;
    ItcKeys8 K8;
    const int vis_max = second ? vis[1] : vis[0];
    if constexpr (FP8) {
        itc8_load_query(Q8, q8, sq, w, tq, hg, g, lane);
        itc8_fetch(K8, k8, 0, vis_max, tid);
    } else {
        itc_load_query(Q, q, w, tq, hg, g, c2);
        itc_fetch(K, k, 0, vis_max, tid);
    }
    for (int j0 = 0; j0 < vis_max; j0 += ITC_KT) {  // block-uniform
        __syncthreads();                              // cnt of the previous tile; ks / part reads done
        for (int ti = 0; ti < 2; ti++)
            if (cnt[ti] > ITS_CAP - ITC_KT) its_cut(bkey, bidx, cnt, thr, have_thr, ti, topk, hist, wsum, &s_prefix, &s_want);
        // This tile to shared memory, the next one's loads in flight during the products.
        if constexpr (FP8) {
            itc8_store(K8, reinterpret_cast<u8*>(ks), tid);
            __syncthreads();
            if (j0 + ITC_KT < vis_max) itc8_fetch(K8, k8, j0 + ITC_KT, vis_max, tid);
            itc8_mma(Q8, reinterpret_cast<const u8*>(ks), part, lane, tt, hg, g, c2);
        } else {
            itc_store(K, ks, tid);
            __syncthreads();
            if (j0 + ITC_KT < vis_max) itc_fetch(K, k, j0 + ITC_KT, vis_max, tid);
            itc_mma(Q, ks, part, lane, tt, hg, g, c2);
        }
        __syncthreads();
        bool cand = false;
        u32 key = 0u;
        const int ti = tid / ITC_KT, kj = tid % ITC_KT;
        if (tid < 2 * ITC_KT) {
            const int e = j0 + kj;
            if (e < vis[ti]) {
                float score = itc_total(part, ti, kj, scale);
                if constexpr (FP8) score *= sk[e];
                key = fs_order_key(score);
                cand = sel[ti] && (!have_thr[ti] || key > thr[ti]);
            }
        }
        const u32 b = __ballot_sync(0xffffffffu, cand);
        if (lane == 0 && warp < 4) bal[warp] = b;
        __syncthreads();
        if (cand) {
            const int at = cnt[ti] + ((warp & 1) ? __popc(bal[warp - 1]) : 0) + __popc(b & ((1u << lane) - 1u));
            bkey[ti * ITS_CAP + at] = key;
            bidx[ti * ITS_CAP + at] = j0 + kj;
        }
        __syncthreads();
        if (tid < 2) cnt[tid] += __popc(bal[2 * tid]) + __popc(bal[2 * tid + 1]);
    }
    __syncthreads();
    for (int ti = 0; ti < 2; ti++) {
        if (!sel[ti]) continue;  // block-uniform
        if (cnt[ti] > topk) its_cut(bkey, bidx, cnt, thr, have_thr, ti, topk, hist, wsum, &s_prefix, &s_want);
        int* dst = idx + offsets[t0 + ti];
        for (int j = tid; j < topk; j += blockDim.x) dst[j] = bidx[ti * ITS_CAP + j];
    }
}

extern "C" __global__ void __launch_bounds__(256, 1)
indexer_topk_stream(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ w,
                    const int* __restrict__ offsets, int* __restrict__ idx, int heads, int hd, int n, int ratio,
                    int pos0, float scale, int T, int topk) {
    its_body<false>(q, nullptr, nullptr, k, nullptr, nullptr, w, offsets, idx, heads, hd, n, ratio, pos0, scale, T, topk);
}

// indexer_topk_stream_fp8 (INDEXER_FP8): the same streaming selection on FP8 scores (ItcQuery8):
//   q8 [T·64 (+ padding), 128] e4m3 and sq [T·64 (+ padding)] f32 (act_quant_fp8 of the index
//   queries, one power-of-two scale per head row), k8 [N (+ padding), 128] e4m3 and sk [N (+ padding)]
//   (the index keys, one scale per key); score = scale · sk[j] · Σ_h (w_h·sq_h)·max(q8_h·k8_j, 0)
//   (f32 accumulation). Same launch as indexer_topk_stream.
extern "C" __global__ void __launch_bounds__(256, 1)
indexer_topk_stream_fp8(const u8* __restrict__ q8, const float* __restrict__ sq, const u8* __restrict__ k8,
                        const float* __restrict__ sk, const float* __restrict__ w, const int* __restrict__ offsets,
                        int* __restrict__ idx, int heads, int hd, int n, int ratio, int pos0, float scale, int T, int topk) {
    its_body<true>(nullptr, q8, sq, nullptr, k8, sk, w, offsets, idx, heads, hd, n, ratio, pos0, scale, T, topk);
}

// ---------------------------------------------------------------------------------------------
// indexer_topk_wgmma (switch INDEXER_WGMMA, sm_90a): indexer_topk_stream's selection with the
//   scores on wgmma instead of mma.sync, four tokens per block.
//   indexer_keys_split first writes the keys [N, 128] f32 as split bf16 (hi = bf16(x), lo =
//   bf16(x − hi), as itc_store) in the layout wgmma reads: 64-key tiles of IWG_TILE = 32 KB, each
//   [plane hi/lo][dims 0–63 / 64–127][64 keys × 128 B, 128-byte swizzled (gw_swz)], keys past N zero.
//   indexer_topk_wgmma: block = IWG_NWG = 4 warpgroups, warpgroup w = token t0 + w (its 64 heads are
//   the wgmma's 64 rows; warp q of it holds heads 16q … 16q + 15 as split-bf16 A fragments in
//   registers, ItcQuery). Thread 0 copies key tiles with cp.async.bulk into a ring of IWG_STAGES
//   stages (full mbarrier: expect_tx; empty: one arrival per warp of the block after its wgmmas
//   completed). Per tile a warpgroup runs, for each of the 8 k-steps of 16 dims, wgmma m64n64k16
//   hi·hi, hi·lo, lo·hi — per accumulator the products and their order of itc_mma — then
//   itc_heads_sum, the four head groups in group order (itc_total's sum) times scale, and the
//   streaming selection of its_body on its own buffer (ITS_CAP pairs, cut to the top k by
//   fs_radix_kth + fs_compact_top on the warpgroup, FsWarpGroup: named barriers, no block barrier
//   in the loop). Tiles past a token's own visible range skip the products (the FP8 kernels below
//   multiply them and discard the scores); tokens with at most k visible entries get 0 … visible − 1.
//   indexer_scores_wgmma: the same scores written to scores [T, N] (−inf past visible) instead of
//   selected (gpu-check compares them with indexer_scores_f32 / _tc).
//   Arguments: indexer_topk_stream's with kt (from indexer_keys_split) for k; the scores variant
//   takes scores [T, N] instead of offsets, idx and k. Launch: grid ceil(T / 4), block 512, dynamic
//   shared memory IWG_SMEM. Requires 64 heads of 128 and (selection) 1 ≤ k ≤ ITS_CAP − 2·ITC_KT;
//   traps otherwise. Deterministic (fixed orders, integer atomics only).
//   indexer_keys_split: k [N, 128] f32 → kt [tiles · IWG_TILE] bytes; grid ceil(tiles · 1024 / 256),
//   block 256 (one thread per key and 8 dims).
#define IWG_NWG 4
#define IWG_THREADS (128 * IWG_NWG)
#define IWG_TILE 32768
#define IWG_STAGES 4
// The FP8 kernels' ring in the same RING bytes: IWG8_STAGES stages of one 64-key tile (64 keys ×
// 128 e4m3 = IWG8_TILE), then the warpgroups' staged queries (IWG_NWG × IWG8_TILE).
#define IWG8_TILE 8192
#define IWG8_STAGES 8
struct IwgLayout {
    static constexpr int RING = 0;                                    // IWG_STAGES × IWG_TILE
    static constexpr int BKEY = RING + IWG_STAGES * IWG_TILE;         // [NWG][ITS_CAP] u32
    static constexpr int BIDX = BKEY + IWG_NWG * ITS_CAP * 4;         // [NWG][ITS_CAP] i32
    static constexpr int PART = BIDX + IWG_NWG * ITS_CAP * 4;         // [NWG][4][64] f32
    static constexpr int HIST = PART + IWG_NWG * 4 * ITC_KT * 4;      // [NWG][256] i32
    static constexpr int WSUM = HIST + IWG_NWG * 256 * 4;             // [NWG][32] i32
    static constexpr int MISC = WSUM + IWG_NWG * 32 * 4;              // [NWG][8]: cnt, have_thr, thr, prefix, want, bal[2]
    static constexpr int BARS = MISC + IWG_NWG * 8 * 4;               // full[ST], empty[ST] (ST ≤ IWG8_STAGES)
    static constexpr int TOTAL = 1024 + BARS + 2 * IWG8_STAGES * 8;   // + 1 KB alignment slack
    static_assert(TOTAL <= 232448, "a block's shared memory");
    static_assert(IWG8_STAGES >= IWG_STAGES && (IWG8_STAGES + IWG_NWG) * IWG8_TILE <= IWG_STAGES * IWG_TILE, "the FP8 ring and queries fit RING");
};
#define IWG_SMEM (IwgLayout::TOTAL)

extern "C" __global__ void __launch_bounds__(256)
indexer_keys_split(const float* __restrict__ k, u8* __restrict__ kt, int n, int tiles) {
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i >= tiles * ITC_KT * 16) return;
    const int row = i >> 4, c = i & 15;  // key row, dims 8c … 8c + 7
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (row < n) {
        const float4* src = reinterpret_cast<const float4*>(k + (size_t)row * 128) + 2 * c;
        a = src[0];
        b = src[1];
    }
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    u32 hi[4], lo[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {  // itc_store's split of each pair
        const u32 h = gm_bf16x2(v[2 * p], v[2 * p + 1]);
        hi[p] = h;
        lo[p] = gm_bf16x2_lo(v[2 * p], v[2 * p + 1], h);
    }
    u8* dst = kt + (size_t)(row >> 6) * IWG_TILE + (c >> 3) * 8192 + gw_swz(row & 63, c & 7);
    *reinterpret_cast<uint4*>(dst) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(dst + 16384) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

// wgmma m64n64k16 bf16 × bf16 → f32, A from registers (ItcQuery fragments), B K-major from shared
// memory (descriptor db); d[j][e] as itc_mma's acc (rows g / g + 8 of the warp's 16, key 8j + c2 + (e & 1)).
__device__ __forceinline__ void iwg_mma(float (&d)[8][4], const u32 (&a)[4], unsigned long long db) {
    GW_ASM("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
           : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// One tile's copy (IWG_TILE or IWG8_TILE bytes) global → shared stage (cp.async.bulk), completing on mbarrier bar (which
// expects the bytes from this arrival).
template <int BYTES>
__device__ __forceinline__ void iwg_copy_tile(u32 dst, const u8* src, u32 bar) {
    GW_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "n"(BYTES) : "memory");
    gws_bulk_copy<BYTES>(dst, src, bar);
}

// wgmma m64n64k32 e4m3 × e4m3 → f32, both operands K-major from shared memory, each descriptor
// given by its low word (gw_desc_lo; alo: 64 keys, blo: 64 heads; the high word 0x40000040 is
// written into the instruction, so that warp-uniform addresses stay in uniform registers instead of
// being rebuilt and moved for every product); d[j][e] = row (key) 16·wq + g + 8·(e >> 1) (wq: the
// warp within the warpgroup), column (head) 8j + c2 + (e & 1). scale_d 0 overwrites d (the first
// product of a tile).
__device__ __forceinline__ void iwg_mma8_lo(float (&d)[8][4], u32 alo, u32 blo, int scale_d) {
    GW_ASM("{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %34, 0;\nmov.b64 da, {%32, 0x40000040};\nmov.b64 db, {%33, 0x40000040};\n"
           "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, da, db, p, 1, 1;\n}\n"
           : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
           : "r"(alo), "r"(blo), "r"(scale_d));
}

// FP8 = INDEXER_FP8's scores (q8/sq, kt = the tiled e4m3 keys, sk), else the split-bf16 ones (q,
// kt = indexer_keys_split's tiles).
template <bool SCORES, bool FP8>
__device__ __forceinline__ void iwg_body(const float* __restrict__ q, const u8* __restrict__ q8, const float* __restrict__ sq,
                                         const u8* __restrict__ kt, const float* __restrict__ sk, const float* __restrict__ w,
                                         const int* __restrict__ offsets, int* __restrict__ idx, float* __restrict__ scores,
                                         int heads, int hd, int n, int ratio, int pos0, float scale, int T, int topk) {
    typedef IwgLayout L;
    constexpr int ST = FP8 ? IWG8_STAGES : IWG_STAGES;
    constexpr int TILE = FP8 ? IWG8_TILE : IWG_TILE;  // bytes of one 64-key tile = one stage
    extern __shared__ __align__(16) u8 iwg_sh[];
    if (blockDim.x != IWG_THREADS || heads != 64 || hd != 128 || (!SCORES && (topk < 1 || topk > ITS_CAP - 2 * ITC_KT))) __trap();
    u8* gbase;
    const u32 base = gw_smem_base(iwg_sh, L::TOTAL, gbase);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int r = tid & 127, g = lane >> 2, c2 = (lane & 3) * 2;
    const FsWarpGroup grp{wg};
    const int t0 = blockIdx.x * IWG_NWG, t = t0 + wg;
    const int last = min(T, t0 + IWG_NWG) - 1;  // the block's last token: the widest visible range
    const bool valid = t < T;                    // warpgroup-uniform
    const int vis = valid ? min((pos0 + t + 1) / ratio, n) : 0;
    const int vis_max = min((pos0 + last + 1) / ratio, n);
    const bool sel = valid && (SCORES ? vis > 0 : vis > topk);
    if (valid && !sel && !SCORES) {
        int* dst = idx + offsets[t];
        for (int j = r; j < vis; j += 128) dst[j] = j;
    }
    if (SCORES && valid) {
        for (int e = vis + r; e < n; e += 128) scores[(size_t)t * n + e] = __int_as_float(0xff800000);
    }
    if (SCORES ? vis_max == 0 : vis_max <= topk) return;  // block-uniform: no token selects
    u32* bkey = reinterpret_cast<u32*>(gbase + L::BKEY) + wg * ITS_CAP;
    int* bidx = reinterpret_cast<int*>(gbase + L::BIDX) + wg * ITS_CAP;
    float(*part)[4][ITC_KT] = reinterpret_cast<float(*)[4][ITC_KT]>(gbase + L::PART + wg * 4 * ITC_KT * 4);
    int* hist = reinterpret_cast<int*>(gbase + L::HIST) + wg * 256;
    int* wsum = reinterpret_cast<int*>(gbase + L::WSUM) + wg * 32;
    int* misc = reinterpret_cast<int*>(gbase + L::MISC) + wg * 8;  // cnt, have_thr, thr, prefix, want, bal[2]
    const u32 full0 = base + L::BARS, empty0 = full0 + 8 * ST;
    const int ntiles = (vis_max + ITC_KT - 1) / ITC_KT;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            gws_bar_init(full0 + 8 * s, 1);
            gws_bar_init(empty0 + 8 * s, IWG_THREADS / 32);
        }
        gws_bar_init_fence();
    }
    if (r == 0) {
        misc[0] = 0;
        misc[1] = 0;
    }
    // FP8: the token's e4m3 queries [64 heads][128] as the product's B operand (128-byte-swizzled,
    // K-major) after the FP8 ring, and the head weights w_h·s_q,h of the 16 heads (8j + c2 + e) this
    // thread's columns hold (both unused, and compiled away, in the split-bf16 kernels).
    // (wg broadcast from lane 0: warp-uniform for the compiler, so the descriptor stays uniform.)
    const u32 qsm = base + (IWG8_STAGES + __shfl_sync(0xffffffffu, wg, 0)) * IWG8_TILE;
    float wf[8][2];
    if constexpr (FP8) {
        const int tq = valid ? t : last;
        const u8* src = q8 + (size_t)tq * 64 * 128;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int id = r + 128 * m, h = id >> 3, c = id & 7;
            *reinterpret_cast<uint4*>(gbase + (IWG8_STAGES + wg) * IWG8_TILE + gw_swz(h, c)) = *reinterpret_cast<const uint4*>(src + h * 128 + 16 * c);
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const size_t hr = (size_t)tq * 64 + 8 * j + c2 + e;
                wf[j][e] = w[hr] * sq[hr];
            }
        gw_fence_proxy();  // the generic stores above, before wgmma reads them (async proxy)
    }
    __syncthreads();
    // Tile i goes to stage i % ST; from round 1 on it waits until every warp released the stage's
    // previous tile (i − ST).
    auto issue = [&](int i) {
        const int s = i % ST;
        if (i >= ST) gws_wait(empty0 + 8 * s, ((i / ST) - 1) & 1);
        iwg_copy_tile<TILE>(base + s * TILE, kt + (size_t)i * TILE, full0 + 8 * s);
    };
    if (tid == 0)
        for (int i = 0; i < min(ST - 1, ntiles); i++) issue(i);
    // Cuts this token's buffer of `count` pairs to its top k (in place, index order kept) and sets
    // its threshold (misc: count = k, have_thr, thr); the warpgroup must have passed a barrier after
    // the last appends. Ends with a warpgroup barrier.
    auto cut = [&](int count) {
        u32 K;
        if constexpr (FP8) K = fs_cut_pairs(bkey, bidx, count, topk, hist, wsum, reinterpret_cast<u32*>(misc + 3), misc + 4, grp);
        else K = fs_cut_pairs_wg(bkey, bidx, count, topk, hist, wsum, reinterpret_cast<u32*>(misc + 3), misc + 4, grp.id);
        if (r == 0) {
            misc[0] = topk;
            misc[1] = 1;
            misc[2] = (int)K;
        }
        grp.sync();
    };

    int cnt8 = 0;  // FP8: the buffer's count, kept by every thread (misc[0] in the other path)
    if constexpr (FP8) {
        // Two accumulators: tile i + 1's products run while tile i's scores are summed.
        // No wgmma is issued under a branch (ptxas would serialise them all, C7518 / C7520): every
        // warpgroup multiplies every tile of the block (a token past its visible range discards
        // them), and the steps come in pairs: the last real step and, for an odd tile count, a
        // step past the tiles each multiply the last tile again (1 or 2 redundant groups; its stage
        // still holds it: nothing is copied after it) and discard the result.
        // acc_a / acc_b need no zeroing: a tile's first product overwrites them (scale-d 0).
        // The selection runs once per pair of tiles (one ballot and one warpgroup barrier for 128
        // keys): lanes 0–15 of warp wq hold key 16·wq + lane of the pair's first tile, lanes 16–31
        // key 16·wq + lane − 16 of its second, and the pair's candidates are appended in index order.
        float acc_a[8][4], acc_b[8][4];
        auto works = [&](int i) { return sel && i * ITC_KT < vis; };  // warpgroup-uniform, falls once
        // Waits for tile min(i, ntiles − 1) and issues its four products into acc (one group).
        auto products = [&](int i, float(&acc)[8][4]) {
            const int ii = min(i, ntiles - 1);
            gws_wait(full0 + 8 * (ii % ST), (ii / ST) & 1);
            __syncwarp();
            gw_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) iwg_mma8_lo(acc, gw_desc_lo(base + (ii % ST) * TILE) + 2 * kk, gw_desc_lo(qsm) + 2 * kk, kk);  // dims 32kk … 32kk + 31
            gw_commit();
        };
        // Rows are keys: Σ over the thread's 16 heads of w·max(S, 0) for keys g and g + 8 of the
        // warp's 16, then over the 4 lanes of a row (xor 1, 2); every lane gets key (lane & 15)'s sum.
        auto heads_sum = [&](const float(&acc)[8][4]) -> float {
            float v0 = 0.f, v1 = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    v0 = fmaf(wf[j][x], fmaxf(acc[j][x], 0.f), v0);
                    v1 = fmaf(wf[j][x], fmaxf(acc[j][2 + x], 0.f), v1);
                }
            v0 += __shfl_xor_sync(0xffffffffu, v0, 1);
            v1 += __shfl_xor_sync(0xffffffffu, v1, 1);
            v0 += __shfl_xor_sync(0xffffffffu, v0, 2);
            v1 += __shfl_xor_sync(0xffffffffu, v1, 2);
            const float a0 = __shfl_sync(0xffffffffu, v0, 4 * (lane & 7)), a1 = __shfl_sync(0xffffffffu, v1, 4 * (lane & 7));
            return (lane & 8) ? a1 : a0;
        };
        float sc = 0.f, ske = 0.f;  // this lane's key of the pair: its head sum, its key scale
        int e = 0;                  // … and its index
        bool mine = false;          // … and whether it is visible to the token
        // Step i (tile i's products complete, waited at the end of step i − 1): tile i + 1's are
        // issued, tile i's heads summed while they run, and at the pair's second step the pair's
        // keys selected; then the products are waited for (nothing is in flight across steps:
        // ptxas would serialise the products otherwise, C7514).
        auto step = [&](int i, float(&acc)[8][4], float(&next)[8][4]) {
            const bool second = (i & 1) != 0;
            const int p = i & ~1;  // the pair's first tile
            if (tid == 0 && i + ST - 1 < ntiles) issue(i + ST - 1);
            if (!second) {
                e = (p + (lane >> 4)) * ITC_KT + 16 * wq + (lane & 15);
                mine = sel && e < vis;
                ske = mine ? __ldg(sk + e) : 0.f;  // loaded while the products run
            }
            __syncwarp();
            if (lane == 0 && i < ntiles) gws_arrive(empty0 + 8 * (i % ST));  // this warp is done with the stage
            products(i + 1, next);
            if (works(p)) {  // warpgroup-uniform
                const float v = heads_sum(acc);
                if ((lane >= 16) == second) sc = v;
                if (second) {
                    if (!SCORES && cnt8 > ITS_CAP - 2 * ITC_KT) {
                        grp.sync();  // the previous pairs' appends
                        cut(cnt8);
                        cnt8 = topk;
                    }
                    bool cand = false;
                    u32 key = 0u;
                    if (mine) {
                        const float score = sc * scale * ske;
                        if constexpr (SCORES) {
                            scores[(size_t)t * n + e] = score;
                        } else {
                            key = fs_order_key(score);
                            cand = !misc[1] || key > (u32)misc[2];
                        }
                    }
                    if constexpr (!SCORES) {
                        // Appended in index order (the first tile's keys by warp, then the second's),
                        // one warpgroup barrier per pair: the ballots go to part, alternating halves by
                        // pair (a warp writing pair P's half has passed pair P − 1's barrier, after every
                        // read of pair P − 2's); the appends of successive pairs go to disjoint slots,
                        // and a cut first waits for all of them.
                        int* bal = reinterpret_cast<int*>(part) + 4 * ((p >> 1) & 1);
                        const u32 b = __ballot_sync(0xffffffffu, cand);
                        if (lane == 0) bal[wq] = (int)b;
                        grp.sync();
                        int lo_before = 0, lo_all = 0, hi_before = 0, all = 0;
#pragma unroll
                        for (int x = 0; x < 4; x++) {
                            const u32 c = (u32)bal[x];
                            const int lo = __popc(c & 0xffffu), hi = __popc(c >> 16);
                            lo_before += x < wq ? lo : 0;
                            hi_before += x < wq ? hi : 0;
                            lo_all += lo;
                            all += lo + hi;
                        }
                        if (cand) {
                            const u32 below = b & ((1u << lane) - 1u);
                            const int at = cnt8 + (lane < 16 ? lo_before + __popc(below) : lo_all + hi_before + __popc(below & 0xffff0000u));
                            bkey[at] = key;
                            bidx[at] = e;
                        }
                        cnt8 += all;
                    }
                }
            }
            gw_wait0();
            gw_fence_regs(reinterpret_cast<float(&)[32]>(next));
        };

        products(0, acc_a);
        gw_wait0();
        gw_fence_regs(reinterpret_cast<float(&)[32]>(acc_a));
        for (int i = 0; i < ntiles; i += 2) {
            step(i, acc_a, acc_b);
            step(i + 1, acc_b, acc_a);
        }
    } else {
        ItcQuery Q;
        itc_load_query(Q, q, w, valid ? t : last, wq, g, c2);
        for (int i = 0; i < ntiles; i++) {
            if (tid == 0 && i + ST - 1 < ntiles) issue(i + ST - 1);
            const int s = i % ST, j0 = i * ITC_KT;
            const bool work = sel && j0 < vis;  // warpgroup-uniform
            if (!SCORES && work) {
                grp.sync();  // cnt of the previous tile
                if (misc[0] > ITS_CAP - ITC_KT) cut(misc[0]);
            }
            gws_wait(full0 + 8 * s, (i / ST) & 1);
            float acc[8][4];
            itc_zero(acc);
            if (work) {
                const u32 sb = base + s * IWG_TILE;
                __syncwarp();
                gw_fence();
#pragma unroll
                for (int kk = 0; kk < 8; kk++) {
                    const unsigned long long dh = gw_desc(sb + (kk >> 2) * 8192) + 2 * (kk & 3);
                    const unsigned long long dl = gw_desc(sb + 16384 + (kk >> 2) * 8192) + 2 * (kk & 3);
                    iwg_mma(acc, Q.qh[kk], dh);
                    iwg_mma(acc, Q.qh[kk], dl);
                    iwg_mma(acc, Q.ql[kk], dh);
                }
                gw_commit();
                gw_wait0();
                gw_fence_regs(reinterpret_cast<float(&)[32]>(acc));
            }
            __syncwarp();
            if (lane == 0) gws_arrive(empty0 + 8 * s);  // this warp is done with the stage
            if (!work) continue;                        // warpgroup-uniform
            itc_heads_sum(acc, Q.w0, Q.w1, part, 0, wq, g, c2);
            grp.sync();
            bool cand = false;
            u32 key = 0u;
            if (r < ITC_KT) {
                const int e = j0 + r;
                if (e < vis) {
                    const float score = itc_total(part, 0, r, scale);
                    if constexpr (SCORES) {
                        scores[(size_t)t * n + e] = score;
                    } else {
                        key = fs_order_key(score);
                        cand = !misc[1] || key > (u32)misc[2];
                    }
                }
            }
            if constexpr (SCORES) {
                grp.sync();  // part is rewritten by the next tile
            } else {
                const u32 b = __ballot_sync(0xffffffffu, cand);
                if (lane == 0 && wq < 2) misc[5 + wq] = (int)b;
                grp.sync();
                if (cand) {
                    const int at = misc[0] + (wq == 1 ? __popc((u32)misc[5]) : 0) + __popc(b & ((1u << lane) - 1u));
                    bkey[at] = key;
                    bidx[at] = j0 + r;
                }
                grp.sync();
                if (r == 0) misc[0] += __popc((u32)misc[5]) + __popc((u32)misc[6]);
            }
        }
    }
    if (SCORES || !sel) return;  // warpgroup-uniform
    grp.sync();
    const int count = FP8 ? cnt8 : misc[0];
    if (count > topk) {
        if constexpr (FP8) fs_cut_pairs(bkey, bidx, count, topk, hist, wsum, reinterpret_cast<u32*>(misc + 3), misc + 4, grp);
        else fs_cut_pairs_wg(bkey, bidx, count, topk, hist, wsum, reinterpret_cast<u32*>(misc + 3), misc + 4, grp.id);
    }
    int* dst = idx + offsets[t];
    for (int j = r; j < topk; j += 128) dst[j] = bidx[j];
}

extern "C" __global__ void __launch_bounds__(IWG_THREADS, 1)
indexer_topk_wgmma(const float* __restrict__ q, const u8* __restrict__ kt, const float* __restrict__ w,
                   const int* __restrict__ offsets, int* __restrict__ idx, int heads, int hd, int n, int ratio,
                   int pos0, float scale, int T, int topk) {
    iwg_body<false, false>(q, nullptr, nullptr, kt, nullptr, w, offsets, idx, nullptr, heads, hd, n, ratio, pos0, scale, T, topk);
}

extern "C" __global__ void __launch_bounds__(IWG_THREADS, 1)
indexer_scores_wgmma(const float* __restrict__ q, const u8* __restrict__ kt, const float* __restrict__ w,
                     float* __restrict__ scores, int heads, int hd, int n, int ratio, int pos0, float scale, int T) {
    iwg_body<true, false>(q, nullptr, nullptr, kt, nullptr, w, nullptr, nullptr, scores, heads, hd, n, ratio, pos0, scale, T, 1);
}

// indexer_topk_wgmma_fp8 / indexer_scores_wgmma_fp8 (INDEXER_FP8 with INDEXER_WGMMA, sm_90a): the
//   scores of indexer_topk_stream_fp8 (q8/sq: act_quant_fp8 of the index queries, one scale per head
//   row, folded into the head weight; sk: the keys' scales; score = scale · sk[j] · Σ_h
//   (w_h·sq_h)·max(q8_h·k8_j, 0)) in indexer_topk_wgmma's pipeline: per 64-key tile one wgmma
//   m64n64k32 e4m3 per 32 dims (4 instead of 24 split-bf16 m64n64k16). kt: the e4m3 keys in
//   act_quant_fp8's tiled layout (mode 2, gemm_q8.cu gq_tiled with K = 128: IWG8_TILE = 8 KB per 64
//   keys, 64 rows of 128 bytes, 16-byte chunk c of key r at gw_swz(r, c); rows past N zero), sk its
//   scales. Arguments otherwise and launch as indexer_topk_wgmma / indexer_scores_wgmma.
extern "C" __global__ void __launch_bounds__(IWG_THREADS, 1)
indexer_topk_wgmma_fp8(const u8* __restrict__ q8, const float* __restrict__ sq, const u8* __restrict__ kt,
                       const float* __restrict__ sk, const float* __restrict__ w, const int* __restrict__ offsets,
                       int* __restrict__ idx, int heads, int hd, int n, int ratio, int pos0, float scale, int T, int topk) {
    iwg_body<false, true>(nullptr, q8, sq, kt, sk, w, offsets, idx, nullptr, heads, hd, n, ratio, pos0, scale, T, topk);
}

extern "C" __global__ void __launch_bounds__(IWG_THREADS, 1)
indexer_scores_wgmma_fp8(const u8* __restrict__ q8, const float* __restrict__ sq, const u8* __restrict__ kt,
                         const float* __restrict__ sk, const float* __restrict__ w, float* __restrict__ scores, int heads,
                         int hd, int n, int ratio, int pos0, float scale, int T) {
    iwg_body<true, true>(nullptr, q8, sq, kt, sk, w, nullptr, nullptr, scores, heads, hd, n, ratio, pos0, scale, T, 1);
}

// indexer_topk_mask_u8: the mask path of DIRECT_INDEXER_TOPK=off (issue 6 §2). offsets [T + 1] and
//   idx [offsets[T]] i32 are indexer_topk_f32's lists; mask [T, n] u8 must be zero on entry; sets
//   mask[t·n + e] = 1 for every e in query t's list (0 ≤ e < n; others ignored).
//   Launch: grid (T), block 256.
extern "C" __global__ void __launch_bounds__(256)
indexer_topk_mask_u8(const int* __restrict__ offsets, const int* __restrict__ idx, u8* __restrict__ mask, int n) {
    const int t = blockIdx.x;
    u8* row = mask + (size_t)t * n;
    for (int i = offsets[t] + (int)threadIdx.x; i < offsets[t + 1]; i += blockDim.x) {
        const int e = idx[i];
        if (e >= 0 && e < n) row[e] = 1;
    }
}
