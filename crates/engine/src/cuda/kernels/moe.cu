// moe.cu — the MoE block's own kernels (spec §4.11; sqrtsoftplus and SiLU from spec §3.3). The
// projections (router gate, expert w1/w3/w2, shared expert) run on linear.cu; the host glue that
// chains them for a whole layer is `Gpu::moe_forward` (ops_mhc.rs). CPU reference: forward/moe.rs
// `route` and `moe` (exact mode: γ applied after W2).
//
// router_scores_f32: logits [T, E] f32 (gate·f, from linear.cu) → experts [T, k] int32, weights [T, k] f32.
//   score_e = sqrt(softplus(logit_e)) (torch softplus: linear above 20), or σ(logit_e) when use_sigmoid,
//   computed in f64 and rounded to f32 (as the CPU does).
//   Hash routing (tid2eid != nullptr): experts = tid2eid[ids[t], 0..k) (tid2eid int32 [vocab, k], ids [T]).
//   Score routing (tid2eid == nullptr): top-k of the f32 key score_e + bias_e (bias [E]), ordered like
//     Rust's sort by f32::total_cmp descending with ties to the lower expert index (a NaN key sorts
//     as total_cmp does). Each of the k rounds is a block-wide max of the packed 64-bit key
//     (total-order bits << 32 | ~e): max is exact, so the result does not depend on reduction order.
//   weights_i = score_{e_i} / (Σ_slot score + 1e-20) · route_scale, the sum in f64 in slot order.
//   An out-of-range token id or table entry gives expert −1 and weight NaN for the whole token
//   (the host glue turns that into an error).
//   Launch: grid (T), block MOE_THREADS = 256 (any multiple of 32 up to 1024); E ≤ MOE_MAXE = 1024,
//   1 ≤ k ≤ min(E, MOE_MAXK = 16); static shared 4·1024 + 8·1024 + 8·32 + 4·16 B ≈ 12.6 KB.
//
// swiglu_f32: g, u, h [len] f32 (separate buffers: the w1 and w3 outputs [rows, inter]):
//   h = silu(min(g, L)) · clamp(u, −L, L), silu(v) = v·σ(v). NaN g → L (like Rust f64::min), NaN u stays
//   NaN (like f64::clamp). Launch: grid (min(ceil(len / 256), 65535·16)), block 256, grid-stride loop.
//
// gather_rows_f32: dst [m, d] ← src rows: dst[r] = src[idx[r]] (idx int32 [m], src [src_rows, d]).
// scatter_rows_f32: dst rows ← src [m, d]: dst[idx[r]] = src[r] (dst [dst_rows, d]; indices distinct).
//   An out-of-range index writes a NaN row (gather) or is skipped (scatter).
//   Launch (both): grid (m), block 256.
//
// moe_combine_f32: out[t, i] = Σ_{s<k} γ[t, s]·slot_out[t, s, i] (slot order) + shared[t, i], in f64, then f32:
//   acc = fma(γ_s, v_s, acc) for s = 0 … k − 1 from 0, then + shared (the contraction the compiler had
//   made of `acc += γ·v`, now written out; gpu-check `moe_combine bits` replays it on the host).
//   slot_out [T, k, d] holds the UNscaled routed outputs W2·h; γ = weights [T, k] is applied here (HF order:
//   after W2; weights nullptr: γ = 1, the official order where γ came before W2). experts [T, k] (may be
//   nullptr): a slot whose expert is outside 0..E was never written (the grouped paths leave it
//   unrouted) and counts as 0, γ·0 (NaN γ stays NaN). shared [T, d] may be nullptr (no shared expert).
//   When d % 4 == 0 a thread owns 4 channels (float4 loads, MOE_COMBINE_G slots in flight before
//   their sums; H200, T = 8,192, k 6, d 4,096: see bench/mhc_h200.log `time moe_combine`);
//   otherwise one. Launch: grid (T, ceil(d / (256·c))), c = 4 or 1 channels per thread, block 256.

// Grouping for the grouped MoE GEMM (gemm.cu moe_gemm_*; host glue ops_moe.rs), deterministic
// (integer counts, stable order, no atomics). Pairs i = token·k + slot of experts [T·k], taken in
// chunks c of MOE_GROUP_CHUNK pairs (nch = ceil(T·k / MOE_GROUP_CHUNK)); ids outside 0 … E − 1 belong
// to no expert:
//   moe_group_scan(experts, tk, k, E, cc, row_tok, row_dst, fill): one warp per chunk (grid nch,
//     block 32, dynamic shared memory 4·E bytes) walks its pairs in order, 32 at a time (a pair's
//     rank among the step's pairs of its expert from __match_any_sync, a running count per expert in
//     shared memory). fill 0: cc[c·E + e] = #{i in chunk c : experts[i] = e}. fill 1 (cc now the
//     chunk's first row of each expert, from moe_group_plan): expert e's grouped rows in pair order
//     (token, then slot: the CPU reference's member order): row_tok[r] = token, row_dst[r] = i.
//   moe_group_plan(cc, nch, E, bm, offsets, items, n_items, row_tok, row_dst): counts = Σ_c cc[c·E + e];
//     offsets [E + 1] = exclusive prefix of the counts rounded up to bm (offsets[E] = grouped rows R);
//     items [·][2] = (e, offsets[e] + j·bm) for each of expert e's ceil(count_e / bm) tiles, experts in
//     order; n_items [1]; cc[c·E + e] ← offsets[e] + Σ_{c' < c} cc[c'·E + e]; expert e's padding rows
//     get −1 in row_tok and row_dst. One block of MOE_PLAN_THREADS (E ≤ that).
//   The scan replaced a count and a fill of one block per expert over all T·k pairs (2026-12-01; the
//   same arrays, checked by gpu-check `moe grouping`): O(E·T·k) reads, 0.18 ms per Flash layer at
//   8,192 tokens.
//   moe_gather_bf16(f, row_tok, offsets, xb, d, Kp, lo_plane, split, E): xb [R, Kp] bf16 rows of
//     f [T, d] (zero for padding rows and columns ≥ d), with split also the low halves
//     bf16(x − hi) at lo_plane. Rows ≥ R (unused capacity) are not touched. Grid-stride over
//     (row, 4-column group); any grid, block 256.
//
// moe_gemv_fp4_swiglu / moe_gemv_fp4_down (switch MOE_DECODE_GEMV; host glue ops_moe.rs
// `Gpu::moe_experts_gemv_q8`): the official-numerics MoE of a few routed pairs (decode steps) as one
// gemv per (pair, output row) over FP4 experts, without grouping: each block takes one pair p
// (blockIdx.y; pair p = token·k + slot, expert experts[p]) and MGV_WARPS·MGV_RPW output rows, each warp
// MGV_RPW rows in turn, each lane the 32-value groups g ≡ lane (mod 32) of a row (the row's packed bytes
// read 16 per lane, consecutive lanes on consecutive bytes). The pair's e4m3 input row q [·, ldq] is
// widened into shared memory once per block (float4 chunks XOR-swizzled by group so that 8 lanes on 8
// consecutive groups hit distinct banks). Numerics: y[p, n] = Σ_g sa[b(g)]·2^(s[n,g]−127)·Σ_{i<32}
// q[32g+i]·e2m1[n, 32g+i] — the same definition as gemm_q8.cu's FP4 GEMMs (activation scale per 128
// columns, ue8m0 weight scale per 32), the products exact in f32 (an e2m1 value is decoded as its f32
// bits (nibble & 7) << 22, i.e. value·2^-126, a subnormal for 0.5; compiled without flush-to-zero), each
// group's sum in f32 in column order, then scaled by 2^(s − 1)·sa (exact powers of two), the lanes' sums
// added in a fixed butterfly. Not the tensor-core kernels' bits (their FP8 products accumulate in the
// MMA unit); checked against the CPU's official numerics at the MoE tolerance (gpu-check `moe_q8 … gemv`).
//   swiglu (W = w1 table, W3 = w3 table; N = inter, K = d; q = act_quant_fp8 of the tokens, row p / k):
//     h[p, n] = fs_swiglu(gate, up, limit)·gamma[p] (γ before W2, the official order); a pair whose
//     expert is outside 0 … E − 1 gets h = 0.
//   down (W = w2 table; N = d, K = inter; q = act_quant_fp8 of h, row p): y[p, n]; a pair outside the
//     experts is not written (moe_combine_f32 skips it by its id).
//   _f32 forms (the exact modes: HF numerics, γ applied by moe_combine_f32 after W2): the same with f32
//     inputs x [·, ldx] (the tokens f, then h) instead of e4m3 q and scales, h = fs_swiglu(gate, up) without γ;
//     the inputs are staged times 2^64 (exact for |x| < 2^63) so that each product x·2^64·e2m1·2^-126 is
//     a normal f32 (exact: 24 × 2 significant bits round once, as x·w in f32 would) for |x| ≥ 2^-62, and
//     the group sums are scaled by 2^(s − 65).
//   Tables: per expert the device address of the packed weights [N, K/2] (low nibble first) and of the
//   ue8m0 scales [N, K/32]. K a multiple of 128, K·4 bytes of dynamic shared memory (K ≤ 12,288).
//   Launch: grid (ceil(N / (MGV_WARPS·MGV_RPW)), pairs), block 32·MGV_WARPS.

#define MOE_PLAN_THREADS 1024
#define MOE_GROUP_CHUNK 1024

extern "C" __global__ void __launch_bounds__(32)
moe_group_scan(const int* __restrict__ experts, int tk, int k, int E, int* __restrict__ cc, int* __restrict__ row_tok,
               int* __restrict__ row_dst, int fill) {
    extern __shared__ int run[];  // [E]: the chunk's pairs of each expert so far (fill: plus its first row)
    const int c = blockIdx.x, lane = threadIdx.x;
    for (int e = lane; e < E; e += 32) run[e] = fill ? cc[(size_t)c * E + e] : 0;
    __syncwarp();
    const int i0 = c * MOE_GROUP_CHUNK, i1 = min(tk, i0 + MOE_GROUP_CHUNK);
    // The chunk's ids loaded at once (their latencies overlap), then walked 32 at a time.
    int ids[MOE_GROUP_CHUNK / 32];
#pragma unroll
    for (int j = 0; j < MOE_GROUP_CHUNK / 32; j++) ids[j] = i0 + 32 * j + lane < i1 ? experts[i0 + 32 * j + lane] : -1;
#pragma unroll
    for (int j = 0; j < MOE_GROUP_CHUNK / 32; j++) {
        const int i = i0 + 32 * j + lane;
        int e = ids[j];
        const bool ok = e >= 0 && e < E;
        e = ok ? e : -1;
        const u32 same = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(same & ((1u << lane) - 1u));
        const int before = ok ? run[e] : 0;
        __syncwarp();
        if (ok) {
            if (fill) {
                row_tok[before + rank] = i / k;
                row_dst[before + rank] = i;
            }
            if (rank == 0) run[e] = before + __popc(same);
        }
        __syncwarp();
    }
    if (!fill)
        for (int e = lane; e < E; e += 32) cc[(size_t)c * E + e] = run[e];
}

extern "C" __global__ void __launch_bounds__(MOE_PLAN_THREADS)
moe_group_plan(int* __restrict__ cc, int nch, int E, int bm, int* __restrict__ offsets, int* __restrict__ items,
               int* __restrict__ n_items, int* __restrict__ row_tok, int* __restrict__ row_dst) {
    __shared__ int rows[MOE_PLAN_THREADS], tiles[MOE_PLAN_THREADS];
    const int e = threadIdx.x;
    int c = 0;
    if (e < E) {
#pragma unroll 8
        for (int ch = 0; ch < nch; ch++) c += cc[(size_t)ch * E + e];
    }
    const int nt = (c + bm - 1) / bm;
    rows[e] = nt * bm;
    tiles[e] = nt;
    __syncthreads();
    // Inclusive Hillis–Steele scans of padded rows and tiles.
    for (int o = 1; o < MOE_PLAN_THREADS; o <<= 1) {
        const int r = e >= o ? rows[e - o] : 0, t = e >= o ? tiles[e - o] : 0;
        __syncthreads();
        rows[e] += r;
        tiles[e] += t;
        __syncthreads();
    }
    if (e < E) {
        const int row0 = rows[e] - nt * bm, item0 = tiles[e] - nt;
        offsets[e] = row0;
        for (int j = 0; j < nt; j++) {
            items[2 * (item0 + j)] = e;
            items[2 * (item0 + j) + 1] = row0 + j * bm;
        }
        int first = row0;
#pragma unroll 8
        for (int ch = 0; ch < nch; ch++) {
            const int v = cc[(size_t)ch * E + e];
            cc[(size_t)ch * E + e] = first;
            first += v;
        }
        for (int r = row0 + c; r < row0 + nt * bm; r++) {
            row_tok[r] = -1;
            row_dst[r] = -1;
        }
    }
    if (e == E - 1) {
        offsets[E] = rows[e];
        *n_items = tiles[e];
    }
}

extern "C" __global__ void moe_gather_bf16(const float* __restrict__ f, const int* __restrict__ row_tok,
                                           const int* __restrict__ offsets, u16* __restrict__ xb, int d, int Kp,
                                           long long lo_plane, int split, int E) {
    const long long R = offsets[E];
    const int q4 = Kp / 4;
    const long long total = R * q4;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / q4;
        const int c = (int)(i % q4) * 4;
        const int tok = row_tok[r];
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (tok >= 0)
            for (int j = 0; j < 4; j++)
                if (c + j < d) v[j] = f[(size_t)tok * d + c + j];
        u32 h[2], l[2];
        for (int j = 0; j < 2; j++) {
            const u32 hb = gm_bf16x2(v[2 * j], v[2 * j + 1]);
            h[j] = hb;
            l[j] = gm_bf16x2_lo(v[2 * j], v[2 * j + 1], hb);
        }
        u16* dst = xb + r * Kp + c;
        *reinterpret_cast<uint2*>(dst) = make_uint2(h[0], h[1]);
        if (split) *reinterpret_cast<uint2*>(dst + lo_plane) = make_uint2(l[0], l[1]);
    }
}

#define MOE_MAXE 1024
#define MOE_MAXK 16
#define MOE_THREADS 256

typedef unsigned long long u64;

// Packed selection key: larger key = larger value under f32::total_cmp, then lower index e.
__device__ __forceinline__ u64 moe_key(float v, int e) {
    u32 b = __float_as_uint(v);
    b ^= (b & 0x80000000u) ? 0x7fffffffu : 0u;  // total_cmp's i32 order (negative values flipped)
    b ^= 0x80000000u;                            // signed → unsigned order
    return ((u64)b << 32) | (u64)(0xffffffffu - (u32)e);
}

__device__ __forceinline__ u64 moe_max(u64 a, u64 b) { return a > b ? a : b; }

extern "C" __global__ void __launch_bounds__(1024)
router_scores_f32(const float* __restrict__ logits, const float* __restrict__ bias, const int* __restrict__ tid2eid,
                  const int* __restrict__ ids, int* __restrict__ experts, float* __restrict__ weights, int E, int k,
                  int vocab, int use_sigmoid, double route_scale) {
    __shared__ float score[MOE_MAXE];
    __shared__ u64 key[MOE_MAXE];
    __shared__ u64 wbest[32];
    __shared__ int sel[MOE_MAXK];
    const int t = blockIdx.x;
    const bool hash = tid2eid != nullptr;
    const float* lg = logits + (size_t)t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const double v = (double)lg[e];
        const double s = use_sigmoid ? 1.0 / (1.0 + exp(-v)) : sqrt(v > 20.0 ? v : log1p(exp(v)));
        const float sf = (float)s;
        score[e] = sf;
        key[e] = hash ? 0ull : moe_key(sf + bias[e], e);
    }
    __syncthreads();
    // Score routing: k rounds of block argmax; the winner's key is zeroed (0 is below every valid key).
    const int rounds = hash ? 0 : k;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int r = 0; r < rounds; r++) {
        u64 best = 0ull;
        for (int e = threadIdx.x; e < E; e += blockDim.x) best = moe_max(best, key[e]);
        for (int o = 16; o > 0; o >>= 1) best = moe_max(best, __shfl_xor_sync(0xffffffffu, best, o));
        if (lane == 0) wbest[warp] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 b = 0ull;
            for (int w = 0; w < nw; w++) b = moe_max(b, wbest[w]);
            const int e = b ? (int)(0xffffffffu - (u32)(b & 0xffffffffull)) : -1;
            sel[r] = e;
            if (e >= 0 && e < E) key[e] = 0ull;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        bool ok = true;
        if (hash) {
            const int id = ids[t];
            for (int r = 0; r < k; r++) sel[r] = (id >= 0 && id < vocab) ? tid2eid[(size_t)id * k + r] : -1;
        }
        for (int r = 0; r < k; r++) ok = ok && sel[r] >= 0 && sel[r] < E;
        double sum = 0.0;
        if (ok)
            for (int r = 0; r < k; r++) sum += (double)score[sel[r]];
        for (int r = 0; r < k; r++) {
            experts[(size_t)t * k + r] = ok ? sel[r] : -1;
            weights[(size_t)t * k + r] =
                ok ? (float)((double)score[sel[r]] / (sum + 1e-20) * route_scale) : __int_as_float(0x7fc00000);
        }
    }
}

extern "C" __global__ void swiglu_f32(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h,
                                      long long len, float limit) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride) {
        h[i] = fs_swiglu(g[i], u[i], limit);
    }
}

extern "C" __global__ void gather_rows_f32(const float* __restrict__ src, const int* __restrict__ idx,
                                           float* __restrict__ dst, int src_rows, int d) {
    const int r = blockIdx.x;
    const int s = idx[r];
    float* out = dst + (size_t)r * d;
    if (s < 0 || s >= src_rows) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = __int_as_float(0x7fc00000);
        return;
    }
    const float* in = src + (size_t)s * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = in[i];
}

extern "C" __global__ void scatter_rows_f32(const float* __restrict__ src, const int* __restrict__ idx,
                                            float* __restrict__ dst, int dst_rows, int d) {
    const int r = blockIdx.x;
    const int s = idx[r];
    if (s < 0 || s >= dst_rows) return;
    const float* in = src + (size_t)r * d;
    float* out = dst + (size_t)s * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = in[i];
}

// One slot's term of moe_combine_f32 at one channel: fma(γ, v, acc) in f64 (γ = 1 without weights; an
// unrouted slot's value counts as 0).
__device__ __forceinline__ double moe_combine_term(double acc, double w, bool routed, float v) {
    return fma(w, routed ? (double)v : 0.0, acc);
}

#define MOE_COMBINE_G 8  // slots loaded at once by moe_combine_*

// A slot value as f32: itself, or (MOE_DOWN_BF16_OUT) a bf16 widened exactly.
__device__ __forceinline__ float moe_slot_f32(float v) { return v; }
__device__ __forceinline__ float moe_slot_f32(u16 v) { return fs_bf16(v); }
// 16 bytes of a slot row as loaded (4 f32 or 8 bf16, kept packed until used: an unpacked bf16 load
// would hold 8 registers instead of 4, and the loads in flight are what the combine's bandwidth needs),
// and value c of them as f32 (bf16 widened exactly).
__device__ __forceinline__ float4 moe_slot_raw(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ uint4 moe_slot_raw(const u16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ float moe_slot_at(const float4& x, int c) { return c == 0 ? x.x : c == 1 ? x.y : c == 2 ? x.z : x.w; }
__device__ __forceinline__ float moe_slot_at(const uint4& x, int c) {
    const u32 w = c < 2 ? x.x : c < 4 ? x.y : c < 6 ? x.z : x.w;
    return fs_bf16((u16)((c & 1) ? w >> 16 : w));
}

// The combine over slot values of type S, V channels per thread (16 bytes of each slot's row) when
// d % V == 0, else one.
template <class S, int V>
__device__ __forceinline__ void moe_combine(const S* __restrict__ slot_out, const float* __restrict__ weights, const int* __restrict__ experts,
                                            const float* __restrict__ shared, float* __restrict__ out, int k, int d, int E) {
    const int t = blockIdx.x;
    if (d % V == 0) {
        // V channels per thread; up to MOE_COMBINE_G slots' values loaded before their sums.
        const int i = (blockIdx.y * blockDim.x + threadIdx.x) * V;
        if (i >= d) return;
        double a[V];
#pragma unroll
        for (int c = 0; c < V; c++) a[c] = 0.0;
        for (int s0 = 0; s0 < k; s0 += MOE_COMBINE_G) {
            decltype(moe_slot_raw(slot_out)) v[MOE_COMBINE_G];
#pragma unroll
            for (int j = 0; j < MOE_COMBINE_G; j++)
                if (s0 + j < k) v[j] = moe_slot_raw(slot_out + ((size_t)t * k + s0 + j) * d + i);
#pragma unroll
            for (int j = 0; j < MOE_COMBINE_G; j++) {
                if (s0 + j < k) {
                    const size_t ts = (size_t)t * k + s0 + j;
                    const double w = weights ? (double)weights[ts] : 1.0;
                    const bool routed = experts == nullptr || (experts[ts] >= 0 && experts[ts] < E);
#pragma unroll
                    for (int c = 0; c < V; c++) a[c] = moe_combine_term(a[c], w, routed, moe_slot_at(v[j], c));
                }
            }
        }
#pragma unroll
        for (int c = 0; c < V; c += 4) {
            if (shared) {
                const float4 h = *reinterpret_cast<const float4*>(shared + (size_t)t * d + i + c);
                a[c] += (double)h.x, a[c + 1] += (double)h.y, a[c + 2] += (double)h.z, a[c + 3] += (double)h.w;
            }
            *reinterpret_cast<float4*>(out + (size_t)t * d + i + c) = make_float4((float)a[c], (float)a[c + 1], (float)a[c + 2], (float)a[c + 3]);
        }
    } else {
        const int i = blockIdx.y * blockDim.x + threadIdx.x;
        if (i >= d) return;
        double acc = 0.0;
        for (int s = 0; s < k; s++) {
            const size_t ts = (size_t)t * k + s;
            const double w = weights ? (double)weights[ts] : 1.0;
            const bool routed = experts == nullptr || (experts[ts] >= 0 && experts[ts] < E);
            acc = moe_combine_term(acc, w, routed, moe_slot_f32(slot_out[ts * d + i]));
        }
        if (shared) acc += (double)shared[(size_t)t * d + i];
        out[(size_t)t * d + i] = (float)acc;
    }
}

// out[t] = Σ_slot γ·slot_out[t, slot] (slot order, f64 fma from 0) + shared[t], rounded to f32;
// slots of ids outside 0..E count as 0 (Gpu::moe_combine). Grid (T, ceil(d / (256·4))), block 256
// (four channels per thread; one when d % 4 ≠ 0).
extern "C" __global__ void moe_combine_f32(const float* __restrict__ slot_out, const float* __restrict__ weights,
                                           const int* __restrict__ experts, const float* __restrict__ shared,
                                           float* __restrict__ out, int k, int d, int E) {
    moe_combine<float, 4>(slot_out, weights, experts, shared, out, k, d, E);
}

// moe_combine_f32 on bf16 slot values (switch MOE_DOWN_BF16_OUT: the routed experts' down
// projections written in bf16, as DeepSeek's FP8/FP4 GEMMs write them, spec §6), each widened
// exactly: the same sums as moe_combine_f32 on the widened values, bit for bit. Eight channels per
// thread (16 bytes of each slot's row, as moe_combine_f32's four) when d % 8 == 0: grid (T, ceil(d
// / (256·8))).
extern "C" __global__ void moe_combine_bf16(const u16* __restrict__ slot_out, const float* __restrict__ weights,
                                            const int* __restrict__ experts, const float* __restrict__ shared,
                                            float* __restrict__ out, int k, int d, int E) {
    moe_combine<u16, 8>(slot_out, weights, experts, shared, out, k, d, E);
}

#define MGV_WARPS 8
#define MGV_RPW 4
#define MGV_F32_BIAS 64  // the _f32 forms' inputs are staged times 2^64
#define MGV_LOOK 4  // groups of a row each lane loads before it multiplies (K ≤ 32·32·MGV_LOOK per pass)

// Nibble i (0 … 7) of v as the f32 whose bits are (nibble & 7) << 22 with the nibble's sign: the e2m1
// value times 2^-126 (0.5 → 2^-127, a subnormal; 6 → 1.5·2^-124).
__device__ __forceinline__ float mgv_e2m1(u32 v, int i) {
    return __uint_as_float((((v >> (4 * i)) & 7u) << 22) | (((v >> (4 * i + 3)) & 1u) << 31));
}

// Σ_{i<32} x[i]·e2m1(w nibble i)·2^-126 for one 32-value group: xg the group's 8 float4 chunks
// (chunk c stored at c ^ sw), in column order.
__device__ __forceinline__ float mgv_group(uint4 w, const float4* __restrict__ xg, int sw) {
    const u32 words[4] = {w.x, w.y, w.z, w.w};
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < 8; c++) {
        const float4 x = xg[c ^ sw];
        const u32 v = words[c >> 1] >> (16 * (c & 1));
        acc = fmaf(x.x, mgv_e2m1(v, 0), acc);
        acc = fmaf(x.y, mgv_e2m1(v, 1), acc);
        acc = fmaf(x.z, mgv_e2m1(v, 2), acc);
        acc = fmaf(x.w, mgv_e2m1(v, 3), acc);
    }
    return acc;
}

template <bool Q8, bool SWIGLU>
__device__ __forceinline__ void moe_gemv_fp4(const u8* __restrict__ q, const float* __restrict__ sa, const float* __restrict__ x, int ldq,
                                             const int* __restrict__ experts, int k, int E,
                                             const unsigned long long* __restrict__ wtab, const unsigned long long* __restrict__ stab,
                                             const unsigned long long* __restrict__ w3tab, const unsigned long long* __restrict__ s3tab,
                                             const float* __restrict__ gamma, float* __restrict__ y, int N, int K, float limit) {
    extern __shared__ float4 xs[];  // [K / 4] chunks, swizzled per 32-value group
    const int p = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int e = experts[p];
    const int n0 = (blockIdx.x * MGV_WARPS + warp) * MGV_RPW;
    if (e < 0 || e >= E) {
        if (SWIGLU && lane < MGV_RPW && n0 + lane < N) y[(size_t)p * N + n0 + lane] = 0.f;
        return;
    }
    const int row = SWIGLU ? p / k : p;
    for (int c = threadIdx.x; c < K / 4; c += blockDim.x) {
        const int g = c >> 3;
        float4 v;
        if (Q8) {
            const u32 b = *reinterpret_cast<const u32*>(q + (size_t)row * ldq + 4 * c);
            v = make_float4(fs_e4m3(b & 0xffu), fs_e4m3((b >> 8) & 0xffu), fs_e4m3((b >> 16) & 0xffu), fs_e4m3(b >> 24));
        } else {
            // × 2^MGV_F32_BIAS (exact): the products with the decoded weights (2^-126 scale) stay normal.
            v = *reinterpret_cast<const float4*>(x + (size_t)row * ldq + 4 * c);
            v = make_float4(ldexpf(v.x, MGV_F32_BIAS), ldexpf(v.y, MGV_F32_BIAS), ldexpf(v.z, MGV_F32_BIAS), ldexpf(v.w, MGV_F32_BIAS));
        }
        xs[(g << 3) | ((c & 7) ^ (g & 7))] = v;
    }
    __syncthreads();
    const float* sar = Q8 ? sa + (size_t)row * (ldq >> 7) : nullptr;
    const u8* W = reinterpret_cast<const u8*>(wtab[e]);
    const u8* S = reinterpret_cast<const u8*>(stab[e]);
    const u8* W3 = SWIGLU ? reinterpret_cast<const u8*>(w3tab[e]) : nullptr;
    const u8* S3 = SWIGLU ? reinterpret_cast<const u8*>(s3tab[e]) : nullptr;
    const int G = K >> 5;
    for (int r = 0; r < MGV_RPW; r++) {
        const int n = n0 + r;  // warp-uniform: the whole warp leaves together
        if (n >= N) break;
        const size_t wrow = (size_t)n * (K >> 1), srow = (size_t)n * G;
        float a1 = 0.f, a3 = 0.f;
        for (int g0 = lane; g0 < G; g0 += 32 * MGV_LOOK) {
            uint4 w1v[MGV_LOOK], w3v[MGV_LOOK];
            u32 s1v[MGV_LOOK], s3v[MGV_LOOK];
#pragma unroll
            for (int j = 0; j < MGV_LOOK; j++) {
                const int g = g0 + 32 * j;
                if (g < G) {
                    w1v[j] = __ldg(reinterpret_cast<const uint4*>(W + wrow + 16 * (size_t)g));
                    s1v[j] = __ldg(S + srow + g);
                    if (SWIGLU) {
                        w3v[j] = __ldg(reinterpret_cast<const uint4*>(W3 + wrow + 16 * (size_t)g));
                        s3v[j] = __ldg(S3 + srow + g);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < MGV_LOOK; j++) {
                const int g = g0 + 32 * j;
                if (g < G) {
                    const float4* xg = xs + (g << 3);
                    // 2^(s − 127) · 2^126 = 2^(s − 1), then the activation scale: exact while the
                    // results stay normal.
                    const float s_a = Q8 ? sar[g >> 2] : 1.f;
                    const int bias = Q8 ? 1 : 1 + MGV_F32_BIAS;
                    a1 = fmaf(ldexpf(mgv_group(w1v[j], xg, g & 7), (int)s1v[j] - bias), s_a, a1);
                    if (SWIGLU) a3 = fmaf(ldexpf(mgv_group(w3v[j], xg, g & 7), (int)s3v[j] - bias), s_a, a3);
                }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            a1 += __shfl_xor_sync(0xffffffffu, a1, o);
            if (SWIGLU) a3 += __shfl_xor_sync(0xffffffffu, a3, o);
        }
        if (lane == 0) y[(size_t)p * N + n] = SWIGLU ? fs_swiglu(a1, a3, limit) * (gamma ? gamma[p] : 1.f) : a1;
    }
}

extern "C" __global__ void __launch_bounds__(32 * MGV_WARPS)
moe_gemv_fp4_swiglu(const u8* __restrict__ q, const float* __restrict__ sa, int ldq, const int* __restrict__ experts, int k, int E,
                    const unsigned long long* __restrict__ w1tab, const unsigned long long* __restrict__ s1tab,
                    const unsigned long long* __restrict__ w3tab, const unsigned long long* __restrict__ s3tab,
                    const float* __restrict__ gamma, float* __restrict__ h, int N, int K, float limit) {
    moe_gemv_fp4<true, true>(q, sa, nullptr, ldq, experts, k, E, w1tab, s1tab, w3tab, s3tab, gamma, h, N, K, limit);
}

extern "C" __global__ void __launch_bounds__(32 * MGV_WARPS)
moe_gemv_fp4_down(const u8* __restrict__ q, const float* __restrict__ sa, int ldq, const int* __restrict__ experts, int E,
                  const unsigned long long* __restrict__ w2tab, const unsigned long long* __restrict__ s2tab,
                  float* __restrict__ y, int N, int K) {
    moe_gemv_fp4<true, false>(q, sa, nullptr, ldq, experts, 1, E, w2tab, s2tab, nullptr, nullptr, nullptr, y, N, K, 0.f);
}

extern "C" __global__ void __launch_bounds__(32 * MGV_WARPS)
moe_gemv_fp4_swiglu_f32(const float* __restrict__ x, int ldx, const int* __restrict__ experts, int k, int E,
                        const unsigned long long* __restrict__ w1tab, const unsigned long long* __restrict__ s1tab,
                        const unsigned long long* __restrict__ w3tab, const unsigned long long* __restrict__ s3tab,
                        float* __restrict__ h, int N, int K, float limit) {
    moe_gemv_fp4<false, true>(nullptr, nullptr, x, ldx, experts, k, E, w1tab, s1tab, w3tab, s3tab, nullptr, h, N, K, limit);
}

extern "C" __global__ void __launch_bounds__(32 * MGV_WARPS)
moe_gemv_fp4_down_f32(const float* __restrict__ x, int ldx, const int* __restrict__ experts, int E,
                      const unsigned long long* __restrict__ w2tab, const unsigned long long* __restrict__ s2tab,
                      float* __restrict__ y, int N, int K) {
    moe_gemv_fp4<false, false>(nullptr, nullptr, x, ldx, experts, 1, E, w2tab, s2tab, nullptr, nullptr, nullptr, y, N, K, 0.f);
}

// ---------------------------------------------------------------------------------------------
// moe_gemv_fp4_mma_swiglu / moe_gemv_fp4_mma_down (switch MOE_GEMV_MMA, under MOE_DECODE_GEMV in
// official numerics; host glue ops_moe.rs `Gpu::moe_experts_gemv`): moe_gemv_fp4_swiglu /
// moe_gemv_fp4_down with each 32-value group's dot product on the tensor cores (mma.sync m16n8k32
// e4m3 × e4m3 → f32) instead of 32 CUDA-core products. Each warp takes 16 output rows of one pair
// (blockIdx.y) over all of K; per group j the FP4 weights become the A fragment directly: lane
// (g, t) loads 32-bit word t of the group's 16 bytes for rows g and g + 8 and spreads its eight
// nibbles into e4m3 bytes — the low nibbles (values 8t + 2i) as the fragment's columns 4t + i, the
// high ones (8t + 2i + 1) as 16 + 4t + i — with the bits s·2^7 | (nibble & 7)·2^2: an e4m3 whose
// value is the e2m1 value times 2^-6 for all sixteen codes (the e2m1 subnormal 0.5 becomes the e4m3
// subnormal 2^-7), so the decode is three integer instructions per four nibbles. The B fragment is the
// pair's e4m3 input row staged in shared memory in the same permuted order (every column the same
// row: each lane of a quad ends with the same sums, no reduction). Then per row and group
// y += (d·2^(s − 121))·sa[g/4] with the group's ue8m0 weight scale s and the activation scale of its
// 128-column block, groups in order — the CUDA-core gemv's definition (products exact: e4m3 × e2m1
// fits f32; group sums, scales, γ, SwiGLU as there) but each group's sum is the MMA unit's, so not
// that kernel's bits (the tensor-core GEMMs' numerics; gpu-check `moe_q8 … gemv mma …` against the
// CPU and against MOE_GEMV_MMA=off). Loads: each warp keeps the next MGM_U groups' words and scales
// in flight while it multiplies the current ones. K a multiple of 32·MGM_U (the host checks), N any
// (rows past N are clamped on load and not stored). Shared memory: K + 4·K/128 bytes.
// Launch: grid (ceil(N / (16·MGM_WARPS)), pairs), block 32·MGM_WARPS. sm_89+ (e4m3 mma.sync).
// Learned from the PTX ISA's m16n8k32 fragment layout (as gm_mma_e4m3 in common.cuh); the code is ours.
#define MGM_WARPS 4  // ops_moe.rs MGM_ROWS_PER_BLOCK / MGM_THREADS
// Groups per batch of loads (a multiple of 8: whole 64-bit words of scale bytes; the host takes
// widths that are multiples of 256, ops_moe.rs MGM_K_MULTIPLE), overridable for timing
// (FLASHSEEK_KERNEL_DEFINES=MGM_U=16 where the widths are multiples of 512, as Flash's).
#ifndef MGM_U
#define MGM_U 8
#endif
static_assert(MGM_U % 8 == 0, "scale bytes are loaded 8 at a time");

// The low / high nibbles of w's four bytes as four e4m3 bytes of value e2m1·2^-6 (see above).
__device__ __forceinline__ u32 mgm_lo(u32 w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
__device__ __forceinline__ u32 mgm_hi(u32 w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// d·2^(s − 121), rounded once as ldexpf (a power-of-two multiplier wherever it is a normal f32).
__device__ __forceinline__ float mgm_scaled(float d, u32 s) {
    const int e = (int)s - 121;
    return e <= 127 ? d * __int_as_float((e + 127) << 23) : ldexpf(d, e);
}

template <bool SWIGLU, int KS>
__device__ __forceinline__ void moe_gemv_fp4_mma(const u8* __restrict__ q, const float* __restrict__ sa, int ldq,
                                                 const int* __restrict__ experts, int k, int E,
                                                 const unsigned long long* __restrict__ wtab, const unsigned long long* __restrict__ stab,
                                                 const unsigned long long* __restrict__ w3tab, const unsigned long long* __restrict__ s3tab,
                                                 const float* __restrict__ gamma, float* __restrict__ y, int N, int K, float limit) {
    static_assert(KS >= 1 && MGM_WARPS % KS == 0, "the warps split each 16-row tile's groups KS ways");
    extern __shared__ uint2 mgm_x[];  // [K / 32][4] B fragments, then K / 128 activation scales
    constexpr int NM = SWIGLU ? 2 : 1;  // matrices: W (or W1), W3
    __shared__ float mgm_part[KS > 1 ? MGM_WARPS * NM * 16 : 1];  // the K parts' row sums
    const int p = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int rt = warp / KS, kp = warp % KS;  // this warp's 16-row tile of the block and K part
    const int e = experts[p];
    const int n0 = (blockIdx.x * (MGM_WARPS / KS) + rt) * 16;
    if (e < 0 || e >= E) {  // the whole block: one pair
        if (SWIGLU && kp == 0 && lane < 16 && n0 + lane < N) y[(size_t)p * N + n0 + lane] = 0.f;
        return;
    }
    const int row = SWIGLU ? p / k : p;
    const int G = K >> 5;
    {
        const u8* qr = q + (size_t)row * ldq;
        for (int c = threadIdx.x; c < G * 4; c += blockDim.x) {  // c = 4j + t: the row's bytes 8c … 8c + 7
            const uint2 v = *reinterpret_cast<const uint2*>(qr + 8 * c);
            mgm_x[c] = make_uint2(__byte_perm(v.x, v.y, 0x6420), __byte_perm(v.x, v.y, 0x7531));
        }
        float* sas = reinterpret_cast<float*>(mgm_x + G * 4);
        for (int c = threadIdx.x; c < (K >> 7); c += blockDim.x) sas[c] = sa[(size_t)row * (ldq >> 7) + c];
    }
    __syncthreads();
    const float* sas = reinterpret_cast<const float*>(mgm_x + G * 4);
    const int ra = min(n0 + g, N - 1), rb = min(n0 + g + 8, N - 1);
    const u32* wp[NM][2];
    const unsigned long long* sp[NM][2];
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const u8* W = reinterpret_cast<const u8*>(m == 0 ? wtab[e] : w3tab[e]);
        const u8* S = reinterpret_cast<const u8*>(m == 0 ? stab[e] : s3tab[e]);
        wp[m][0] = reinterpret_cast<const u32*>(W + (size_t)ra * (K >> 1)) + t;
        wp[m][1] = reinterpret_cast<const u32*>(W + (size_t)rb * (K >> 1)) + t;
        sp[m][0] = reinterpret_cast<const unsigned long long*>(S + (size_t)ra * G);
        sp[m][1] = reinterpret_cast<const unsigned long long*>(S + (size_t)rb * G);
    }
    // One batch: MGM_U groups' weight words and scale bytes of both rows of every matrix.
    struct Batch {
        u32 w[NM][2][MGM_U];
        unsigned long long s[NM][2][MGM_U / 8];
    };
    auto load = [&](Batch& b, int j0) {
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
#pragma unroll
                for (int u = 0; u < MGM_U; u++) b.w[m][r][u] = __ldg(wp[m][r] + 4 * (j0 + u));
#pragma unroll
                for (int u = 0; u < MGM_U / 8; u++) b.s[m][r][u] = __ldg(sp[m][r] + (j0 >> 3) + u);
            }
    };
    float acc[NM][2];
#pragma unroll
    for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = 0.f;
    // This warp's groups: part kp of KS (each a whole number of batches; the host checks K).
    const int jb = kp * (G / KS), je = jb + G / KS;
    Batch cur, nxt;
    load(cur, jb);
    for (int j0 = jb; j0 < je; j0 += MGM_U) {
        if (j0 + MGM_U < je) load(nxt, j0 + MGM_U);
#pragma unroll
        for (int u = 0; u < MGM_U; u++) {
            const int j = j0 + u;
            const uint2 bx = mgm_x[4 * j + t];
            const float s_a = sas[j >> 2];
#pragma unroll
            for (int m = 0; m < NM; m++) {
                const u32 a[4] = {mgm_lo(cur.w[m][0][u]), mgm_lo(cur.w[m][1][u]), mgm_hi(cur.w[m][0][u]), mgm_hi(cur.w[m][1][u])};
                float d[4] = {0.f, 0.f, 0.f, 0.f};
                gm_mma_e4m3(d, a, bx.x, bx.y);
                const u32 s0 = (u32)(cur.s[m][0][u >> 3] >> (8 * (u & 7))) & 0xffu;
                const u32 s1 = (u32)(cur.s[m][1][u >> 3] >> (8 * (u & 7))) & 0xffu;
                acc[m][0] = fmaf(mgm_scaled(d[0], s0), s_a, acc[m][0]);
                acc[m][1] = fmaf(mgm_scaled(d[2], s1), s_a, acc[m][1]);
            }
        }
        cur = nxt;
    }
    if (KS > 1) {
        // The parts' sums added in part order by the tile's first warp.
        if (t == 0)
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) mgm_part[((rt * KS + kp) * NM + m) * 16 + g + 8 * r] = acc[m][r];
        __syncthreads();
        if (kp != 0) return;
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int i = 1; i < KS; i++) acc[m][r] += mgm_part[((rt * KS + i) * NM + m) * 16 + g + 8 * r];
    }
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int n = n0 + g + 8 * r;
            if (n < N) y[(size_t)p * N + n] = SWIGLU ? fs_swiglu(acc[0][r], acc[NM - 1][r], limit) * (gamma ? gamma[p] : 1.f) : acc[0][r];
        }
    }
}

// KS = 1 (16 rows per warp, 64 per block) and KS = 4 (_ks4: the block's four warps split one 16-row
// tile's groups in quarters, 16 rows per block: four times the blocks and loads in flight for the
// few pairs of a decode step; K a multiple of 4·32·MGM_U).
#define MGM_ENTRIES(SUFFIX, KS)                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * MGM_WARPS)                                                          \
    moe_gemv_fp4_mma_swiglu##SUFFIX(const u8* __restrict__ q, const float* __restrict__ sa, int ldq, const int* __restrict__ experts, \
                                    int k, int E, const unsigned long long* __restrict__ w1tab,                           \
                                    const unsigned long long* __restrict__ s1tab, const unsigned long long* __restrict__ w3tab, \
                                    const unsigned long long* __restrict__ s3tab, const float* __restrict__ gamma,        \
                                    float* __restrict__ h, int N, int K, float limit) {                                   \
        moe_gemv_fp4_mma<true, KS>(q, sa, ldq, experts, k, E, w1tab, s1tab, w3tab, s3tab, gamma, h, N, K, limit);        \
    }                                                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * MGM_WARPS)                                                          \
    moe_gemv_fp4_mma_down##SUFFIX(const u8* __restrict__ q, const float* __restrict__ sa, int ldq, const int* __restrict__ experts, \
                                  int E, const unsigned long long* __restrict__ w2tab, const unsigned long long* __restrict__ s2tab, \
                                  float* __restrict__ y, int N, int K) {                                                  \
        moe_gemv_fp4_mma<false, KS>(q, sa, ldq, experts, 1, E, w2tab, s2tab, w2tab, s2tab, nullptr, y, N, K, 0.f);     \
    }
MGM_ENTRIES(, 1)
MGM_ENTRIES(_ks4, 4)
