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
