// linear.cu — y[t, n] = Σ_k x[t, k] · W[n, k] for small token counts (decode and short chunks),
// with the weight dequantized in-kernel (spec §6). Implements the linear layers of spec §4.5–§4.11
// for one small batch of tokens.
//
// Inputs: x [T, K] f32 with rows ldx floats apart (ldx ≥ K, a multiple of 4); y [T, N] f32 with
// rows ldy floats apart (ldy ≥ N): a column block of a wider matrix, e.g. one group of the grouped
// output projection wo_a (spec §4.7) read from and written into the full [T, G·K] / [T, G·N]
// buffers, no gather or scatter. Weight layouts (row-major, rows = outputs):
//   linear_f32:  W f32 [N, K]                                                   (K % 4 == 0)
//   linear_bf16: W bf16 bits [N, K]                                             (K % 8 == 0)
//   linear_fp8:  W e4m3 [N, K] + ue8m0 scales [ceil(N/128), ceil(K/128)]        (K % 16 == 0)
//   linear_fp4:  W packed [N, K/2] (low nibble = even k) + ue8m0 scales [N, K/32] (K % 32 == 0)
// Launch: grid (min(ceil(N / 8), G), ceil(T / TT)), block 256 = 8 warps; warp w of block b handles
// rows b·8 + w, then + gridDim.x·8, … (x is staged once per block and reused for all its rows), up
// to TT tokens per block. `linear_*` use TT = 8; `linear_*_t1` are the decode (T = 1) variants
// with a single accumulator (fewer registers, higher occupancy). Each lane streams 16-byte weight chunks (UNROLL of them issued before any
// use, for memory-level parallelism); x is staged in shared memory when the tile fits.
// Per chunk the dot product is accumulated unscaled and multiplied by the chunk's block scale once
// (FP8: 16 values share one 128×128 block; FP4: one chunk = one 32-value group).
// Decoders: FP8 through the hardware e4m3x2 → f16x2 conversion (sm_89+); FP4 through a 256-entry
// byte → (lo, hi) table in shared memory. f32 accumulation per lane, then a fixed butterfly sum:
// deterministic.
// `linear_<fmt>_q` / `linear_<fmt>_t1_q` (switch LINEAR_FUSED_QUANT): DeepSeek's official numerics
// below the FP8 GEMM's 64 tokens — the input quantize-dequantized per 128-value block (common.cuh
// fs_q8_quant4, act_quant_fp8's roundtrip: e4m3(x / s)·s) while it is staged, then the same
// product. The same values as act_quant_fp8 (mode 1) on a copy of x followed by `linear_<fmt>[_t1]`
// on it, so the same bits, in one launch instead of three (copy, roundtrip, gemv). Needs the staged
// tile: min(T, TT)·K ≤ XS_FLOATS and K % 128 == 0 (the host checks; anything else traps).

#define TT 8
#define UNROLL 4
#define XS_FLOATS 8192  // 32 KB of staged activations

__device__ __forceinline__ float2 fs_e4m3x2(u32 two_bytes) {
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)two_bytes));
    float lo, hi;
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(h2));
    return make_float2(lo, hi);
}

// The scale byte of row n's chunk c (FP8: its 128 × 128 block; FP4: its 32-value group; 127
// = 1.0 past the row's chunks and for f32 / bf16, which have none).
template <int FMT, int PER>
__device__ __forceinline__ u8 fs_chunk_scale(const u8* __restrict__ S, int n, int c, int chunks, int sk, int K) {
    if (FMT == 2) return c < chunks ? __ldg(S + (size_t)(n >> 7) * sk + ((c * PER) >> 7)) : (u8)127;
    if (FMT == 3) return c < chunks ? __ldg(S + (size_t)n * (K / 32) + ((c * PER) >> 5)) : (u8)127;
    return (u8)127;
}

// One 16-byte chunk c of a weight row (raw, scale byte sc) decoded and dotted with each of the
// block's tn tokens' inputs (staged in xb's permuted layout, or rows ldx apart): acc[j] += (Σ_q
// w_q · x_j,q) · scale, the sum over the chunk's PER values in order, from 0.
template <int FMT, int PER, int TT_>
__device__ __forceinline__ void fs_chunk_dot(const uint4 raw, u8 sc, int c, int chunks, int tn, bool staged, const float* xb, int K, int ldx,
                                             const float2* lut4, float (&acc)[TT_]) {
    const int k0 = c * PER;
    float w[PER];
    u32 p[4] = {raw.x, raw.y, raw.z, raw.w};
    float scale = 1.f;
    if (FMT == 0) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = __uint_as_float(p[i]);
    } else if (FMT == 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) { w[2 * i] = fs_bf16((u16)(p[i] & 0xffffu)); w[2 * i + 1] = fs_bf16((u16)(p[i] >> 16)); }
    } else if (FMT == 2) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 a = fs_e4m3x2(p[i] & 0xffffu), b = fs_e4m3x2(p[i] >> 16);
            w[4 * i] = a.x; w[4 * i + 1] = a.y; w[4 * i + 2] = b.x; w[4 * i + 3] = b.y;
        }
        scale = fs_e8m0(sc);
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float2 v = lut4[(p[i >> 2] >> (8 * (i & 3))) & 0xffu];
            w[2 * i] = v.x; w[2 * i + 1] = v.y;
        }
        scale = fs_e8m0(sc);
    }
#pragma unroll
    for (int j = 0; j < TT_; j++) {
        if (j < tn) {
            float s = 0.f;
            if (staged) {
                const float* xr = xb + (size_t)j * K + c;
#pragma unroll
                for (int q = 0; q < PER; q++) s += w[q] * xr[q * chunks];
            } else {
                const float* xr = xb + (size_t)j * ldx + k0;
#pragma unroll
                for (int q = 0; q < PER; q++) s += w[q] * xr[q];
            }
            acc[j] += s * scale;
        }
    }
}

// The row blocks and output epilogue of fs_linear's MULTI form (linear_*_multi): its block bx of gx
// (instead of blockIdx.x of gridDim.x) and, with bias, y = v + bias[((pos0 + t) mod ratio)·N + n] for
// token t (the compressors' position bias, spec §4.8 step 1: add_position_bias_f32's one f32 add).
struct FsEpi {
    int bx, gx;
    const float* bias;
    int ratio, pos0;
};

// Output value v of row n, token t: v, or with MULTI and a bias the biased value.
template <bool MULTI>
__device__ __forceinline__ float fs_epi(float v, const FsEpi& ep, int t, int N, int n) {
    if (MULTI && ep.bias != nullptr) v += ep.bias[(size_t)((ep.pos0 + t) % ep.ratio) * N + n];
    return v;
}

// FMT: 0 f32, 1 bf16, 2 fp8, 3 fp4. PER = values per 16-byte chunk. QRT: the input
// quantize-dequantized per 128 values as it is staged (linear_*_q). PF: the one-token kernel with
// the next row's loads issued before the current row is reduced (linear_*_t1p*). MULTI: row blocks
// and epilogue from ep (linear_*_multi); otherwise ep is unused and the code is the plain form's.
template <int FMT, int PER, int TT_, bool QRT = false, bool PF = false, bool MULTI = false>
__device__ __forceinline__ void fs_linear(const float* __restrict__ x, const void* __restrict__ Wv,
                                          const u8* __restrict__ S, float* __restrict__ y, int T, int N, int K,
                                          int ldx, int ldy, FsEpi ep = FsEpi{0, 0, nullptr, 1, 0}) {
    const unsigned BX = MULTI ? (unsigned)ep.bx : blockIdx.x, GX = MULTI ? (unsigned)ep.gx : gridDim.x;
    __shared__ float xs[XS_FLOATS];
    __shared__ float2 lut4[256];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t0 = blockIdx.y * TT_;
    int tn = min(TT_, T - t0);
    if (FMT == 3) {
        int b = threadIdx.x;
        lut4[b] = make_float2(fs_e2m1(b & 15), fs_e2m1(b >> 4));
    }
    bool staged = tn * K <= XS_FLOATS;
    // Staged layout: token j's value k sits at j·K + (k % PER)·(K / PER) + k / PER, so that the 32
    // lanes of a warp (lane ↔ chunk c = k / PER) read consecutive words for each q = k % PER:
    // conflict-free shared-memory reads (a plain layout would put every lane in the same bank pair).
    const int chunks = K / PER;
    if (QRT) {
        if (!staged || (K & 127) != 0) __trap();  // the host takes linear_*_q only for staged tiles of 128-blocks
        // One warp per (token, 128-block): lane l quantizes values 4 l … 4 l + 3 of the block
        // (act_quant_fp8's assignment, so fs_q8_quant4 sees the same values in the same lanes).
        const int KB = K >> 7, warps = blockDim.x >> 5;
        for (int u = threadIdx.x >> 5; u < tn * KB; u += warps) {
            const int j = u / KB, c0 = (u - j * KB) * 128 + (threadIdx.x & 31) * 4;
            const float4 f = __ldg(reinterpret_cast<const float4*>(x + (size_t)(t0 + j) * ldx + c0));
            const float v[4] = {f.x, f.y, f.z, f.w};
            float sc;
            const u32 pk = fs_q8_quant4(v, sc);
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int k = c0 + r;
                xs[j * K + (k % PER) * chunks + k / PER] = fs_e4m3((u8)(pk >> (8 * r))) * sc;
            }
        }
    } else if (staged) {
        const int k4 = K / 4;  // float4s per row (K % 4 == 0 for every format)
        int n4 = tn * k4;
        for (int i0 = threadIdx.x; i0 < n4; i0 += 4 * blockDim.x) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = i0 + u * blockDim.x;
                v[u] = i < n4 ? __ldg(reinterpret_cast<const float4*>(x + (size_t)(t0 + i / k4) * ldx) + i % k4)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = i0 + u * blockDim.x;
                if (i < n4) {
                    float e[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        int flat = 4 * i + r, j = flat / K, k = flat - j * K;
                        xs[j * K + (k % PER) * chunks + k / PER] = e[r];
                    }
                }
            }
        }
    }
    __syncthreads();
    const float* xb = staged ? xs : x + (size_t)t0 * ldx;
    // Bytes per weight row and per chunk.
    const size_t row_bytes = FMT == 0 ? (size_t)K * 4 : FMT == 1 ? (size_t)K * 2 : FMT == 2 ? (size_t)K : (size_t)K / 2;
    const int sk = (K + 127) / 128;
    if constexpr (!PF) {
    for (int n = BX * 8 + warp; n < N; n += GX * 8) {
    const uint4* wrow = reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(Wv) + (size_t)n * row_bytes);
    float acc[TT_];
#pragma unroll
    for (int j = 0; j < TT_; j++) acc[j] = 0.f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * UNROLL) {
        uint4 raw[UNROLL];
        u8 sc[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int c = c0 + 32 * u;
            raw[u] = c < chunks ? __ldg(wrow + c) : make_uint4(0, 0, 0, 0);
            sc[u] = fs_chunk_scale<FMT, PER>(S, n, c, chunks, sk, K);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int c = c0 + 32 * u;
            if (c >= chunks) break;
            fs_chunk_dot<FMT, PER, TT_>(raw[u], sc[u], c, chunks, tn, staged, xb, K, ldx, lut4, acc);
        }
    }
#pragma unroll
    for (int j = 0; j < TT_; j++) {
        float v = fs_warp_sum(acc[j]);
        if (lane == 0 && j < tn) y[(size_t)(t0 + j) * ldy + n] = fs_epi<MULTI>(v, ep, t0 + j, N, n);
    }
    }
    } else {
    // LINEAR_T1_PREFETCH (one token): the warp's work is the sequence of (row, batch) items — its
    // rows n, n + G, … (G = gridDim.x · 8, the same rows as above), each in batches of UNROLL
    // chunks per lane — and the next item's loads are issued before the current one is used, so
    // that a row's reduction and the next row's first loads overlap instead of following each
    // other. Each row's sum is formed as above (chunks c = lane, lane + 32, … in order, then the
    // warp's butterfly): the same bits.
    static_assert(TT_ == 1, "the prefetching form is the one-token kernel's");
    const int G = GX * 8, per_row = (chunks + 32 * UNROLL - 1) / (32 * UNROLL);
    int n = BX * 8 + warp, b = 0;  // the current item: row n, batch b
    uint4 raw[UNROLL], nraw[UNROLL];
    u8 sc[UNROLL], nsc[UNROLL];
    // Loads item (row, batch); called for rows < N only.
    auto load = [&](int row, int batch, uint4 (&r)[UNROLL], u8 (&s)[UNROLL]) {
        const uint4* wrow = reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(Wv) + (size_t)row * row_bytes);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int c = lane + 32 * (batch * UNROLL + u);
            r[u] = c < chunks ? __ldg(wrow + c) : make_uint4(0, 0, 0, 0);
            s[u] = fs_chunk_scale<FMT, PER>(S, row, c, chunks, sk, K);
        }
    };
    if (n < N) load(n, 0, raw, sc);
    float acc[1] = {0.f};
    while (n < N) {
        const int nb = b + 1 == per_row ? 0 : b + 1, nn = b + 1 == per_row ? n + G : n;
        if (nn < N) load(nn, nb, nraw, nsc);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int c = lane + 32 * (b * UNROLL + u);
            if (c >= chunks) break;
            fs_chunk_dot<FMT, PER, 1>(raw[u], sc[u], c, chunks, tn, staged, xb, K, ldx, lut4, acc);
        }
        if (nb == 0) {
            const float v = fs_warp_sum(acc[0]);
            if (lane == 0) y[(size_t)t0 * ldy + n] = fs_epi<MULTI>(v, ep, t0, N, n);
            acc[0] = 0.f;
        }
        n = nn;
        b = nb;
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            raw[u] = nraw[u];
            sc[u] = nsc[u];
        }
    }
    }
}

// Each FS_LINEAR_ENTRY defines two entry points:
//   NAME (x, W, S, y, T, N, K, ldx, ldy): one weight; S is ignored (pass 0) for f32 and bf16.
//   NAME_grouped (x, wtab, stab, y, T, N, K, ldx, ldy): G weights of one format and shape [N, K] in
//     one launch, group g = blockIdx.z with its weight and scales at wtab[g] / stab[g] (device
//     addresses; stab ignored for f32 and bf16); its inputs are columns g·K.. of x's rows and its
//     outputs columns g·N.. of y's rows (the block-diagonal grouped output projection wo_a, spec
//     §4.7: ldx = G·K, ldy = G·N). Each group runs NAME's code on the same values: the same bits as
//     one strided NAME launch per group. Launch: grid (min(ceil(N / 8), G'), ceil(T / TT), G).
// FS_LINEAR_ONE / FS_LINEAR_GROUPED: one entry point of each form running the fs_linear
// instantiation given last (variadic: its template arguments hold commas).
#define FS_LINEAR_ONE(NAME, WT, ...)                                                                    \
    extern "C" __global__ void NAME(const float* __restrict__ x, const WT* __restrict__ W, const u8* __restrict__ S, \
                                    float* __restrict__ y, int T, int N, int K, int ldx, int ldy) {           \
        __VA_ARGS__(x, W, S, y, T, N, K, ldx, ldy);                                                           \
    }
#define FS_LINEAR_GROUPED(NAME, WT, FMT, ...)                                                           \
    extern "C" __global__ void NAME(const float* __restrict__ x, const unsigned long long* __restrict__ wtab, \
                                    const unsigned long long* __restrict__ stab, float* __restrict__ y,       \
                                    int T, int N, int K, int ldx, int ldy) {                                  \
        const int g = blockIdx.z;                                                                             \
        const u8* S = (FMT >= 2) ? reinterpret_cast<const u8*>(stab[g]) : nullptr;                            \
        __VA_ARGS__(x + (size_t)g * K, reinterpret_cast<const WT*>(wtab[g]), S, y + (size_t)g * N, T, N, K, ldx, ldy); \
    }

#define FS_LINEAR_ENTRY(NAME, WT, FMT, PER, TTV)          \
    FS_LINEAR_ONE(NAME, WT, fs_linear<FMT, PER, TTV>)     \
    FS_LINEAR_GROUPED(NAME##_grouped, WT, FMT, fs_linear<FMT, PER, TTV>)

// NAME_q (x, W, S, y, T, N, K, ldx, ldy): NAME with the input quantize-dequantized as it is staged
// (QRT above; no grouped form).
#define FS_LINEAR_Q_ENTRY(NAME, WT, FMT, PER, TTV) FS_LINEAR_ONE(NAME, WT, fs_linear<FMT, PER, TTV, true>)

// The one-token entries with the next row's loads in flight (LINEAR_T1_PREFETCH): NAME (plain),
// NAME_q (quantize-dequantized input) and NAME_grouped; the same bits as the _t1 entries.
#define FS_LINEAR_PF_ENTRY(NAME, WT, FMT, PER)                          \
    FS_LINEAR_ONE(NAME, WT, fs_linear<FMT, PER, 1, false, true>)        \
    FS_LINEAR_ONE(NAME##_q, WT, fs_linear<FMT, PER, 1, true, true>)     \
    FS_LINEAR_GROUPED(NAME##_grouped, WT, FMT, fs_linear<FMT, PER, 1, false, true>)

FS_LINEAR_ENTRY(linear_f32, float, 0, 4, TT)
FS_LINEAR_ENTRY(linear_bf16, u16, 1, 8, TT)
FS_LINEAR_ENTRY(linear_fp8, u8, 2, 16, TT)
FS_LINEAR_ENTRY(linear_fp4, u8, 3, 32, TT)
FS_LINEAR_ENTRY(linear_f32_t1, float, 0, 4, 1)
FS_LINEAR_ENTRY(linear_bf16_t1, u16, 1, 8, 1)
FS_LINEAR_ENTRY(linear_fp8_t1, u8, 2, 16, 1)
FS_LINEAR_ENTRY(linear_fp4_t1, u8, 3, 32, 1)
FS_LINEAR_Q_ENTRY(linear_f32_q, float, 0, 4, TT)
FS_LINEAR_Q_ENTRY(linear_bf16_q, u16, 1, 8, TT)
FS_LINEAR_Q_ENTRY(linear_fp8_q, u8, 2, 16, TT)
FS_LINEAR_Q_ENTRY(linear_fp4_q, u8, 3, 32, TT)
FS_LINEAR_Q_ENTRY(linear_f32_t1_q, float, 0, 4, 1)
FS_LINEAR_Q_ENTRY(linear_bf16_t1_q, u16, 1, 8, 1)
FS_LINEAR_Q_ENTRY(linear_fp8_t1_q, u8, 2, 16, 1)
FS_LINEAR_Q_ENTRY(linear_fp4_t1_q, u8, 3, 32, 1)
FS_LINEAR_PF_ENTRY(linear_f32_t1p, float, 0, 4)
FS_LINEAR_PF_ENTRY(linear_bf16_t1p, u16, 1, 8)
FS_LINEAR_PF_ENTRY(linear_fp8_t1p, u8, 2, 16)
FS_LINEAR_PF_ENTRY(linear_fp4_t1p, u8, 3, 32)

// linear_<fmt>[_t1|_t1p]_multi (x, m, T, K, ldx), fmt f32 or bf16 (switch COMPRESSOR_FUSED_DECODE;
// host glue gpu.rs `Gpu::linear_multi_into`): m.count ≤ FS_MULTI_MAX weights [N_i, K] of one format
// on the same input x (T tokens, rows ldx apart) in one launch — a compressor's wkv and wgate (in a
// CSA layer also the indexer compressor's and weights_proj), spec §4.8 / §4.9 step 1 / §4.10. The
// grid's blocks are the weights' row blocks one after the other (weight i: m.o[i].blocks of them,
// the grid x of its own launch); each runs NAME without _multi's code on its weight (fs_linear's
// MULTI form: its block index within the weight, that weight's block count), so every output is
// that launch's value, stored at y_i[t·ldy_i + n] — a compressor's state rows at the chunk's
// position — with bias_i (a gate's position bias [ratio_i, N_i]; null: none) added as
// add_position_bias_f32 adds it. Launch: grid (Σ blocks_i, ceil(T / TT)), block 256 (T = 1 for the
// _t1 / _t1p forms).
#define FS_MULTI_MAX 6
struct FsMultiOut {
    const void* W;
    float* y;
    const float* bias;
    int N, ldy, ratio, blocks;
};
struct FsMulti {
    FsMultiOut o[FS_MULTI_MAX];
    int count, pos0;
};
#define FS_LINEAR_MULTI(NAME, WT, FMT, PER, TTV, PF)                                                              \
    extern "C" __global__ void NAME(const float* __restrict__ x, const FsMulti m, int T, int K, int ldx) {       \
        int b = blockIdx.x, z = 0;                                                                                \
        _Pragma("unroll") for (int i = 0; i + 1 < FS_MULTI_MAX; i++) {                                           \
            if (i + 1 < m.count && z == i && b >= m.o[i].blocks) {                                                \
                b -= m.o[i].blocks;                                                                               \
                z = i + 1;                                                                                        \
            }                                                                                                     \
        }                                                                                                         \
        const FsMultiOut o = m.o[z];                                                                              \
        fs_linear<FMT, PER, TTV, false, PF, true>(x, o.W, nullptr, o.y, T, o.N, K, ldx, o.ldy,                    \
                                                  FsEpi{b, o.blocks, o.bias, o.ratio, m.pos0});                   \
    }
FS_LINEAR_MULTI(linear_f32_multi, float, 0, 4, TT, false)
FS_LINEAR_MULTI(linear_bf16_multi, u16, 1, 8, TT, false)
FS_LINEAR_MULTI(linear_f32_t1_multi, float, 0, 4, 1, false)
FS_LINEAR_MULTI(linear_bf16_t1_multi, u16, 1, 8, 1, false)
FS_LINEAR_MULTI(linear_f32_t1p_multi, float, 0, 4, 1, true)
FS_LINEAR_MULTI(linear_bf16_t1p_multi, u16, 1, 8, 1, true)

// ---------------------------------------------------------------------------------------------
// linear_fp8_mma_q_ks<KS> (switch LINEAR_GEMV_MMA; host glue gpu.rs `Gpu::linear_gemv_mma`): the
// official numerics' small-batch linear over FP8 weights — `linear_fp8[_t1]_q`'s values — with each
// 128-value block's products on the tensor cores. The T ≤ 8 tokens' inputs are quantized per 128
// values while staged (fs_q8_quant4: act_quant_fp8's e4m3 bytes and power-of-two scale s_a, one
// block per warp) and kept as e4m3 bytes; the weight bytes are the mma.sync m16n8k32 A fragment as
// loaded, with no decode: lane (g, t) loads bytes 32t … 32t + 31 of a block for rows g and g + 8
// (two 16-byte loads each), and MMA m of the block takes their words 2m (columns 4t + i) and
// 2m + 1 (columns 16 + 4t + i) with the same bytes of the inputs as B (column g = token g, tokens
// past T repeating the last), four MMAs summed in the accumulator. So each (row, token) gets
// y += (Σ_{k∈block} w·q)·s_w·s_a per block in block order (s_w the weight block's ue8m0 scale; both
// scales powers of two, as the product of the staged x_dq = q·s_a with w is) — the definition of
// linear_fp8_q, whose per-16-value f32 sums differ in rounding only (the MMA unit's sums: NMSE
// against it and the CPU in gpu-check `--only gemv`). Each 16-row tile's blocks are split over KS
// warps (partial sums added in part order through shared memory) so that narrow weights (wq_a's
// 1,024 rows) still keep every SM's loads in flight; each warp keeps the next LGM_U blocks' loads in
// flight while it multiplies the current ones. K a multiple of 128·KS·LGM_U, T·(K + 16) bytes of
// staged inputs ≤ LGM_XBYTES (the host checks; anything else traps), N any (rows past N clamped on
// load, not stored). Launch: grid (ceil(N / (16·8 / KS))), block 256. sm_89+ (e4m3 mma.sync).
// Learned from the PTX ISA's m16n8k32 fragment layout (as gm_mma_e4m3); the code is ours.
#define LGM_U 2            // blocks per batch of loads
#define LGM_XBYTES 32768   // staged e4m3 inputs (tokens × (K + 16) bytes)
template <int KS>
__device__ __forceinline__ void linear_fp8_mma_q(const float* __restrict__ x, const u8* __restrict__ W, const u8* __restrict__ S,
                                                 float* __restrict__ y, int T, int N, int K, int ldx, int ldy) {
    static_assert(KS >= 1 && 8 % KS == 0, "the block's 8 warps split each 16-row tile's blocks KS ways");
    __shared__ __align__(16) u8 xq[LGM_XBYTES];
    __shared__ float xsa[8 * 64];             // per token and 128-block: s_a (K ≤ 8,192)
    __shared__ __align__(16) float part[KS > 1 ? 8 * 128 : 1];  // per warp and lane: its four sums (the K parts')
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int KB = K >> 7, xl = K + 16;  // blocks per row; staged bytes per token (padded)
    if (T < 1 || T > 8 || (K & 127) != 0 || KB > 64 || T * xl > LGM_XBYTES || KB % (KS * LGM_U) != 0) __trap();
    // Stage: warp w quantizes blocks w, w + 8, … of every token (4 values per lane).
    for (int i = warp; i < T * KB; i += 8) {
        const int j = i / KB, kb = i - j * KB;
        const float4 v4 = *reinterpret_cast<const float4*>(x + (size_t)j * ldx + kb * 128 + 4 * lane);
        const float v[4] = {v4.x, v4.y, v4.z, v4.w};
        float s;
        const u32 q = fs_q8_quant4(v, s);
        *reinterpret_cast<u32*>(xq + j * xl + kb * 128 + 4 * lane) = q;
        if (lane == 0) xsa[j * 64 + kb] = s;
    }
    __syncthreads();
    const int rt = warp / KS, kp = warp % KS;
    const int n0 = (blockIdx.x * (8 / KS) + rt) * 16;
    const int ra = min(n0 + g, N - 1), rb = min(n0 + g + 8, N - 1);
    const uint4* wa = reinterpret_cast<const uint4*>(W + (size_t)ra * K) + 2 * t;  // block kb: wa[8 kb], wa[8 kb + 1]
    const uint4* wb = reinterpret_cast<const uint4*>(W + (size_t)rb * K) + 2 * t;
    const u8* srow = S + (size_t)(min(n0, N - 1) >> 7) * KB;  // the tile's 16 rows share one 128-row block
    const int tok = min(g, T - 1);  // this lane's B column (token g; past T the last token again)
    const u8* xb = xq + tok * xl + 32 * t;
    const int tc0 = min(2 * t, T - 1), tc1 = min(2 * t + 1, T - 1);  // the tokens of this lane's accumulator columns
    struct Batch {
        uint4 a[LGM_U][2], b[LGM_U][2];
        u8 s[LGM_U];
    };
    auto load = [&](Batch& bt, int kb0) {
#pragma unroll
        for (int u = 0; u < LGM_U; u++) {
            const int kb = kb0 + u;
            bt.a[u][0] = __ldg(wa + 8 * kb);
            bt.a[u][1] = __ldg(wa + 8 * kb + 1);
            bt.b[u][0] = __ldg(wb + 8 * kb);
            bt.b[u][1] = __ldg(wb + 8 * kb + 1);
            bt.s[u] = __ldg(srow + kb);
        }
    };
    float acc[4] = {0.f, 0.f, 0.f, 0.f};  // rows g (tokens 2t, 2t + 1), g + 8 (the same)
    const int kbb = kp * (KB / KS), kbe = kbb + KB / KS;
    Batch cur, nxt;
    load(cur, kbb);
    for (int kb0 = kbb; kb0 < kbe; kb0 += LGM_U) {
        if (kb0 + LGM_U < kbe) load(nxt, kb0 + LGM_U);
#pragma unroll
        for (int u = 0; u < LGM_U; u++) {
            const int kb = kb0 + u;
            const u32 aw[8] = {cur.a[u][0].x, cur.a[u][0].y, cur.a[u][0].z, cur.a[u][0].w, cur.a[u][1].x, cur.a[u][1].y, cur.a[u][1].z, cur.a[u][1].w};
            const u32 bw[8] = {cur.b[u][0].x, cur.b[u][0].y, cur.b[u][0].z, cur.b[u][0].w, cur.b[u][1].x, cur.b[u][1].y, cur.b[u][1].z, cur.b[u][1].w};
            float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const uint2 xv = *reinterpret_cast<const uint2*>(xb + kb * 128 + 8 * m);
                const u32 a[4] = {aw[2 * m], bw[2 * m], aw[2 * m + 1], bw[2 * m + 1]};
                gm_mma_e4m3(d, a, xv.x, xv.y);
            }
            const float sw = fs_e8m0(cur.s[u]);
            const float s0 = sw * xsa[tc0 * 64 + kb], s1 = sw * xsa[tc1 * 64 + kb];
            acc[0] = fmaf(d[0], s0, acc[0]);
            acc[1] = fmaf(d[1], s1, acc[1]);
            acc[2] = fmaf(d[2], s0, acc[2]);
            acc[3] = fmaf(d[3], s1, acc[3]);
        }
        cur = nxt;
    }
    if (KS > 1) {
        // Each lane's four sums to part[warp], then the tile's first warp adds the other parts' in
        // part order.
        *reinterpret_cast<float4*>(part + warp * 128 + lane * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        __syncthreads();
        if (kp != 0) return;
#pragma unroll
        for (int i = 1; i < KS; i++) {
            const float4 o = *reinterpret_cast<const float4*>(part + (warp + i) * 128 + lane * 4);
            acc[0] += o.x;
            acc[1] += o.y;
            acc[2] += o.z;
            acc[3] += o.w;
        }
    }
    const int rows[2] = {n0 + g, n0 + g + 8};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rows[r] >= N) continue;
        if (2 * t < T) y[(size_t)(2 * t) * ldy + rows[r]] = acc[2 * r];
        if (2 * t + 1 < T) y[(size_t)(2 * t + 1) * ldy + rows[r]] = acc[2 * r + 1];
    }
}

#define LGM_ENTRY(KS)                                                                                                    \
    extern "C" __global__ void __launch_bounds__(256) linear_fp8_mma_q_ks##KS(                                           \
        const float* __restrict__ x, const u8* __restrict__ W, const u8* __restrict__ S, float* __restrict__ y, int T, int N, \
        int K, int ldx, int ldy) {                                                                                       \
        linear_fp8_mma_q<KS>(x, W, S, y, T, N, K, ldx, ldy);                                                            \
    }
LGM_ENTRY(1)
LGM_ENTRY(2)
LGM_ENTRY(4)
LGM_ENTRY(8)
