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
//   Extra last argument T (tokens; the second token of the last pair may not exist).
//   Launch: grid (ceil(N / 512), ceil(T / 2)), block 256, static shared memory
//   2·64·136·2 + 2·4·64·4 = 36,864 bytes.

#define ITC_KT 64          // keys per tile
#define ITC_KB 512         // keys per block
#define ITC_PITCH 136      // bf16 per shared key row (272 B: ldmatrix rows on distinct banks)

extern "C" __global__ void __launch_bounds__(256, 1)
indexer_scores_tc(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ w,
                  float* __restrict__ scores, int heads, int hd, int n, int ratio, int pos0, float scale, int T) {
    __shared__ __align__(16) u16 ks[2 * ITC_KT * ITC_PITCH];
    __shared__ float part[2][4][ITC_KT];
    if (heads != 64 || hd != 128) __trap();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tt = warp >> 2, hg = warp & 3;
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int t0 = blockIdx.y * 2;
    const int t = t0 + tt;
    const bool tvalid = t < T;              // warp-uniform
    const bool second = t0 + 1 < T;         // the block's second token exists
    const int key0 = blockIdx.x * ITC_KB;
    // Visible ranges of the block's tokens (they grow with the position).
    const int vis0 = min((pos0 + t0 + 1) / ratio, n);
    const int vis1 = second ? min((pos0 + t0 + 2) / ratio, n) : vis0;
    const int vis_max = vis1;
    const float* wt = w + (size_t)(tvalid ? t : t0) * 64;
    // Query fragments (split bf16), rows g and g + 8 of the warp's 16 heads, 8 k-steps of 16.
    u32 qh[8][4], ql[8][4];
    const float* qrow0 = q + ((size_t)(tvalid ? t : t0) * 64 + 16 * hg + g) * 128;
    const float* qrow1 = qrow0 + 8 * 128;
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float* src = ((r & 1) ? qrow1 : qrow0) + 16 * kk + c2 + ((r & 2) ? 8 : 0);
            const float2 v = *reinterpret_cast<const float2*>(src);
            const u32 h = gm_bf16x2(v.x, v.y);
            qh[kk][r] = h;
            ql[kk][r] = gm_bf16x2(v.x - __uint_as_float(h << 16), v.y - __uint_as_float(h & 0xffff0000u));
        }
    }
    const float w0 = wt[16 * hg + g], w1 = wt[16 * hg + g + 8];
    const u32 kbase = gm_smem(ks);
    for (int j0 = key0; j0 < min(key0 + ITC_KB, n); j0 += ITC_KT) {  // block-uniform
        if (j0 >= vis_max) {
            // Masked tile for both tokens.
            for (int i = tid; i < 2 * ITC_KT; i += 256) {
                const int tk = t0 + i / ITC_KT, key = j0 + i % ITC_KT;
                if (key < n && (i / ITC_KT == 0 || second)) scores[(size_t)tk * n + key] = __int_as_float(0xff800000);
            }
            continue;
        }
        __syncthreads();  // previous tile's ks / part reads are done
        for (int i = tid; i < ITC_KT * 32; i += 256) {
            const int r = i >> 5, c4 = (i & 31) * 4;
            const int key = j0 + r;
            const float4 v = key < vis_max ? __ldg(reinterpret_cast<const float4*>(k + (size_t)key * 128) + (i & 31)) : make_float4(0.f, 0.f, 0.f, 0.f);
            u16* hi = ks + r * ITC_PITCH + c4;
            u16* lo = hi + ITC_KT * ITC_PITCH;
            const u32 h0 = gm_bf16x2(v.x, v.y), h1 = gm_bf16x2(v.z, v.w);
            *reinterpret_cast<uint2*>(hi) = make_uint2(h0, h1);
            *reinterpret_cast<uint2*>(lo) = make_uint2(gm_bf16x2(v.x - __uint_as_float(h0 << 16), v.y - __uint_as_float(h0 & 0xffff0000u)),
                                                       gm_bf16x2(v.z - __uint_as_float(h1 << 16), v.w - __uint_as_float(h1 & 0xffff0000u)));
        }
        __syncthreads();
        float acc[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
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
                    gm_mma(acc[2 * np + x], qh[kk], bh[2 * x], bh[2 * x + 1]);
                    gm_mma(acc[2 * np + x], qh[kk], bl[2 * x], bl[2 * x + 1]);
                    gm_mma(acc[2 * np + x], ql[kk], bh[2 * x], bh[2 * x + 1]);
                }
            }
        }
        // Σ over the warp's heads: rows g, g + 8 per thread, then the 8 row groups (lanes xor 4, 8, 16).
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
        __syncthreads();
        if (tid < 2 * ITC_KT) {
            const int ti = tid / ITC_KT, kj = tid % ITC_KT;
            const int key = j0 + kj;
            const int vis = ti == 0 ? vis0 : vis1;
            if (key < n && (ti == 0 || second)) {
                const float total = ((part[ti][0][kj] + part[ti][1][kj]) + part[ti][2][kj]) + part[ti][3][kj];
                scores[(size_t)(t0 + ti) * n + key] = key < vis ? total * scale : __int_as_float(0xff800000);
            }
        }
    }
}

// Order-preserving map f32 → u32 (ascending floats → ascending keys; the same order as total_cmp:
// −NaN < −inf < … < −0 < +0 < … < +inf < +NaN).
__device__ __forceinline__ u32 fs_order_key(float f) {
    u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block-wide exclusive prefix sum of v (blockDim.x a multiple of 32, ≤ 1024); *total gets the block
// sum. Every thread of the block must call it (it synchronizes); wsum holds ≥ 32 ints.
__device__ __forceinline__ int fs_block_excl_scan(int v, int* wsum, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    int before = 0, all = 0;
    for (int i = 0; i < nwarps; i++) {
        int s = wsum[i];
        if (i < warp) before += s;
        all += s;
    }
    __syncthreads();  // wsum is reused by the next call
    *total = all;
    return before + x - v;
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

    // Radix select of the k-th largest key: after the pass at `shift`, `prefix` holds the top bits
    // of K and `want` the number of entries still to take among those matching them (≥ 1).
    u32 prefix = 0u, mask = 0u;
    int want = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int j = tid; j < visible; j += blockDim.x) {
            u32 key = fs_order_key(row[j]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int above = 0, d = 255;
            for (; d > 0; d--) {
                if (above + hist[d] >= want) break;
                above += hist[d];
            }
            s_prefix = prefix | ((u32)d << shift);
            s_want = want - above;
        }
        __syncthreads();
        prefix = s_prefix;
        want = s_want;
        mask |= 255u << shift;
        __syncthreads();  // everyone has read s_prefix/s_want and hist before the next pass
    }

    // Keep keys > K and the `want` lowest-index keys == K, compacted in ascending index order.
    int eq_base = 0, sel_base = 0;
    for (int b0 = 0; b0 < visible; b0 += blockDim.x) {  // block-uniform trip count
        const int j = b0 + tid;
        const bool in = j < visible;
        const u32 key = in ? fs_order_key(row[j]) : 0u;
        const int gt = (in && key > prefix) ? 1 : 0;
        const int eq = (in && key == prefix) ? 1 : 0;
        int eq_total, sel_total;
        const int eq_rank = eq_base + fs_block_excl_scan(eq, wsum, &eq_total);
        const int sel = (gt || (eq && eq_rank < want)) ? 1 : 0;
        const int at = sel_base + fs_block_excl_scan(sel, wsum, &sel_total);
        if (sel) dst[at] = j;
        eq_base += eq_total;
        sel_base += sel_total;
    }
}
