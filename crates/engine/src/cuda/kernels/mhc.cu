// mhc.cu — manifold-constrained hyper-connections: "pre" with Sinkhorn (spec §4.2), "post" (spec
// §4.3) and the final hyper-head collapse (spec §4.12, step 1; the RMSNorm of step 2 is rms_norm_f32).
// CPU reference: forward/mhc.rs `hc_pre` / `hc_post`, forward/head.rs `collapse`.
//
// Streams: x [T, n, d] f32 row-major (token t, stream j, channel i at (t·n + j)·d + i); 1 ≤ n ≤ 4
// (HC_MAXN), d % 4 == 0 (float4 loads; buffers from cuMemAlloc are 256-byte aligned). N = n·d.
//
// Pre and head run as two kernels: a split-K pass for the M mix dot products (M = (2+n)·n ≤ 24 for
// pre, M = n for the head) and the squared norm, then a per-token finish.
//
// hc_mix_partial_f32: x [T, n, d], Φ fn [M, N] → part [T, HC_SPLIT, 32] f32: for split s, part[t, s, i] =
//   Σ_c Φ[i, c]·x̄_c (i < M) and part[t, s, M] = Σ_c x̄_c² over the s-th of HC_SPLIT equal runs of the
//   flattened x̄ = x[t] (runs of float4s). Launch: grid (ceil(T / (HC_WARPS·HC_TT)), HC_SPLIT) =
//   (ceil(T/16), 64), block HC_PARTIAL_THREADS = 128 (4 warps), no shared memory. Warp w of block b
//   serves the HC_TT = 4 tokens from (b·HC_WARPS + w)·HC_TT, so each Φ float4 it loads is used 4 times;
//   its lanes sweep the run (lane ℓ: float4s c0 + ℓ, c0 + ℓ + 32, …) summing each token's M + 1 values
//   in f32 in that order; then a transposing butterfly over the 32 lanes (hc_lane_sums: 31 shuffles
//   per token instead of 5 per value) leaves value i's total in lane i. 64 splits (2 float4s per lane
//   at Flash's N = 16,384) keep a one-token call (decode) spread over 64 warps; measured on the H200
//   at T = 8,192 (hc_pre, partial + finish) 0.71 ms with 64 splits, 0.63 with 16, 0.78 with 16 and
//   the loop unrolled twice; at T = 1, 23 µs vs 29 (L2-warm). The price: part holds 8 KiB per token
//   (64 MiB of scratch at T = 8,192) and the finish adds 64 partials per value. HC_SPLIT is a constant and a
//   token's sums do not depend on its place in the tile, so a token's result does not depend on T
//   (batch invariant) and every reduction order is fixed (deterministic).
// hc_pre_f32: part (above, M = (2+n)·n), x, base [M], scale [3] (α0 pre, α1 post, α2 comb):
//   D_i = Σ_s part[t, s, i] (split order); ρ = (D_M/N + eps)^(-1/2); m_i = f32(ρ·D_i)
//   (= Φ·(ρ x̄) up to rounding; the CPU also rounds m to f32).
//   pre_j  = σ(α0·m_j + b_j) + hc_eps
//   post_j = 2·σ(α1·m_{n+j} + b_{n+j})
//   C[j][k] = α2·m_{2n+j·n+k} + b_{2n+j·n+k}; C = row_softmax(C) + hc_eps; column-normalise; then
//   (iters − 1) × (row-normalise, column-normalise); every normalisation divides by (sum + hc_eps).
//   Outputs: u [T, d] = Σ_j pre_j·x[t, j]; post [T, n]; comb [T, n, n] (C[j][k] at j·n + k).
// hc_head_f32: part (M = n), x, base [n], scale [≥1] (α): π_j = σ(α·m_j + b_j) + hc_eps (no Sinkhorn),
//   h [T, d] = Σ_j π_j·x[t, j].
//   Launch (pre and head): grid (T), block HC_THREADS = 256 (any multiple of 32 from 32 up works);
//   static shared < 200 B. The coefficients (σ, softmax, Sinkhorn on n×n: tiny) are computed in f64
//   by warp 0 (pre: lane j·4 + k holds C[j][k]; row and column sums gathered by shuffles and added in
//   index order, each entry divided by (sum + hc_eps): the CPU reference's operations, in its order),
//   and u / h are accumulated in f64 (as the CPU does), then rounded to f32.
//
// hc_post_f32: x [T, n, d] in place, y [T, d], post [T, n], comb [T, n, n]:
//   x'[k][i] = post_k·y[i] + Σ_j comb[j][k]·x[j][i]   (the sum runs over C's FIRST index), in f64.
//   Launch: grid (T, ceil(d / 256)), block 256. Each thread owns channel i of one token and reads all
//   n old streams before writing any, so the in-place update is race-free.
//
// Sizes are template parameters (M of the partial pass; n of the others); each entry point dispatches
// on them with a switch that is uniform across the block, so every thread reaches each __syncthreads.

#define HC_MAXN 4
#define HC_MAXM 24  // (2 + HC_MAXN) · HC_MAXN
#define HC_SPLIT 64
#define HC_PART 32  // floats per (token, split) in part: M ≤ 24 sums + the squared norm
#define HC_THREADS 256
#define HC_TT 4     // tokens per warp of the partial pass
#define HC_WARPS 4  // warps per block of the partial pass
#define HC_PARTIAL_THREADS (32 * HC_WARPS)
#define HC_FULL 0xffffffffu
#define HC_REC 34       // doubles per token of a coefficient record (hc_pre_coef_f32): pre at 0, post at
#define HC_REC_POST 4   // HC_REC_POST, comb at HC_REC_COMB (C[j][k] at HC_REC_COMB + j·n + k); the f32
#define HC_REC_COMB 8   // post and comb exactly, as doubles; and from double HC_REC_F32 on as floats (post
#define HC_REC_F32 24   // at 0 … n − 1, C[j][k] at HC_MAXN + j·n + k), for the bf16 streams' f32 post
static_assert(HC_REC % 2 == 0, "16-byte records: hc_load_post_comb's double2 loads");
static_assert(HC_REC_COMB + HC_MAXN * HC_MAXN <= HC_REC_F32, "the f32 copies after the doubles");
static_assert(2 * (HC_REC - HC_REC_F32) >= HC_MAXN + HC_MAXN * HC_MAXN, "room for post and comb as floats");
static_assert(HC_REC_F32 % 2 == 0, "16-byte aligned f32 copies (float4 loads)");

// Stream storage (MHC_BF16_STREAMS): the kernels that read or write the residual streams between
// sub-blocks (hc_post, hc_post_mix, hc_pre_norm) come as _f32 (the exact path) and _bf16 entry points,
// the latter with x as bf16 bits (u16, the high half of an f32; spec §4.1: DeepSeek's reference keeps
// the streams in the activation dtype, bf16). The bf16 posts compute in f32 (hc_post_f32_expr, as
// OFF-M does before its cast; the exact path's f64 post spends nine f32 ↔ f64 conversions per
// channel) and round to nearest even (narrow2); every sum over the streams (the next pre's mix
// partials, u) runs over the values as stored, in the f32 kernels' order: so hc_pre_norm_bf16 and
// hc_post_mix_bf16's partials give their f32 twins' bits on the widened streams (gpu-check `… bf16
// bits`) — except the tensor-core mix of hc_post_mix_tc_bf16 (MHC_MIX_TC, below), whose partials are
// sums in another order.
// HcS<S>: F32_POST, P2 a channel pair as stored, ld1 / ld2 widen, narrow2 rounds a pair to P2,
// wide2 widens one.
template <class S>
struct HcS;
template <>
struct HcS<float> {
    static constexpr bool F32_POST = false;  // the post in f64 (the exact path)
    static constexpr bool HCN_STAGE = false;  // hc_pre_norm reads the streams directly
    typedef float2 P2;
    static __device__ __forceinline__ float ld1(const float* p) { return *p; }
    static __device__ __forceinline__ float2 wide2(P2 v) { return v; }
    static __device__ __forceinline__ P2 narrow2(float2 v) { return v; }
    static __device__ __forceinline__ float narrow1(float v) { return v; }
};
template <>
struct HcS<u16> {
    static constexpr bool F32_POST = true;  // the post in f32 (hc_post_f32_expr), as OFF-M computes it
    static constexpr bool HCN_STAGE = true;  // hc_pre_norm stages a token's streams (n·d·2 ≤ 64 KiB) in shared memory
    typedef u32 P2;  // channel i in the low half, i + 1 in the high half
    static __device__ __forceinline__ float ld1(const u16* p) { return fs_bf16(*p); }
    static __device__ __forceinline__ float2 wide2(P2 v) { return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u)); }
    static __device__ __forceinline__ P2 narrow2(float2 v) { return gm_bf16x2(v.x, v.y); }
    static __device__ __forceinline__ u16 narrow1(float v) { return (u16)(gm_bf16x2(v, 0.f) & 0xffffu); }
};
// The pair at p (2-element aligned: i even) widened.
template <class S>
__device__ __forceinline__ float2 hc_ld2(const S* p) { return HcS<S>::wide2(*reinterpret_cast<const typename HcS<S>::P2*>(p)); }

// The bf16 streams' post of one channel (MHC_BF16_STREAMS; spec §4.3 in f32, as OFF-M computes it
// before casting back to the stream dtype): post_k·y, then + C[j][k]·x_j for j = 0 … n − 1 as f32
// fmaf in that order — the CPU replays it with f32 mul_add (gpu-check `… bf16 x bits`). The f64
// form of the exact path costs nine f32 ↔ f64 conversions per channel on a 16-per-clock pipe.
// post_t [NN], comb_t [NN·NN] (C[j][k] at j·NN + k), x the n stream values widened.
template <int NN>
__device__ __forceinline__ float hc_post_f32_expr(const float* post_t, const float* comb_t, int k, float y, const float (&x)[NN]) {
    float s = __fmul_rn(post_t[k], y);
#pragma unroll
    for (int j = 0; j < NN; j++) s = fmaf(comb_t[j * NN + k], x[j], s);
    return s;
}

__device__ __forceinline__ double hc_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

// a[i] summed over the 32 lanes of the warp for every i < 32, lane i getting index i's total:
// at the step with offset h (16, 8, …, 1) a lane keeps the half of its values whose index has bit h
// equal to its own lane bit h and adds its partner's (lane ^ h) copy of that half, so after the last
// step a[0] holds index `lane`. A fixed tree per index (deterministic); 31 shuffles in all. Every lane
// of the warp calls it.
template <int H>
__device__ __forceinline__ void hc_lane_step(float (&a)[32], int lane) {
    const bool up = (lane & H) != 0;
#pragma unroll
    for (int i = 0; i < H; i++) {
        const float send = up ? a[i] : a[i + H];
        const float keep = up ? a[i + H] : a[i];
        a[i] = keep + __shfl_xor_sync(HC_FULL, send, H);
    }
}
__device__ __forceinline__ float hc_lane_sums(float (&a)[32], int lane) {
    hc_lane_step<16>(a, lane);
    hc_lane_step<8>(a, lane);
    hc_lane_step<4>(a, lane);
    hc_lane_step<2>(a, lane);
    hc_lane_step<1>(a, lane);
    return a[0];
}

// One token's M + 1 per-lane sums (acc) added over the warp's 32 lanes by hc_lane_sums (the partial
// pass); lane i ≤ M writes value i's total to dst()[i] when store is set (dst yields the row's address
// only then: an address computed ahead of the sums made a four-token warp spill). Every lane of the
// warp calls it.
template <int M, class Dst>
__device__ __forceinline__ void hc_store_lane_sums(const float (&acc)[M + 1], int lane, bool store, Dst dst) {
    float a[32];
#pragma unroll
    for (int i = 0; i <= M; i++) a[i] = acc[i];
#pragma unroll
    for (int i = M + 1; i < 32; i++) a[i] = 0.f;
    const float r = hc_lane_sums(a, lane);
    if (store && lane <= M) dst()[lane] = r;
}

// One warp: split s of tokens t0 … t0 + HC_TT − 1 (those < T): the M dot products and the squared
// norm over float4 run [c0, c1) of each token's x̄, each Φ load shared by the HC_TT tokens. Each
// token's sums run in the same order whatever the tile, so the result does not depend on T.
template <int M>
__device__ __forceinline__ void hc_partial_impl(const float* __restrict__ x, const float* __restrict__ fn,
                                                float* __restrict__ part, int T, int N) {
    static_assert(M + 1 <= 32, "the lane sums hold 32 values");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t0 = (blockIdx.x * HC_WARPS + warp) * HC_TT, s = blockIdx.y;
    if (t0 >= T) return;  // warp-uniform; the kernel has no block-wide synchronisation
    const int tn = min(HC_TT, T - t0);
    const int n4 = N >> 2;
    const int run = (n4 + HC_SPLIT - 1) / HC_SPLIT;
    const int c0 = s * run;
    const int c1 = min(n4, c0 + run);
    const float4* x4 = reinterpret_cast<const float4*>(x) + (size_t)t0 * n4;
    const float4* f4 = reinterpret_cast<const float4*>(fn);
    float acc[HC_TT][M + 1];
#pragma unroll
    for (int q = 0; q < HC_TT; q++)
#pragma unroll
        for (int i = 0; i <= M; i++) acc[q][i] = 0.f;
#pragma unroll 1
    for (int c = c0 + lane; c < c1; c += 32) {
        float4 v[HC_TT];
#pragma unroll
        for (int q = 0; q < HC_TT; q++) {
            v[q] = q < tn ? x4[(size_t)q * n4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
            acc[q][M] += (v[q].x * v[q].x + v[q].y * v[q].y) + (v[q].z * v[q].z + v[q].w * v[q].w);
        }
#pragma unroll
        for (int i = 0; i < M; i++) {
            const float4 w = __ldg(f4 + (size_t)i * n4 + c);
#pragma unroll
            for (int q = 0; q < HC_TT; q++)
                acc[q][i] += (v[q].x * w.x + v[q].y * w.y) + (v[q].z * w.z + v[q].w * w.w);
        }
    }
#pragma unroll
    for (int q = 0; q < HC_TT; q++)
        hc_store_lane_sums<M>(acc[q], lane, q < tn, [&] { return part + ((size_t)(t0 + q) * HC_SPLIT + s) * HC_PART; });
}

// Σ_s p[s·HC_PART] for s = 0 … S − 1 in order, in f32: one value's total over a token's S partials
// (p = part + t·S·HC_PART + i). hc_totals and hc_pre_coef_f32 both sum with it; U only unrolls the
// loop (16 for the run-time S of hc_pre_coef_f32; 0 leaves it to the compiler, which unrolls
// hc_pre_f32's constant 64 fully).
template <int U>
__device__ __forceinline__ float hc_total_of(const float* __restrict__ p, int S) {
    float r = 0.f;
    if constexpr (U > 0) {
#pragma unroll U
        for (int s = 0; s < S; s++) r += p[s * HC_PART];
    } else {
        for (int s = 0; s < S; s++) r += p[s * HC_PART];
    }
    return r;
}

// tot[i] = Σ_s part[t, s, i] over the S partials of token t = blockIdx.x in order, for i ≤ M
// (tot[M]: the squared norm). Every thread must reach it (it synchronises); ends with tot visible to all.
__device__ __forceinline__ void hc_totals(const float* __restrict__ part, int S, int M, float* tot) {
    if (threadIdx.x <= M) tot[threadIdx.x] = hc_total_of<0>(part + (size_t)blockIdx.x * S * HC_PART + threadIdx.x, S);
    __syncthreads();
}

// f32(ρ·D_i) as f64, ρ from the squared norm tot[M] of N values.
__device__ __forceinline__ double hc_logit(const float* tot, int M, int i, int N, double eps) {
    const double r = 1.0 / sqrt((double)tot[M] / (double)N + eps);
    return (double)(float)(r * (double)tot[i]);
}

// Σ_j coef[j]·xt[j·d + i] in f64, rounded to f32: channel i of the combined streams.
template <int NN, class S = float>
__device__ __forceinline__ float hc_combine_one(const S* __restrict__ xt, const double* coef, int i, int d) {
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < NN; j++) s += coef[j] * (double)HcS<S>::ld1(xt + (size_t)j * d + i);
    return (float)s;
}

// out[i] = hc_combine_one(i) for all i < d (strided over the block).
template <int NN>
__device__ __forceinline__ void hc_combine_streams(const float* __restrict__ xt, const double* coef,
                                                   float* __restrict__ out, int d) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = hc_combine_one<NN>(xt, coef, i, d);
}

// Σ over row j (lanes j·4 + k', k' < NN) or column k (lanes j'·4 + k, j' < NN) of the value each
// lane of the warp running hc_pre_coeffs holds, summed in index order like the CPU reference. Every
// lane of the warp calls it.
template <int NN>
__device__ __forceinline__ double hc_row_sum(double v, int j) {
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < NN; k++) s += __shfl_sync(HC_FULL, v, j * HC_MAXN + k);
    return s;
}
template <int NN>
__device__ __forceinline__ double hc_col_sum(double v, int k) {
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < NN; j++) s += __shfl_sync(HC_FULL, v, j * HC_MAXN + k);
    return s;
}

// The pre/post/comb coefficients of one token from its totals, computed by the 32 lanes of one warp
// (warp 0 of hc_pre_f32's block; every warp of hc_pre_coef_f32, a token each; every lane must call
// it): lanes < n give pre (coef[lane], f64), lanes n … 2n−1 post, and lane j·4 + k holds C[j][k]
// through the softmax and the Sinkhorn iterations (lanes with j or k ≥ n hold 0 and write nothing).
// With rec_t (the token's coefficient record), post and comb are also written there as the doubles
// of their f32 values (HC_REC_POST, HC_REC_COMB); hc_pre_coef_f32 passes the record as coef too, so
// the pre weights land at its offset 0.
template <int NN>
__device__ __forceinline__ void hc_pre_coeffs(const float* tot, const float* __restrict__ base,
                                              const float* __restrict__ scale, float* __restrict__ post_t,
                                              float* __restrict__ comb_t, double* coef, int N, int iters, double eps,
                                              double hc_eps, double* __restrict__ rec_t = nullptr) {
    constexpr int M = (2 + NN) * NN;
    const int lane = threadIdx.x & 31;
    const int j = lane / HC_MAXN, k = lane % HC_MAXN;
    const bool valid = j < NN && k < NN;
    if (lane < NN) {
        coef[lane] = hc_sigmoid(hc_logit(tot, M, lane, N, eps) * (double)scale[0] + (double)base[lane]) + hc_eps;
    } else if (lane < 2 * NN) {
        const float pv = (float)(2.0 * hc_sigmoid(hc_logit(tot, M, lane, N, eps) * (double)scale[1] + (double)base[lane]));
        post_t[lane - NN] = pv;
        if (rec_t) {
            rec_t[HC_REC_POST + lane - NN] = (double)pv;
            reinterpret_cast<float*>(rec_t + HC_REC_F32)[lane - NN] = pv;
        }
    }
    const int q = 2 * NN + j * NN + k;
    const double v = valid ? hc_logit(tot, M, q, N, eps) * (double)scale[2] + (double)base[q] : 0.0;
    // Row softmax (max-subtracted, as the CPU does), + hc_eps.
    double mx = __shfl_sync(HC_FULL, v, j * HC_MAXN);
#pragma unroll
    for (int kk = 1; kk < NN; kk++) mx = fmax(mx, __shfl_sync(HC_FULL, v, j * HC_MAXN + kk));
    const double e = valid ? exp(v - mx) : 0.0;
    const double se = hc_row_sum<NN>(e, j);
    double c = valid ? e / se + hc_eps : 0.0;
    // Column normalisation, then (iters − 1) × (rows, then columns), each dividing by (sum + hc_eps).
    double cs = hc_col_sum<NN>(c, k);
    c = valid ? c / (cs + hc_eps) : 0.0;
    for (int it = 1; it < iters; it++) {
        const double rs = hc_row_sum<NN>(c, j);
        c = valid ? c / (rs + hc_eps) : 0.0;
        cs = hc_col_sum<NN>(c, k);
        c = valid ? c / (cs + hc_eps) : 0.0;
    }
    if (valid) {
        const float cv = (float)c;
        comb_t[j * NN + k] = cv;
        if (rec_t) {
            rec_t[HC_REC_COMB + j * NN + k] = (double)cv;
            reinterpret_cast<float*>(rec_t + HC_REC_F32)[HC_MAXN + j * NN + k] = cv;
        }
    }
}

template <int NN>
__device__ void hc_pre_impl(const float* __restrict__ part, const float* __restrict__ x, const float* __restrict__ base,
                            const float* __restrict__ scale, float* __restrict__ u, float* __restrict__ post,
                            float* __restrict__ comb, int d, int iters, double eps, double hc_eps, float* tot,
                            double* coef) {
    const int t = blockIdx.x;
    const int N = NN * d;
    // The totals of the token's partials, then warp 0's coefficients (hc_pre_coef_f32 runs the same
    // two steps with a warp per token), visible to the whole block.
    hc_totals(part, HC_SPLIT, (2 + NN) * NN, tot);
    if (threadIdx.x < 32)
        hc_pre_coeffs<NN>(tot, base, scale, post + (size_t)t * NN, comb + (size_t)t * NN * NN, coef, N, iters, eps,
                          hc_eps);
    __syncthreads();
    hc_combine_streams<NN>(x + (size_t)t * N, coef, u + (size_t)t * d, d);
}

template <int NN>
__device__ void hc_head_impl(const float* __restrict__ part, const float* __restrict__ x, const float* __restrict__ base,
                             const float* __restrict__ scale, float* __restrict__ h, int d, double eps, double hc_eps,
                             float* tot, double* coef) {
    constexpr int M = NN;
    const int t = blockIdx.x;
    const int N = NN * d;
    hc_totals(part, HC_SPLIT, M, tot);
    if (threadIdx.x == 0) {
        const double a = scale[0];
#pragma unroll
        for (int j = 0; j < NN; j++) coef[j] = hc_sigmoid(hc_logit(tot, M, j, N, eps) * a + (double)base[j]) + hc_eps;
    }
    __syncthreads();
    hc_combine_streams<NN>(x + (size_t)t * N, coef, h + (size_t)t * d, d);
}

template <int NN, class S>
__device__ void hc_post_impl(S* __restrict__ x, const float* __restrict__ y, const float* __restrict__ post,
                             const float* __restrict__ comb, int d) {
    const int t = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= d) return;
    S* xt = x + (size_t)t * NN * d;
    const float* pt = post + (size_t)t * NN;
    const float* ct = comb + (size_t)t * NN * NN;
    if constexpr (HcS<S>::F32_POST) {
        // bf16 streams: hc_post_f32_expr (f32), rounded to bf16.
        float old[NN];
#pragma unroll
        for (int j = 0; j < NN; j++) old[j] = HcS<S>::ld1(xt + (size_t)j * d + i);
        const float yi = y[(size_t)t * d + i];
#pragma unroll
        for (int k = 0; k < NN; k++) xt[(size_t)k * d + i] = HcS<S>::narrow1(hc_post_f32_expr<NN>(pt, ct, k, yi, old));
    } else {
        // f32 streams (the exact path): in f64, rounded once.
        double old[NN];
#pragma unroll
        for (int j = 0; j < NN; j++) old[j] = (double)xt[(size_t)j * d + i];
        const double yi = (double)y[(size_t)t * d + i];
#pragma unroll
        for (int k = 0; k < NN; k++) {
            double s = (double)pt[k] * yi;
#pragma unroll
            for (int j = 0; j < NN; j++) s += (double)ct[j * NN + k] * old[j];
            xt[(size_t)k * d + i] = (float)s;
        }
    }
}

// M ∈ {1, 2, 3, 4} (head, n = M) or {3, 8, 15, 24} (pre, n = 1..4); N = n·d, N % 4 == 0.
extern "C" __global__ void __launch_bounds__(HC_PARTIAL_THREADS)
hc_mix_partial_f32(const float* __restrict__ x, const float* __restrict__ fn, float* __restrict__ part, int T, int M,
                   int N) {
    switch (M) {
        case 1: hc_partial_impl<1>(x, fn, part, T, N); break;
        case 2: hc_partial_impl<2>(x, fn, part, T, N); break;
        case 3: hc_partial_impl<3>(x, fn, part, T, N); break;
        case 4: hc_partial_impl<4>(x, fn, part, T, N); break;
        case 8: hc_partial_impl<8>(x, fn, part, T, N); break;
        case 15: hc_partial_impl<15>(x, fn, part, T, N); break;
        case 24: hc_partial_impl<24>(x, fn, part, T, N); break;
        default: break;
    }
}

extern "C" __global__ void __launch_bounds__(HC_THREADS)
hc_pre_f32(const float* __restrict__ part, const float* __restrict__ x, const float* __restrict__ base,
           const float* __restrict__ scale, float* __restrict__ u, float* __restrict__ post, float* __restrict__ comb,
           int n, int d, int iters, double eps, double hc_eps) {
    __shared__ float tot[HC_MAXM + 1];
    __shared__ double coef[HC_MAXN];
    switch (n) {
        case 1: hc_pre_impl<1>(part, x, base, scale, u, post, comb, d, iters, eps, hc_eps, tot, coef); break;
        case 2: hc_pre_impl<2>(part, x, base, scale, u, post, comb, d, iters, eps, hc_eps, tot, coef); break;
        case 3: hc_pre_impl<3>(part, x, base, scale, u, post, comb, d, iters, eps, hc_eps, tot, coef); break;
        case 4: hc_pre_impl<4>(part, x, base, scale, u, post, comb, d, iters, eps, hc_eps, tot, coef); break;
        default: break;
    }
}

extern "C" __global__ void __launch_bounds__(HC_THREADS)
hc_head_f32(const float* __restrict__ part, const float* __restrict__ x, const float* __restrict__ base,
            const float* __restrict__ scale, float* __restrict__ h, int n, int d, double eps, double hc_eps) {
    __shared__ float tot[HC_MAXM + 1];
    __shared__ double coef[HC_MAXN];
    switch (n) {
        case 1: hc_head_impl<1>(part, x, base, scale, h, d, eps, hc_eps, tot, coef); break;
        case 2: hc_head_impl<2>(part, x, base, scale, h, d, eps, hc_eps, tot, coef); break;
        case 3: hc_head_impl<3>(part, x, base, scale, h, d, eps, hc_eps, tot, coef); break;
        case 4: hc_head_impl<4>(part, x, base, scale, h, d, eps, hc_eps, tot, coef); break;
        default: break;
    }
}

// hc_post_f32 / hc_post_bf16 (x as bf16 bits: MHC_BF16_STREAMS; its post in f32, hc_post_f32_expr).
#define HC_POST_ENTRY(NAME, S)                                                                                        \
    extern "C" __global__ void NAME(S* __restrict__ x, const float* __restrict__ y, const float* __restrict__ post,   \
                                    const float* __restrict__ comb, int n, int d) {                                   \
        switch (n) {                                                                                                  \
            case 1: hc_post_impl<1, S>(x, y, post, comb, d); break;                                                   \
            case 2: hc_post_impl<2, S>(x, y, post, comb, d); break;                                                   \
            case 3: hc_post_impl<3, S>(x, y, post, comb, d); break;                                                   \
            case 4: hc_post_impl<4, S>(x, y, post, comb, d); break;                                                   \
            default: break;                                                                                           \
        }                                                                                                             \
    }
HC_POST_ENTRY(hc_post_f32, float)
HC_POST_ENTRY(hc_post_bf16, u16)
#undef HC_POST_ENTRY

// hc_gather_bf16: the embedding rows of the tokens' streams (§4.1) as bf16 stream bits (MHC_BF16_STREAMS):
// dst row r = src row idx[r] rounded to bf16 (exact for a bf16 checkpoint's embedding), NaN rows for
// an index outside [0, src_rows) as gather_rows_f32 writes (0x7fc0, the host's f32_to_bf16 of a NaN:
// cvt.rn.bf16 would give 0x7fff). Launch: grid (rows), any block.
extern "C" __global__ void hc_gather_bf16(const float* __restrict__ src, const int* __restrict__ idx, u16* __restrict__ dst,
                                          int src_rows, int d) {
    const int r = blockIdx.x;
    const int s = idx[r];
    u16* out = dst + (size_t)r * d;
    if (s < 0 || s >= src_rows) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = (u16)0x7fc0u;  // the canonical bf16 quiet NaN
        return;
    }
    const float* in = src + (size_t)s * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = HcS<u16>::narrow1(in[i]);
}

// hc_widen_bf16: dst[i] = src[i] widened (bf16 stream bits → f32) for i < len: the streams the head
// (hc_head_f32) and recorded streams read. Launch: any grid-stride shape.
extern "C" __global__ void hc_widen_bf16(const u16* __restrict__ src, float* __restrict__ dst, long long len) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride) dst[i] = fs_bf16(src[i]);
}

// ---------------------------------------------------------------------------------------------------
// MHC_FUSED: the mix partials of a sub-block's pre computed where the streams are written (by the
// previous sub-block's post), and the pre's finish followed by the sub-block's RMSNorm.
//
// hc_post_mix_f32: x [T, n, d] (in place when post is on), y [T, d], rec [T, HC_REC] (the sub-block
//   pre's coefficient records: post and comb as doubles, and as floats for hc_post_mix_bf16, whose
//   x is bf16 bits and whose post is hc_post_f32_expr), Φ of the NEXT pre (M = (2+n)·n) in channel
//   runs fr [nb][M][n][HCX_RUN] (Φ[o, k·d + HCX_RUN·b + c] at ((b·M + o)·n + k)·HCX_RUN + c, zeros
//   past d; built on the host), part [T, nb, HC_PART] with nb = ceil(d / HCX_RUN).
//   Per token, for its run of HCX_RUN channels (all n streams):
//   - with post (has_post ≠ 0): x'[k][i] = post_k·y[i] + Σ_j comb[j][k]·x[j][i] in f64, exactly
//     hc_post_f32's expression, written in place; without post x' = x (the first pre of a forward);
//   - the M mix products Σ Φ[o, k·d + i]·x'[k][i] and the squared norm Σ x'[k][i]² over the run:
//     part[t, run, o] (o < M) and part[t, run, M].
//   The partial pass's mapping (hc_mix_partial_f32): a warp per HCX_TT tokens, Φ from L1/L2 shared by
//   them. Measured on the H200 at T = 8,192 (n 4, d 4,096): 0.670 ms at 36b2b8a (`git show
//   92a8136:bench/mhc_h200.log`; Φ as [M, N] with an address per load, f32 post/comb converted per
//   lane, a 31-shuffle butterfly per token, 168 registers), 0.527 ms at 352ed7f (`git show
//   8d382d4:bench/mhc_h200.log`; 0.532 at 3f7a317, bench/mhc_h200.log) with the run-major Φ,
//   fmaf chains, the lane sums through shared rows and f64 records (3,142 → 1,984 SASS instructions
//   per warp and 4 tokens; the f32 → f64 conversions, 16 per clock and SM, had been the busiest pipe).
//   Forms not kept (bench/mhc_variants_h200.log): a thread per channel with its Φ values in registers
//   (165–209 registers, 8–12 warps per SM) 0.89–0.99 ms; lanes in quads with an 8-value butterfly
//   0.79 ms. A token's partials run in the same order whatever T and its place in the tile (batch
//   invariant). Launch: grid (nb, ceil(T / (HCX_WARPS·HCX_TT))), block HCX_THREADS (at most 168
//   registers: 3 blocks per SM), HCX_SMEM bytes of dynamic shared memory.
// hc_pre_coef_f32: part [T, S, HC_PART] (S partials per token: HC_SPLIT from hc_mix_partial_f32 or
//   nb from hc_post_mix_f32), base, scale as hc_pre_f32 → post [T, n], comb [T, n, n] and rec
//   [T, HC_REC]: a warp per token sums its S partials in order (hc_totals' order) and runs
//   hc_pre_coeffs (hc_pre_f32's coefficients and Sinkhorn); rec gets the stream weights pre_j (f64)
//   and post / comb as written, widened, and from double HC_REC_F32 on the same post / comb as f32
//   (the bf16 streams' post reads those). Launch: grid ceil(T / HCC_WARPS), block 32·HCC_WARPS.
// hc_pre_norm_f32: rec (above), x, the RMSNorm weight w [d] (or null), out [T, d]: u = Σ_j pre_j·x[t, j]
//   (hc_combine_one, hc_pre_f32's expression) kept in registers and out = w ⊙ u / sqrt(mean(u²) +
//   norm_eps) with rms_norm_f32's reduction (thread i sums channels i, i + 256, …; then
//   fs_block_sum): with hc_pre_coef_f32, the bits of hc_pre_f32 then rms_norm_f32 on the same
//   partials. d ≤ 16·HC_THREADS (hc_pre_norm_wide_f32: d ≤ HCN_V·HC_THREADS). Launch: grid (T), block
//   HC_THREADS; the _bf16 forms with n·d·2 bytes of dynamic shared memory, into which a token's streams
//   are copied by 16-byte cp.async before the combine reads them (d % 8 == 0; HcS::HCN_STAGE). Both at T = 8,192 (n 4, d 4,096) 0.226 ms on the H200 (352ed7f; 0.228 at 3f7a317),
//   against 0.298 (9c99e01, `git show 3a5514f:bench/mhc_h200.log`) for
//   the one kernel that had warp 0 of each block run the Sinkhorn while the block waited (79 % of
//   cycles with no eligible warp, bench/ncu/mhc_T8192_d7cf570.txt); at T = 1, 21.3 µs against 17.5.
//   (Loading the streams into registers before the coefficients, 102 registers, took 0.48 ms; a block
//   per 8 tokens with a warp per token's coefficients, 0.33.)

#define HCX_RUN 64     // channels per block of hc_post_mix_f32 (two per lane)
#define HCX_TT 4       // tokens per warp of hc_post_mix_f32
#define HCX_WARPS 4    // warps per block of hc_post_mix_f32
#define HCX_THREADS (32 * HCX_WARPS)
#define HCX_LD 36      // floats per lane-sum row (hc_row_at): the 32 lanes' values + 4
#define HCX_WFLOATS (HCX_TT * (HC_MAXM + 1) * HCX_LD)  // floats of a warp's lane-sum rows
#define HCX_SMEM (HCX_WARPS * HCX_WFLOATS * 4)  // dynamic shared bytes of hc_post_mix_f32: 57,600
#define HCC_WARPS 8    // tokens (a warp each) per block of hc_pre_coef_f32
#define HCN_V 32       // channels per thread of hc_pre_norm_f32 (d ≤ 8,192)

// Lane-sum rows of a warp: row r (lane ℓ's value at ℓ) starts at r·HCX_LD, HCX_LD = 36 floats, so a
// warp writing one row touches every bank once and so do eight lanes reading the same 16-byte chunk
// of eight consecutive rows (hc_row_total). (Rows of 32 floats starting at r·32 + (r % 8)·4, to fit
// four blocks per SM, overlap: at 46a4d3e they made the partials wrong, and four blocks of 128
// registers timed no faster, 0.535 ms against 0.527 — H200, bench/mhc_variants_h200.log.)
__device__ __forceinline__ int hc_row_at(int r, int lane) { return r * HCX_LD + lane; }

// The 32 values of lane-sum row r added by a fixed tree over the lanes: (ℓ, ℓ+1, ℓ+2, ℓ+3) in
// chunk ℓ/4, then pairs of chunks, pairs of those, ….
__device__ __forceinline__ float hc_row_total(const float* sw, int r) {
    const float4* row = reinterpret_cast<const float4*>(sw + hc_row_at(r, 0));
    float h[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float4 v = row[j];
        h[j] = (v.x + v.y) + (v.z + v.w);
    }
    return ((h[0] + h[1]) + (h[2] + h[3])) + ((h[4] + h[5]) + (h[6] + h[7]));
}

// A token's post [NN] and comb [NN·NN] as doubles from its coefficient record (HC_REC doubles,
// 272 bytes: 16-byte aligned in buffers from cuMemAlloc): double2 loads at n 4, scalar otherwise.
template <int NN>
__device__ __forceinline__ void hc_load_post_comb(const double* __restrict__ rec_t, double (&p)[NN],
                                                  double (&c)[NN * NN]) {
    if constexpr (NN == 4) {
        const double2* r = reinterpret_cast<const double2*>(rec_t);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const double2 v = r[HC_REC_POST / 2 + h];
            p[2 * h] = v.x, p[2 * h + 1] = v.y;
        }
#pragma unroll
        for (int h = 0; h < 8; h++) {
            const double2 v = r[HC_REC_COMB / 2 + h];
            c[2 * h] = v.x, c[2 * h + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int k = 0; k < NN; k++) p[k] = rec_t[HC_REC_POST + k];
#pragma unroll
        for (int k = 0; k < NN * NN; k++) c[k] = rec_t[HC_REC_COMB + k];
    }
}

// A token's post (floats 0 … n − 1) and comb (C[j][k] at HC_MAXN + j·NN + k) as the f32 copies in its
// coefficient record (from double HC_REC_F32: 16-byte aligned, 272·t + 192 bytes), the floats
// hc_pre_coeffs wrote and no others (zeros between them for n < 4): the bf16 posts' coefficients
// (hc_post_mix_bf16, hc_post_mix_tc_bf16), float4 loads at n 4.
template <int NN>
__device__ __forceinline__ void hc_load_post_comb_f32(const double* __restrict__ rec_t, float (&pc)[HC_MAXN + NN * NN]) {
    const float* pf = reinterpret_cast<const float*>(rec_t + HC_REC_F32);
    if constexpr (NN == HC_MAXN) {
#pragma unroll
        for (int e = 0; e < (HC_MAXN + NN * NN) / 4; e++) {
            const float4 v = reinterpret_cast<const float4*>(pf)[e];
            pc[4 * e] = v.x, pc[4 * e + 1] = v.y, pc[4 * e + 2] = v.z, pc[4 * e + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < HC_MAXN + NN * NN; e++) pc[e] = (e < NN || e >= HC_MAXN) ? pf[e] : 0.f;
    }
}

// Warp w of block (b.x, b.y) serves tokens t0 … t0 + HCX_TT − 1, t0 = (b.y·HCX_WARPS + w)·HCX_TT,
// and channels c0 … c0 + HCX_RUN − 1, c0 = b.x·HCX_RUN, of all n streams: lane ℓ owns channels
// c0 + 2ℓ and c0 + 2ℓ + 1 (float2 loads and stores). Each Φ pair it loads (from the run-major copy:
// fixed offsets from one address; L1/L2, the block's four warps share the run) is used for the warp's
// HCX_TT tokens. Per token and o < M the lane's sum is an fmaf chain over its 2·n products (stream k
// in order, the pair's first channel first), likewise its channels' squares; each sum goes at once to
// the warp's lane-sum rows in shared memory (no accumulators held in registers), and after all of
// them lane i ≤ M adds row i of each token (hc_row_total) into part.
// Tokens t0 … t0 + tn − 1 (tn ≤ TT) of one warp: a token's sums do not depend on tn (TT is always HCX_TT).
// post_on is a run-time flag, not a template parameter, so that both forms share one sequence for the
// sums: as two instantiations the compiler fused different products of `a·b + c·d` (by where the
// operands came from), and at n 1 the partials of the with- and without-post forms differed (H200,
// 2026-12-01); the sums are now explicit fmaf chains as well.
template <int NN, int TT, class S>
__device__ __forceinline__ void hc_post_mix_tokens(S* __restrict__ x, const float* __restrict__ y,
                                                   const double* __restrict__ rec, const float* __restrict__ fn,
                                                   float* __restrict__ part, int t0,
                                                   int tn, int d, int i, bool live, int lane, bool post_on, float* sw) {
    constexpr int M = (2 + NN) * NN;
    static_assert(M + 1 <= 32, "the lane sums hold 32 values");
    const int nb = gridDim.x;
    const size_t N = (size_t)NN * d;
    float2 xv[TT][NN];
#pragma unroll
    for (int q = 0; q < TT; q++) {
        const bool ok = live && q < tn;
        const S* xt = x + (size_t)(t0 + q) * N + i;
#pragma unroll
        for (int k = 0; k < NN; k++)
            xv[q][k] = ok ? hc_ld2(xt + (size_t)k * d) : make_float2(0.f, 0.f);
    }
    if (post_on) {  // warp-uniform
        float2 yv[TT];
#pragma unroll
        for (int q = 0; q < TT; q++)
            yv[q] = (live && q < tn) ? *reinterpret_cast<const float2*>(y + (size_t)(t0 + q) * d + i)
                                     : make_float2(0.f, 0.f);
#pragma unroll
        for (int q = 0; q < TT; q++) {
            const int t = t0 + (q < tn ? q : 0);
            S* xt = x + (size_t)(t0 + q) * N + i;
            if constexpr (HcS<S>::F32_POST) {
                // bf16 streams: the f32 post from the record's f32 copies of post and comb.
                float pc[HC_MAXN + NN * NN];
                hc_load_post_comb_f32<NN>(rec + (size_t)t * HC_REC, pc);
                float o0[NN], o1[NN];
#pragma unroll
                for (int j = 0; j < NN; j++) {
                    o0[j] = xv[q][j].x;
                    o1[j] = xv[q][j].y;
                }
#pragma unroll
                for (int k = 0; k < NN; k++) {
                    const typename HcS<S>::P2 st = HcS<S>::narrow2(
                        make_float2(hc_post_f32_expr<NN>(pc, pc + HC_MAXN, k, yv[q].x, o0), hc_post_f32_expr<NN>(pc, pc + HC_MAXN, k, yv[q].y, o1)));
                    xv[q][k] = HcS<S>::wide2(st);
                    if (live && q < tn) *reinterpret_cast<typename HcS<S>::P2*>(xt + (size_t)k * d) = st;
                }
            } else {
                double pt[NN], ct[NN * NN];
                hc_load_post_comb<NN>(rec + (size_t)t * HC_REC, pt, ct);
                // hc_post_f32's expression per channel.
                double o0[NN], o1[NN];
#pragma unroll
                for (int j = 0; j < NN; j++) {
                    o0[j] = (double)xv[q][j].x;
                    o1[j] = (double)xv[q][j].y;
                }
                const double y0 = (double)yv[q].x, y1 = (double)yv[q].y;
#pragma unroll
                for (int k = 0; k < NN; k++) {
                    const double pk = pt[k];
                    double s0 = pk * y0, s1 = pk * y1;
#pragma unroll
                    for (int j = 0; j < NN; j++) {
                        const double c = ct[j * NN + k];
                        s0 += c * o0[j];
                        s1 += c * o1[j];
                    }
                    // The stored pair (f32 streams only: the bf16 ones took the f32 post above).
                    xv[q][k] = make_float2((float)s0, (float)s1);
                    if (live && q < tn) *reinterpret_cast<float2*>(xt + (size_t)k * d) = xv[q][k];
                }
            }
        }
    }
    // Φ of this block's run (hc_phi_runs layout), the lane's pair: offsets known at compile time.
    const float2* fr = reinterpret_cast<const float2*>(fn + (size_t)blockIdx.x * M * NN * HCX_RUN) + lane;
#pragma unroll
    for (int q = 0; q < TT; q++) {
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < NN; k++) {
            s = fmaf(xv[q][k].x, xv[q][k].x, s);
            s = fmaf(xv[q][k].y, xv[q][k].y, s);
        }
        sw[hc_row_at(q * (M + 1) + M, lane)] = s;
    }
#pragma unroll
    for (int o = 0; o < M; o++) {
        float2 w[NN];
#pragma unroll
        for (int k = 0; k < NN; k++)
            w[k] = __ldg(fr + (o * NN + k) * (HCX_RUN / 2));
#pragma unroll
        for (int q = 0; q < TT; q++) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < NN; k++) {
                s = fmaf(w[k].x, xv[q][k].x, s);
                s = fmaf(w[k].y, xv[q][k].y, s);
            }
            sw[hc_row_at(q * (M + 1) + o, lane)] = s;
        }
    }
    __syncwarp();
#pragma unroll
    for (int q = 0; q < TT; q++)
        if (q < tn && lane <= M)
            part[((size_t)(t0 + q) * nb + blockIdx.x) * HC_PART + lane] = hc_row_total(sw, q * (M + 1) + lane);
    __syncwarp();
}

template <int NN, class S>
__device__ __forceinline__ void hc_post_mix_impl(S* __restrict__ x, const float* __restrict__ y,
                                                 const double* __restrict__ rec, const float* __restrict__ fn,
                                                 float* __restrict__ part, int T, int d, bool post_on, float* sw) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = (blockIdx.y * HCX_WARPS + warp) * HCX_TT;
    if (t0 >= T) return;  // warp-uniform; the kernel has no block-wide synchronisation
    const int tn = min(HCX_TT, T - t0);
    const int i = blockIdx.x * HCX_RUN + 2 * lane;  // d is even: a lane's pair is whole or past d
    const bool live = i < d;
    // Every warp, a full one or the last with fewer tokens (a decode step), runs the one four-token
    // sequence (absent tokens load zeros and store nothing): a one-token form was a second
    // instantiation, which NVVM contracted differently at n 1 (the last 7 of 10 tokens alone differed
    // in 1,539 values, H200 2026-12-01), so a token's sums depended on its place in the batch.
    hc_post_mix_tokens<NN, HCX_TT, S>(x, y, rec, fn, part, t0, tn, d, i, live, lane, post_on,
                                   sw + warp * HCX_WFLOATS);
}

// One warp per token: the totals of its S partials (hc_totals' order), then hc_pre_coeffs — the
// coefficients of hc_pre_f32 — into post, comb and the token's record (pre, post, comb as doubles).
template <int NN>
__device__ __forceinline__ void hc_pre_coef_impl(const float* __restrict__ part, int S, const float* __restrict__ base,
                                                 const float* __restrict__ scale, float* __restrict__ post,
                                                 float* __restrict__ comb, double* __restrict__ rec, int T, int d,
                                                 int iters, double eps, double hc_eps, float* tot) {
    constexpr int M = (2 + NN) * NN;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * HCC_WARPS + (threadIdx.x >> 5);
    if (t >= T) return;  // warp-uniform; the kernel has no block-wide synchronisation
    if (lane <= M) tot[lane] = hc_total_of<16>(part + (size_t)t * S * HC_PART + lane, S);
    __syncwarp();
    double* rec_t = rec + (size_t)t * HC_REC;
    hc_pre_coeffs<NN>(tot, base, scale, post + (size_t)t * NN, comb + (size_t)t * NN * NN, rec_t, NN * d, iters, eps,
                      hc_eps, rec_t);
}

template <int NN, int V, class S>
__device__ void hc_pre_norm_impl(const double* __restrict__ rec, const S* __restrict__ x,
                                 const float* __restrict__ w, float* __restrict__ out, int d, float norm_eps,
                                 float* red, S* stage) {
    const int t = blockIdx.x;
    const int N = NN * d;
    const S* xt;
    double coef[NN];
    if constexpr (HcS<S>::HCN_STAGE) {
        // bf16 streams with d % 8 == 0: the token's n·d values copied to shared memory first with
        // 16-byte cp.async (all of them in flight at once, while the coefficients load) and read from
        // there below — the same values, so the same bits as the direct loads.
        xt = x + (size_t)t * N;
        // stage is never null for bf16: the kernel cannot see whether it was launched with the n·d·2
        // bytes, so hc_pre_norm (ops_mhc.rs) is its only launcher and always gives them for d % 8 == 0.
        const bool staged = stage != nullptr && d % 8 == 0;  // block-uniform
        if (staged) {
            const int chunks = N * (int)sizeof(S) / 16;
            for (int c = threadIdx.x; c < chunks; c += HC_THREADS) gm_cp16(gm_smem(stage) + 16 * c, reinterpret_cast<const uint4*>(xt) + c, true);
            gm_commit();
        }
#pragma unroll
        for (int j = 0; j < NN; j++) coef[j] = rec[(size_t)t * HC_REC + j];
        if (staged) {
            gm_wait<0>();
            __syncthreads();
            xt = stage;
        }
    } else {
#pragma unroll
        for (int j = 0; j < NN; j++) coef[j] = rec[(size_t)t * HC_REC + j];
        xt = x + (size_t)t * N;
    }
    float uv[V];
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int i = threadIdx.x + v * HC_THREADS;
        uv[v] = 0.f;
        if (i < d) {
            uv[v] = hc_combine_one<NN, S>(xt, coef, i, d);
            s += uv[v] * uv[v];
        }
    }
    const float r = rsqrtf(fs_block_sum(s, red, HC_THREADS >> 5) / (float)d + norm_eps);
    float* ot = out + (size_t)t * d;
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int i = threadIdx.x + v * HC_THREADS;
        if (i < d) ot[i] = (w ? w[i] : 1.f) * (uv[v] * r);
    }
}

// has_post: 0 = mix only (x read; rec unused), 1 = post then mix (x updated in place). n ∈ 1..4.
// hc_post_mix_f32 / hc_post_mix_bf16 (x as bf16 bits: MHC_BF16_STREAMS).
#define HCX_ENTRY(NAME, S)                                                                                            \
    extern "C" __global__ void __launch_bounds__(HCX_THREADS, 3)                                                      \
    NAME(S* __restrict__ x, const float* __restrict__ y, const double* __restrict__ rec, const float* __restrict__ fn, \
         float* __restrict__ part, int T, int n, int d, int has_post) {                                               \
        extern __shared__ float4 hc_dyn_smem[]; /* HCX_SMEM bytes: each warp's lane-sum rows */                      \
        float* sw = reinterpret_cast<float*>(hc_dyn_smem);                                                            \
        switch (n) {                                                                                                  \
            case 1: hc_post_mix_impl<1, S>(x, y, rec, fn, part, T, d, has_post != 0, sw); break;                      \
            case 2: hc_post_mix_impl<2, S>(x, y, rec, fn, part, T, d, has_post != 0, sw); break;                      \
            case 3: hc_post_mix_impl<3, S>(x, y, rec, fn, part, T, d, has_post != 0, sw); break;                      \
            case 4: hc_post_mix_impl<4, S>(x, y, rec, fn, part, T, d, has_post != 0, sw); break;                      \
            default: break;                                                                                           \
        }                                                                                                             \
    }
HCX_ENTRY(hc_post_mix_f32, float)
HCX_ENTRY(hc_post_mix_bf16, u16)
#undef HCX_ENTRY

extern "C" __global__ void __launch_bounds__(HCC_WARPS * 32)
hc_pre_coef_f32(const float* __restrict__ part, int S, const float* __restrict__ base, const float* __restrict__ scale,
                float* __restrict__ post, float* __restrict__ comb, double* __restrict__ rec, int T, int n, int d,
                int iters, double eps, double hc_eps) {
    __shared__ float tot[HCC_WARPS][32];
    float* tw = tot[threadIdx.x >> 5];
    switch (n) {
        case 1: hc_pre_coef_impl<1>(part, S, base, scale, post, comb, rec, T, d, iters, eps, hc_eps, tw); break;
        case 2: hc_pre_coef_impl<2>(part, S, base, scale, post, comb, rec, T, d, iters, eps, hc_eps, tw); break;
        case 3: hc_pre_coef_impl<3>(part, S, base, scale, post, comb, rec, T, d, iters, eps, hc_eps, tw); break;
        case 4: hc_pre_coef_impl<4>(part, S, base, scale, post, comb, rec, T, d, iters, eps, hc_eps, tw); break;
        default: break;
    }
}

// hc_pre_norm_f32: d ≤ 16·HC_THREADS (16 channels per thread); hc_pre_norm_wide_f32: d ≤ HCN_V·HC_THREADS;
// the _bf16 pair reads x as bf16 bits (MHC_BF16_STREAMS).
#define HCN_ENTRY(NAME, V, S)                                                                                         \
    extern "C" __global__ void __launch_bounds__(HC_THREADS)                                                          \
    NAME(const double* __restrict__ rec, const S* __restrict__ x, const float* __restrict__ w,                       \
         float* __restrict__ out, int n, int d, float norm_eps) {                                                     \
        __shared__ float red[32];                                                                                     \
        extern __shared__ uint4 hcn_dyn_smem[]; /* HCN_STAGE: n·d stream values (the host sizes it) */               \
        S* stage = HcS<S>::HCN_STAGE ? reinterpret_cast<S*>(hcn_dyn_smem) : nullptr;                                  \
        switch (n) {                                                                                                  \
            case 1: hc_pre_norm_impl<1, V, S>(rec, x, w, out, d, norm_eps, red, stage); break;                        \
            case 2: hc_pre_norm_impl<2, V, S>(rec, x, w, out, d, norm_eps, red, stage); break;                        \
            case 3: hc_pre_norm_impl<3, V, S>(rec, x, w, out, d, norm_eps, red, stage); break;                        \
            case 4: hc_pre_norm_impl<4, V, S>(rec, x, w, out, d, norm_eps, red, stage); break;                        \
            default: break;                                                                                           \
        }                                                                                                             \
    }
HCN_ENTRY(hc_pre_norm_f32, 16, float)
HCN_ENTRY(hc_pre_norm_wide_f32, HCN_V, float)
HCN_ENTRY(hc_pre_norm_bf16, 16, u16)
HCN_ENTRY(hc_pre_norm_wide_bf16, HCN_V, u16)
#undef HCN_ENTRY

// ---------------------------------------------------------------------------------------------------
// MHC_MIX_TC (with MHC_BF16_STREAMS): hc_post_mix_bf16 with the next pre's mix on tensor cores.
//
// hc_post_mix_tc_bf16(x, y, rec, fb, part, T, n, d, has_post): x [T, n, d] bf16 bits, y, rec and
//   has_post as hc_post_mix_bf16, whose post it computes per channel with the same expression
//   (hc_post_f32_expr, rounded to nearest even: the same stored bits, gpu-check `hc_post_mix_tc x
//   bits`); Φ of the next pre as bf16 planes in MMA fragment order, fb (below, built on the host by
//   ops_mhc.rs `hc_phi_tc`); part [T, nb, HC_PART], nb = ceil(d / HCT_RUN) runs of 128 channels.
//   The mix Σ Φ[o, k·d + i]·x'[k][i] runs as mma.sync m16n8k16 (bf16 × bf16 → f32): A = the stored
//   streams (bf16, so exact as operands), B = Φ split into three bf16 planes (Φ = p0 + p1 + p2
//   exactly: each plane carries 8 of f32's 24 significand bits; checked on the host), every product
//   exact and summed in the tensor cores' f32 accumulators — an f32-accurate dot product in another
//   order than the CUDA-core mix (hc_post_mix_bf16: fmaf chains per lane, a tree over lanes), so the
//   partials and everything after them are not those bits (gpu-check: NMSE against the CPU and the
//   CUDA-core mix). The squared norm per token stays on the CUDA cores (fmaf over the lane's values,
//   then the lane quad's butterfly). Each output row of an MMA depends on that row's operands only,
//   so a token's partials do not depend on T or its place in the tile (batch invariant, checked).
//   Mapping: a warp per 16 tokens (the MMA's rows; lane ℓ: g = ℓ / 4 owns tokens t0 + g and t0 + g
//   + 8, c = ℓ % 4 channels 8c … 8c + 7 of each 32-channel chunk), a block of HCT_WARPS warps per
//   run and 64 tokens — or, for T ≤ 16 (decode), the block's four warps on the one tile, warp w
//   taking chunk w (a run's chunks one after the other had made a one-token call 14.1 µs against
//   hc_post_mix_bf16's 9.5, H200); either way each chunk's sums start from zero and the run's total
//   adds them in chunk order (through shared memory in the split form), so the bits do not depend on
//   the form; per chunk the lane loads its 8 channels of each stream and token (16 bytes),
//   posts and stores them, and those 16 bytes are its A fragments (m16n8k16's k 2c, 2c + 1, 2c + 8,
//   2c + 9 of a 16-wide k step stand for channels 8c + 4s + 0 … 3 of k step s ∈ {0, 1}; B follows
//   the same map). Outputs o = 8·nt + column, nt < NT = ceil(M / 8) n-tiles. Launch: grid (nb,
//   ceil(T / 64)), block HCT_THREADS, no dynamic shared memory (7 KiB static: the split form's
//   stash). d % 8 == 0. The tensor cores' f32 accumulation is not IEEE round-to-nearest per
//   addition (the aligned products are truncated), so "the same bits" (split and tiled forms, batch
//   invariance) holds for one GPU architecture.
// fb: uint4 (((b·HCT_CHUNKS + q)·n + k)·F4 + f)·32 + ℓ for run b, chunk q, stream k, lane ℓ, F4 =
//   3·NT uint4s per lane; word w = 4f + j of a lane's F4 = ((s·NT + nt)·3 + p)·2 + r holds plane p of
//   Φ[8·nt + g, k·d + i] for channels i = 128b + 32q + 8c + 4s + 2r + {0 (low half), 1 (high half)}
//   (zero past M or d).
#define HCT_RUN 128    // channels per run (block) of hc_post_mix_tc_bf16
#define HCT_CHUNK 32   // channels per chunk: 8 per lane quad
#define HCT_CHUNKS (HCT_RUN / HCT_CHUNK)
#define HCT_WARPS 4    // warps per block, 16 tokens each
#define HCT_THREADS (32 * HCT_WARPS)
#define HCT_STASH 14   // floats per lane of a chunk's sums in the split form: 3 n-tiles × 4 + 2 squares
// Timing diagnostics only (FLASHSEEK_KERNEL_DEFINES; wrong partials): HCT_PLANES=1 or 2 multiplies only
// the first planes of Φ (the host still lays out three), HCT_NO_MMA=1 neither loads Φ nor multiplies.
// What they measured: bench/mhc_variants_h200.log.
#ifndef HCT_PLANES
#define HCT_PLANES 3
#endif
#ifndef HCT_NO_MMA
#define HCT_NO_MMA 0
#endif
static_assert(HCT_WARPS == HCT_CHUNKS, "the split form gives each warp one chunk of the run");

// Word j (0 … 3) of v.
__device__ __forceinline__ u32 hct_word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

template <int NN>
__device__ __forceinline__ void hc_post_mix_tc_impl(u16* __restrict__ x, const float* __restrict__ y,
                                                    const double* __restrict__ rec, const uint4* __restrict__ fb,
                                                    float* __restrict__ part, int T, int d, bool post_on, float* stash) {
    constexpr int M = (2 + NN) * NN, NT = (M + 7) / 8, F4 = 3 * NT, NP = HC_MAXN + NN * NN;
    static_assert(M + 1 <= HC_PART, "the partial rows hold M sums and the squared norm");
    static_assert(4 * NT + 2 <= HCT_STASH, "the split form's stash holds a chunk's sums and squares");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    // T ≤ 16 (decode): the block's warps share the one 16-token tile, warp w taking chunk w of the
    // run; otherwise each warp takes its own tile and all the run's chunks. Block-uniform.
    const bool split = T <= 16;
    const int t0 = split ? 0 : (blockIdx.y * HCT_WARPS + warp) * 16;
    if (t0 >= T) return;  // warp-uniform; only the split form synchronises the block (and has t0 = 0)
    const int b = blockIdx.x, nb = gridDim.x;
    const size_t N = (size_t)NN * d;
    const int tr[2] = {t0 + g, t0 + g + 8};
    const bool rv[2] = {tr[0] < T, tr[1] < T};
    // The run's sums: each chunk's MMAs and squares start from zero and the chunks' sums are added
    // in chunk order (tot, sqt), the same sequence whichever warp computed a chunk.
    float tot[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) tot[nt][0] = tot[nt][1] = tot[nt][2] = tot[nt][3] = 0.f;
    float sqt[2] = {0.f, 0.f};
#pragma unroll 1
    for (int qi = 0; qi < (split ? 1 : HCT_CHUNKS); qi++) {
        const int q = split ? warp : qi;
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        float sq[2] = {0.f, 0.f};
        const int i = b * HCT_RUN + q * HCT_CHUNK + 8 * c;  // the lane's first channel
        const bool cv = i < d;                              // d % 8 == 0: all 8 channels or none
        uint4 xs[2][NN];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int k = 0; k < NN; k++)
                xs[r][k] = (cv && rv[r]) ? *reinterpret_cast<const uint4*>(x + (size_t)tr[r] * N + (size_t)k * d + i)
                                         : make_uint4(0u, 0u, 0u, 0u);
        if (post_on) {  // warp-uniform
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const bool ok = cv && rv[r];
                // The record's f32 copies of post and comb (a row past T reads token t0's, valid, and
                // stores nothing).
                float pc[NP];
                hc_load_post_comb_f32<NN>(rec + (size_t)(rv[r] ? tr[r] : t0) * HC_REC, pc);
                float yv[8];
                {
                    const float4* yp = reinterpret_cast<const float4*>(y + (size_t)(rv[r] ? tr[r] : t0) * d + (cv ? i : 0));
                    const float4 y0 = ok ? yp[0] : make_float4(0.f, 0.f, 0.f, 0.f);
                    const float4 y1 = ok ? yp[1] : make_float4(0.f, 0.f, 0.f, 0.f);
                    yv[0] = y0.x, yv[1] = y0.y, yv[2] = y0.z, yv[3] = y0.w, yv[4] = y1.x, yv[5] = y1.y, yv[6] = y1.z, yv[7] = y1.w;
                }
                u32 nw[NN][4];
#pragma unroll
                for (int h = 0; h < 4; h++) {  // channel pair 2h, 2h + 1
                    float o0[NN], o1[NN];
#pragma unroll
                    for (int j = 0; j < NN; j++) {
                        const float2 v = HcS<u16>::wide2(hct_word(xs[r][j], h));
                        o0[j] = v.x, o1[j] = v.y;
                    }
#pragma unroll
                    for (int k = 0; k < NN; k++)
                        nw[k][h] = HcS<u16>::narrow2(make_float2(hc_post_f32_expr<NN>(pc, pc + HC_MAXN, k, yv[2 * h], o0),
                                                                 hc_post_f32_expr<NN>(pc, pc + HC_MAXN, k, yv[2 * h + 1], o1)));
                }
#pragma unroll
                for (int k = 0; k < NN; k++) {
                    xs[r][k] = make_uint4(nw[k][0], nw[k][1], nw[k][2], nw[k][3]);
                    if (ok) *reinterpret_cast<uint4*>(x + (size_t)tr[r] * N + (size_t)k * d + i) = xs[r][k];
                }
            }
        }
        // The squared norm: the lane's values of each row, stream by stream, channel by channel.
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int k = 0; k < NN; k++)
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    const float2 v = HcS<u16>::wide2(hct_word(xs[r][k], h));
                    sq[r] = fmaf(v.x, v.x, sq[r]);
                    sq[r] = fmaf(v.y, v.y, sq[r]);
                }
        // The mix: per stream two k steps × NT n-tiles × three planes of Φ.
        const uint4* fq = fb + (size_t)(b * HCT_CHUNKS + q) * NN * F4 * 32 + lane;
#pragma unroll
        for (int k = 0; k < (HCT_NO_MMA ? 0 : NN); k++) {
            uint4 bf[F4];
#pragma unroll
            for (int f = 0; f < F4; f++) bf[f] = __ldg(fq + (k * F4 + f) * 32);
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const u32 a[4] = {hct_word(xs[0][k], 2 * s), hct_word(xs[1][k], 2 * s), hct_word(xs[0][k], 2 * s + 1),
                                  hct_word(xs[1][k], 2 * s + 1)};
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int p = 0; p < HCT_PLANES; p++) {
                        const int w = ((s * NT + nt) * 3 + p) * 2;
                        gm_mma(acc[nt], a, hct_word(bf[w / 4], w % 4), hct_word(bf[w / 4], w % 4 + 1));
                    }
            }
        }
        if (split) {
            // The chunk's sums to the block's stash (lane-major rows of HCT_STASH floats).
            float* st = stash + (warp * 32 + lane) * HCT_STASH;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[4 * nt + e] = acc[nt][e];
            st[4 * NT] = sq[0], st[4 * NT + 1] = sq[1];
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) tot[nt][e] += acc[nt][e];
            sqt[0] += sq[0], sqt[1] += sq[1];
        }
    }
    if (split) {
        __syncthreads();
        if (warp != 0) return;
#pragma unroll 1
        for (int q = 0; q < HCT_CHUNKS; q++) {
            const float* st = stash + (q * 32 + lane) * HCT_STASH;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) tot[nt][e] += st[4 * nt + e];
            sqt[0] += st[4 * NT], sqt[1] += st[4 * NT + 1];
        }
    }
    // The lane quad's squared norms, a fixed butterfly (every lane of the quad ends with the same sum).
    float sq[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        sq[r] = sqt[r] + __shfl_xor_sync(HC_FULL, sqt[r], 1);
        sq[r] += __shfl_xor_sync(HC_FULL, sq[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!rv[r]) continue;
        float* pr = part + ((size_t)tr[r] * nb + b) * HC_PART;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int o = 8 * nt + 2 * c;
            if (o < M) pr[o] = tot[nt][2 * r];
            if (o + 1 < M) pr[o + 1] = tot[nt][2 * r + 1];
        }
        if (c == 0) pr[M] = sq[r];
    }
}

// has_post as hc_post_mix_bf16. n ∈ 1..4.
extern "C" __global__ void __launch_bounds__(HCT_THREADS, 4)
hc_post_mix_tc_bf16(u16* __restrict__ x, const float* __restrict__ y, const double* __restrict__ rec,
                    const uint4* __restrict__ fb, float* __restrict__ part, int T, int n, int d, int has_post) {
    __shared__ float stash[HCT_CHUNKS * 32 * HCT_STASH];  // the split form's chunk sums (7 KiB)
    switch (n) {
        case 1: hc_post_mix_tc_impl<1>(x, y, rec, fb, part, T, d, has_post != 0, stash); break;
        case 2: hc_post_mix_tc_impl<2>(x, y, rec, fb, part, T, d, has_post != 0, stash); break;
        case 3: hc_post_mix_tc_impl<3>(x, y, rec, fb, part, T, d, has_post != 0, stash); break;
        case 4: hc_post_mix_tc_impl<4>(x, y, rec, fb, part, T, d, has_post != 0, stash); break;
        default: break;
    }
}
