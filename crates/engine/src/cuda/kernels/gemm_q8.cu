// gemm_q8.cu — linear layers with FP8 activations on FP8 tensor cores: DeepSeek's official numerics
// (spec §6 "Official activation quantisation", §10.1; OFF-K `act_quant` + `fp8_gemm`/`fp4_gemm`).
// The switch TC_LINEAR=fp8 (crates/engine/src/cuda/gpu.rs `TcMode::Fp8`) routes the §10.1 GEMMs
// (wq_a, wq_b, wkv, wo_b, indexer wq_b, shared and routed w1/w3/w2) here; the CPU reference of
// this path is `forward::Numerics { act_quant_fp8: true }`.
//
//   act_quant_fp8(x, q, sa, T, K, Tp, mode, rows, live, up, limit): per row t < T and 128-column block b (the last
//     block shorter when K is not a multiple of 128): amax = max(max|x|, 1e-4),
//     s = 2^ceil(log2(amax/448)) (the official bit trick on the f32 quotient), q = e4m3(x/s) (round
//     to nearest even, saturating at ±448). q [Tp, Kp] bytes (Kp = K rounded up to 128), sa [Tp, Kp/128]
//     f32 = s; rows ≥ T and columns ≥ K get q = 0, sa = 1. mode 1 (roundtrip): x [T, K] ← e4m3(x/s)·s
//     in place instead (q, sa untouched; T rows only); mode 2: q in gq_tiled's layout (Tp a multiple
//     of 64; the input of moe_wt). One warp per (row, block), any grid, block 256. Grouped MoE rows
//     (the down projection's input h; q / sa sized for the grouping's capacity r_cap = Tp): rows
//     (device, may be null) = the grouped row count R, rows ≥ R are left unwritten (no tile reads
//     them; r_cap counts bm − 1 padding rows per expert, R what the experts got: at 8,192 tokens
//     and 256-row tiles about 114,000 against 66,000); live (device, may be null; mode 2 only) =
//     the grouping's row_dst, a 64-row sub-tile whose first row is padding (< 0) is left unwritten
//     (moe_wt neither copies nor multiplies it). up (may be null): the input is the SwiGLU of the
//     gate x and up u, h = fs_swiglu(x, u, limit) (swiglu_f32's values, so the same bytes and scales
//     as swiglu_f32 then act_quant_fp8 on h; mode 0 only: the shared expert's down projection input
//     without writing h).
//
//   gemm_q8_<fmt>(q, sa, W, S, y, T, N, K): y[t, n] = Σ_blocks sa[t, b]·sw[n, b]·Σ_{k in b} q[t, k]·w[n, k]
//     with mma.sync m16n8k32 e4m3 × e4m3 → f32 for the 32-wide partials, promoted into f32
//     accumulators once per 128-column block (DeepSeek-V3's "promotion to CUDA cores", here per block
//     because the activation scale changes there). K % 128 == 0.
//       fp8: W e4m3 [N, K] + ue8m0 [ceil(N/128), K/128]; the tile is copied to shared memory as is.
//       fp4: W packed e2m1 [N, K/2] + ue8m0 [N, K/32]; converted in shared memory to e4m3 relative to
//            the largest of the row's four scales in the 128-block: nibble·2^(s_g − s_max) is an exact
//            e4m3 value when s_g − s_max ≥ −8 (the host checks every weight before using this kernel,
//            `GpuMatrix::Fp4::fold`), and sw = 2^(s_max − 127). Conversion: a prmt of the nibble
//            magnitudes into a per-(s_g − s_max) table of eight e4m3 bytes, plus the sign bits.
//   Block tile 128 × 128, 8 warps (2 × 4, warp tile 64 × 32); K step 64 (two MMA k-steps), cp.async
//   ring of 4 stages, one barrier per step. Deterministic (fixed order, no atomics).
//
//   moe_q8_<fmt>_<bm>_<epi>(q, sa, wtab, stab, w3tab, s3tab, items, n_items, y, hf, ldh, dst, gamma,
//                           N, K, limit): the grouped-MoE version (gemm.cu `moe_gemm` work queue;
//     q [R, Kp] / sa [R, Kp/128] grouped rows). epi plain: y [R, N]; swiglu: gate/up interleaved as
//     in gemm.cu, h = silu(min(g, L))·clamp(u, ±L)·γ written as f32 into hf [R, ldh] (γ =
//     gamma[dst[row]], 0 for padding rows: the official kernel quantizes γ·h, spec §10.1 / OFF-M),
//     then act_quant_fp8 prepares the down projection's input; scatter: y[dst[row], col].
//     bm 128: 8 warps (2 × 4); bm 64: 4 warps (2 × 2), warp tile 32 × 64.
//   moe_w8_…: the same on Hopper's wgmma (switch FP8_WGMMA, below); moe_ws_<fmt>_128_<epi>: its
//     128-row tiles warp-specialised, the same bits (switch MOE_FP8_WS, below); moe_wt_fp4_256_<epi>:
//     FP4 experts in 256-row tiles with tiled activations, the same bits (switch MOE_FP8_WT, below).
//
//   lt_scales(sa, T, KB, sat, sw, NB, swf): the scale layouts cuBLASLt's block-scaled FP8 GEMM reads
//     (switch FP8_CUBLASLT, ops_q8.rs / cublaslt.rs): activation scales sa [≥ T, KB] (act_quant_fp8)
//     → sat [KB, T] f32, token fastest (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F); weight scales
//     sw [NB, KB] ue8m0 → swf [NB, KBp] f32 (BLK128x128_32F), rows padded to KBp = KB rounded up to 4
//     (16-byte rows; padding 1.0). Grid-stride, any grid, block 256.
//
// Not reproduced bit for bit: non-finite activations. The CPU leaves a block holding NaN or ±inf
// unquantized; here a NaN stays NaN (e4m3 0x7F) and a block holding ±inf gets s = 2^127, so its
// finite values become 0 and the inf NaN. Either way the GEMM outputs of that row are not finite.

#define GQ_LDS 80   // bytes per padded shared-memory row: 64 e4m3 + 16 pad (ldmatrix rows hit distinct banks)
#define GQ_BK 64    // K elements per pipeline step
#define GQ_STAGES 4
#define GQ_GROUP 8  // token tiles per raster group

// gq_e4m3x2, gq_pow2 and the official scale rule (fs_q8_quant4): common.cuh.

// Byte offset of element (row r, column k) of the tiled activation layout with KT 128-column
// blocks per row: block (r / 64, k / 128) at ((r / 64)·KT + k / 128)·8192, inside it gw_swz's
// 128-byte-swizzled rows.
__device__ __forceinline__ size_t gq_tiled(long long r, int k, int KT) {
    return ((size_t)(r >> 6) * KT + (k >> 7)) * 8192 + gw_swz((int)(r & 63), (k & 127) >> 4) + (k & 15);
}

// act_quant_fp8's task indices and moe_gather_q8's group indices in 64 bits (1: the form before the
// forty-second session, timing only; the same bytes). 0, the default: 32-bit indices, one 32-bit
// division per task or group instead of a 64-bit one (act_quant_fp8 1-3 % faster at a 32,768-token
// chunk's shapes; bench/act_quant_h200.log).
#ifndef AQ_WIDE_INDEX
#define AQ_WIDE_INDEX 0
#endif

extern "C" __global__ void act_quant_fp8(float* __restrict__ x, u8* __restrict__ q, float* __restrict__ sa, int T, int K, int Tp,
                                         int mode, const int* __restrict__ rows, const int* __restrict__ live,
                                         const float* __restrict__ up, float limit) {
    // Task indices in 32 bits unless AQ_WIDE_INDEX: the host bounds Tp·Kp below 2^31, so the task
    // count Tp·KB below 2^24.
#if AQ_WIDE_INDEX
    typedef long long Ix;
#else
    typedef unsigned Ix;
#endif
    const int Kp = (K + 127) & ~127, KB = Kp >> 7;
    const bool roundtrip = mode == 1;
    const int lane = threadIdx.x & 31;
    const Ix warps = (Ix)gridDim.x * (blockDim.x >> 5);
    const int tq = roundtrip ? T : rows ? min(Tp, max(__ldg(rows), 0)) : Tp;
    const Ix total = (Ix)tq * (Ix)KB;
    for (Ix w = (Ix)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < total; w += warps) {
        const Ix tw = w / (Ix)KB;
        const int t = (int)tw, b = (int)(w - tw * (Ix)KB);
        if (mode == 2 && live && __ldg(live + (t & ~63)) < 0) continue;  // warp-uniform: the whole warp skips
        const int c0 = b * 128 + lane * 4;
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (t < T) {
            if (c0 + 3 < K && (K & 3) == 0) {
                const float4 f = *reinterpret_cast<const float4*>(x + (size_t)t * K + c0);
                v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
                if (up) {
                    const float4 g = *reinterpret_cast<const float4*>(up + (size_t)t * K + c0);
                    v[0] = fs_swiglu(v[0], g.x, limit); v[1] = fs_swiglu(v[1], g.y, limit);
                    v[2] = fs_swiglu(v[2], g.z, limit); v[3] = fs_swiglu(v[3], g.w, limit);
                }
            } else {
                for (int j = 0; j < 4; j++)
                    if (c0 + j < K) v[j] = up ? fs_swiglu(x[(size_t)t * K + c0 + j], up[(size_t)t * K + c0 + j], limit) : x[(size_t)t * K + c0 + j];
            }
        }
        float s;
        const u32 pk = fs_q8_quant4(v, s);
        if (roundtrip) {
            if (t < T) {
                for (int j = 0; j < 4; j++)
                    if (c0 + j < K) x[(size_t)t * K + c0 + j] = fs_e4m3((u8)(pk >> (8 * j))) * s;
            }
        } else {
            *reinterpret_cast<u32*>(q + (mode == 2 ? gq_tiled(t, c0, KB) : (size_t)t * Kp + c0)) = (t < T) ? pk : 0u;
            if (lane == 0) sa[(size_t)t * KB + b] = t < T ? s : 1.f;
        }
    }
}

template <int FMT, int BM, int BN>
struct GqLayout {
    static constexpr int A_STAGE = BM * GQ_LDS;
    static constexpr int RP = FMT == 2 ? GQ_LDS : 32;  // fp8: rows copied as is; fp4: 32 packed bytes
    static constexpr int RAW_STAGE = BN * RP;
    static constexpr int BTILE = FMT == 2 ? 0 : BN * GQ_LDS;
    static constexpr int LUT = FMT == 3 ? 9 * 8 : 0;
    static constexpr int TOTAL = GQ_STAGES * (A_STAGE + RAW_STAGE) + 2 * BTILE + LUT;
};

struct GqProb {
    const u8* q;      // activations [rows, Kp] e4m3
    const float* sa;  // their scales [rows, Kp/128]
    const u8* W;      // weight [N, K] (EPI 1: gate W1 [N/2, K])
    const u8* S;
    const u8* W3;     // EPI 1: up W3 [N/2, K]
    const u8* S3;
    int m0, n0, T, N, K;
};

struct GqEpi {
    float* y;
    float* hf;
    int ldh;
    float limit;
    const int* dst;
    const float* gamma;
};

// e4m3 magnitudes of the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} times 2^d, d = −8 … 0 (all exact).
__device__ __forceinline__ void gq_fill_lut(u32* lut, int tid, int nt) {
    const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    for (int i = tid; i < 18; i += nt) {
        const int d = i / 2 - 8, h = i & 1;
        const float f = gq_pow2(d);
        const u32 a = gq_e4m3x2(mag[4 * h] * f, mag[4 * h + 1] * f), b = gq_e4m3x2(mag[4 * h + 2] * f, mag[4 * h + 3] * f);
        lut[i] = a | (b << 16);
    }
}

// Eight e2m1 nibbles w (element i in nibble i) → eight e4m3 bytes (lo: elements 0–3, hi: 4–7) via
// the magnitude table (t0, t1; every byte < 0x80): one prmt per four magnitudes (prmt reads only the
// selector's low 16 bits), one per four signs and one lop3 to merge them. The signs: element i's
// sign is bit 4i + 3 of w, i.e. bit 7 of byte i/2 of w << 4 (i even) or of w (i odd), so a byte
// permutation of (w << 4, w) puts each under its output byte's bit 7 (0x5140: elements 0–3,
// 0x7362: 4–7). The same bytes as two prmts through (0, 0x80808080) on the shifted sign bits (the
// form before 2026-12-01), in fewer instructions.
__device__ __forceinline__ void gq_fp4x8(u32 w, u32 t0, u32 t1, u32& lo, u32& hi) {
    const u32 m = w & 0x77777777u, a = w << 4;
    lo = (__byte_perm(a, w, 0x5140u) & 0x80808080u) | __byte_perm(t0, t1, m);
    hi = (__byte_perm(a, w, 0x7362u) & 0x80808080u) | __byte_perm(t0, t1, m >> 16);
}

// A thread's epilogue row: `row` of the tile, the output row `orow` it goes to (EPI 0: row; EPI 2:
// dst[row], < 0 for a padding row, which is not stored) and its routing weight `gam` (EPI 1:
// gamma[dst[row]], 0 for a padding row).
struct GqRow {
    int row, orow;
    float gam;
};
template <int EPI>
__device__ __forceinline__ GqRow gq_row(const GqEpi& E, int row) {
    GqRow r = {row, row, 0.f};
    if (EPI != 0) r.orow = E.dst[row];
    if (EPI == 1) r.gam = r.orow < 0 ? 0.f : E.gamma[r.orow];
    return r;
}

// Epilogue 1 of both kernel families: hidden units col, col + 1 of grouped row R.row from their gate
// (g0, g1) and up (u0, u1) sums: h = silu(min(g, L))·clamp(u, ±L)·γ (γ = R.gam), f32 into hf. N is
// the fused width (2·inter): columns past it are not written.
__device__ __forceinline__ void gq_swiglu_store(const GqEpi& E, int N, const GqRow& R, int col, float g0, float g1, float u0, float u1) {
    if (2 * col >= N) return;
    const float hv[2] = {fs_swiglu(g0, u0, E.limit) * R.gam, fs_swiglu(g1, u1, E.limit) * R.gam};
    *reinterpret_cast<float2*>(E.hf + (size_t)R.row * E.ldh + col) = make_float2(hv[0], hv[1]);
}

// Epilogues 0 (y[row, col..col+1], rows < T) and 2 (y[dst[row], …], dst ≥ 0) of both families.
template <int EPI>
__device__ __forceinline__ void gq_store2(const GqEpi& E, int T, int N, const GqRow& R, int col, float v0, float v1) {
    if (EPI == 0 ? R.row >= T : R.orow < 0) return;
    float* d = E.y + (size_t)R.orow * N + col;
    if ((N & 1) == 0 && col + 1 < N) {
        *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
    } else {
        if (col < N) d[0] = v0;
        if (col + 1 < N) d[1] = v1;
    }
}

// Weight rows and scale rows of output columns: common.cuh fused_wrow / fused_srow.

// The conversion table row of 32-group `grp` of a row's 128-block (w: its four ue8m0 scale bytes):
// e4m3 magnitudes times 2^(s_grp − s_max); *smax gets the largest byte s_max.
__device__ __forceinline__ uint2 gq_fp4_table(u32 w, int grp, const u32* lut, u32* smax) {
    const u32 b0 = w & 0xffu, b1 = (w >> 8) & 0xffu, b2 = (w >> 16) & 0xffu, b3 = w >> 24;
    const u32 m = max(max(b0, b1), max(b2, b3));
    const u32 g = (w >> (8 * grp)) & 0xffu;
    const int d = max((int)g - (int)m, -8) + 8;
    *smax = m;
    return *reinterpret_cast<const uint2*>(lut + 2 * d);
}

// One fp4 conversion unit of both families: 8 packed bytes v (16 e2m1 of 32-group `grp` of a row)
// → 16 e4m3 bytes relative to the largest of the row's four group scales (w: the four ue8m0 scale
// bytes of its 128-block); *smax gets that largest byte.
__device__ __forceinline__ uint4 gq_fp4_unit(uint2 v, u32 w, int grp, const u32* lut, u32* smax) {
    const uint2 t = gq_fp4_table(w, grp, lut, smax);
    uint4 o;
    gq_fp4x8(v.x, t.x, t.y, o.x, o.y);
    gq_fp4x8(v.y, t.x, t.y, o.z, o.w);
    return o;
}

// The warp-specialised kernels' conversion unit (moe_ws, moe_wt): 16 packed bytes v (32 e2m1 of
// 32-group g of weight row r) through the magnitude table row t into the swizzled e4m3 tile bc
// (16-byte chunks 2g and 2g + 1 of row r).
__device__ __forceinline__ void gq_fp4x32(uint4 v, uint2 t, uint4& o0, uint4& o1) {
    gq_fp4x8(v.x, t.x, t.y, o0.x, o0.y);
    gq_fp4x8(v.y, t.x, t.y, o0.z, o0.w);
    gq_fp4x8(v.z, t.x, t.y, o1.x, o1.y);
    gq_fp4x8(v.w, t.x, t.y, o1.z, o1.w);
}
__device__ __forceinline__ void gq_fp4x32_store(uint4 v, uint2 t, u8* bc, int r, int g) {
    uint4 o0, o1;
    gq_fp4x32(v, t, o0, o1);
    *reinterpret_cast<uint4*>(bc + gw_swz(r, 2 * g)) = o0;
    *reinterpret_cast<uint4*>(bc + gw_swz(r, 2 * g + 1)) = o1;
}

// The fp4 conversion pipeline of both families (DIRECT = fp8 weights, nothing to convert) starts
// with common.cuh's conv_pipeline_start.

// Step kt of that pipeline, after its copies were issued: convert step kt + 1 with sreg and load
// the scale words of step kt + 2 into sreg.
template <int UNITS, bool DIRECT, class ScaleWord, class Convert>
__device__ __forceinline__ void gq_pipeline_step(int kt, int KT, ScaleWord& scale_word, Convert& convert, u32 (&sreg)[UNITS]) {
    if (!DIRECT) {
        u32 snext[UNITS];
#pragma unroll
        for (int u = 0; u < UNITS; u++) snext[u] = scale_word(kt + 2, u);
        if (kt + 1 < KT) convert(kt + 1, sreg);
#pragma unroll
        for (int u = 0; u < UNITS; u++) sreg[u] = snext[u];
    }
}

template <int FMT, int BM, int BN, int WM, int WN, int EPI>
__device__ __forceinline__ void gq_gemm(const GqProb& P, const GqEpi& E) {
    typedef GqLayout<FMT, BM, BN> L;
    constexpr int NT = WM * WN * 32;
    constexpr int ST = GQ_STAGES;
    constexpr bool DIRECT = FMT == 2;
    constexpr int RB = FMT == 2 ? 64 : 32;       // raw weight bytes per row per K step
    constexpr int CPR = RB / 16;                 // 16-byte copies per row
    constexpr int UNITS = DIRECT ? 1 : BN * 4 / NT;  // fp4: 8-byte conversion units per thread
    constexpr int WTM = BM / WM, WTN = BN / WN, MT = WTM / 16, NT8 = WTN / 8;
    static_assert(DIRECT || (BN * 4) % NT == 0, "conversion units must divide among the threads");
    static_assert((BM * 4) % NT == 0, "activation copies must divide among the threads");
    static_assert(NT8 % 2 == 0, "B fragments are loaded in pairs");

    extern __shared__ __align__(16) u8 gq_sh[];
    {
        u32 dsz;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsz));
        if (dsz < (u32)L::TOTAL) __trap();
    }
    u8* As = gq_sh;
    u8* Rs = As + ST * L::A_STAGE;
    u8* Bt = Rs + ST * L::RAW_STAGE;
    u32* lut = reinterpret_cast<u32*>(Bt + 2 * L::BTILE);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int m0 = P.m0, n0 = P.n0, N = P.N, K = P.K;
    const int KT = K / GQ_BK, KB = K >> 7;
    const size_t wrow = FMT == 2 ? (size_t)K : (size_t)K / 2;
    const int sk = KB;           // fp8 scale columns
    const int sg = K >> 5;       // fp4 scale columns
    if (FMT == 3) gq_fill_lut(lut, tid, NT);
    const u32 as_base = gm_smem(As), rs_base = gm_smem(Rs), bt_base = gm_smem(Bt);

    auto wrow_of = [&](int n) { return fused_wrow<EPI>(P, n, wrow); };
    auto srow_of = [&](int n, const u8*& s) { return fused_srow<EPI>(P, n, s); };

    auto issue = [&](int kt) {
        if (kt < KT) {
            const int slot = kt % ST;
            const u32 a_dst = as_base + slot * L::A_STAGE;
#pragma unroll
            for (int i = 0; i < BM * 4 / NT; i++) {
                int qi = tid + i * NT, r = qi >> 2, c = qi & 3;
                gm_cp16(a_dst + r * GQ_LDS + c * 16, P.q + (size_t)(m0 + r) * K + kt * GQ_BK + c * 16, true);
            }
            const u32 r_dst = rs_base + slot * L::RAW_STAGE;
#pragma unroll
            for (int i = 0; i < (BN * CPR + NT - 1) / NT; i++) {
                int qi = tid + i * NT;
                if ((BN * CPR) % NT == 0 || qi < BN * CPR) {
                    int r = qi / CPR, c = qi % CPR;
                    bool ok = n0 + r < N;
                    const u8* src = ok ? wrow_of(n0 + r) + (size_t)kt * RB + c * 16 : P.W;
                    gm_cp16(r_dst + r * L::RP + c * 16, src, ok);
                }
            }
        }
        gm_commit();
    };

    // fp4: the four scale bytes of 128-block kt/2 for conversion unit u (row r = q >> 2).
    auto scale_word = [&](int kt, int u) -> u32 {
        int qi = tid + u * NT, r = qi >> 2;
        int n = n0 + r;
        if (FMT != 3 || kt >= KT || n >= N) return 0x7f7f7f7fu;
        const u8* s;
        n = srow_of(n, s);
        return __ldg(reinterpret_cast<const u32*>(s + (size_t)n * sg + (kt >> 1) * 4));
    };

    // fp4 raw bytes of K step kt → e4m3 tile kt & 1.
    auto convert = [&](int kt, const u32* sw) {
        const u8* raw = Rs + (kt % ST) * L::RAW_STAGE;
        u8* dst = Bt + (kt & 1) * L::BTILE;
#pragma unroll
        for (int u = 0; u < UNITS; u++) {
            int qi = tid + u * NT, r = qi >> 2, c = qi & 3;
            const uint2 v = *reinterpret_cast<const uint2*>(raw + r * 32 + c * 8);
            u32 smax;
            // this unit's 32-group within the 128-block: (kt & 1)·2 + (c >> 1)
            *reinterpret_cast<uint4*>(dst + r * GQ_LDS + c * 16) = gq_fp4_unit(v, sw[u], ((kt & 1) << 1) | (c >> 1), lut, &smax);
        }
    };

    float acc[MT][NT8][4], tmp[MT][NT8][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = tmp[i][j][e] = 0.f;

    const int g4 = lane >> 2, c2 = (lane & 3) * 2;
    u32 sreg[UNITS];
    conv_pipeline_start<ST, UNITS, DIRECT>(issue, scale_word, convert, sreg);

    float ra[MT][2], wc[NT8][2];
    for (int kt = 0; kt < KT; kt++) {
        if (DIRECT) gm_wait<ST - 2>();
        else gm_wait<ST - 3>();
        __syncthreads();
        issue(kt + ST - 1);
        gq_pipeline_step<UNITS, DIRECT>(kt, KT, scale_word, convert, sreg);
        if ((kt & 1) == 0) {
            // Promotion scales of this 128-block: activation rows, weight columns.
            const int b = kt >> 1;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) ra[mt][h] = __ldg(P.sa + (size_t)(m0 + wm * WTM + mt * 16 + g4 + 8 * h) * KB + b);
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int n = min(n0 + wn * WTN + nt * 8 + c2 + e, N - 1);
                    const u8* s;
                    n = srow_of(n, s);
                    u32 byte;
                    if (FMT == 2) {
                        byte = __ldg(s + (size_t)(n >> 7) * sk + b);
                    } else {
                        const u32 w = __ldg(reinterpret_cast<const u32*>(s + (size_t)n * sg + b * 4));
                        byte = max(max(w & 0xffu, (w >> 8) & 0xffu), max((w >> 16) & 0xffu, w >> 24));
                    }
                    wc[nt][e] = fs_e8m0((u8)byte);
                }
        }
        const u32 a_base = as_base + (kt % ST) * L::A_STAGE;
        const u32 b_base = DIRECT ? rs_base + (kt % ST) * L::RAW_STAGE : bt_base + (kt & 1) * L::BTILE;
#pragma unroll
        for (int kk = 0; kk < GQ_BK; kk += 32) {
            u32 af[MT][4], bfr[NT8][2];
#pragma unroll
            for (int np = 0; np < NT8 / 2; np++) {
                int row = wn * WTN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                gm_ldsm4(b_base + row * GQ_LDS + kk + ((lane >> 3) & 1) * 16, bfr[2 * np][0], bfr[2 * np][1], bfr[2 * np + 1][0], bfr[2 * np + 1][1]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int row = wm * WTM + mt * 16 + (lane & 15);
                gm_ldsm4(a_base + row * GQ_LDS + kk + (lane >> 4) * 16, af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT8; nt++) gm_mma_e4m3(tmp[mt][nt], af[mt], bfr[nt][0], bfr[nt][1]);
        }
        if (kt & 1) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        acc[mt][nt][e] = fmaf(tmp[mt][nt][e], ra[mt][e >> 1] * wc[nt][e & 1], acc[mt][nt][e]);
                        tmp[mt][nt][e] = 0.f;
                    }
        }
    }
    gm_wait<0>();

    if constexpr (EPI == 1) {
        const int hb0 = (n0 + wn * WTN) >> 1;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NT8 / 2; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    gq_swiglu_store(E, N, gq_row<EPI>(E, m0 + wm * WTM + mt * 16 + g4 + 8 * h), hb0 + 8 * j + c2, acc[mt][2 * j][2 * h],
                                    acc[mt][2 * j][2 * h + 1], acc[mt][2 * j + 1][2 * h], acc[mt][2 * j + 1][2 * h + 1]);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT8; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    gq_store2<EPI>(E, P.T, N, gq_row<EPI>(E, m0 + wm * WTM + mt * 16 + g4 + 8 * h), n0 + wn * WTN + nt * 8 + c2, acc[mt][nt][2 * h],
                                   acc[mt][nt][2 * h + 1]);
    }
}

// ---------------------------------------------------------------------------------------------
// The same GEMMs on Hopper's warpgroup MMA (switch FP8_WGMMA, on by default; sm_90a only):
//   gemm_w8_<fmt>(q, sa, W, S, y, T, N, K)            — as gemm_q8_<fmt>
//   moe_w8_<fmt>_<bm>_<epi>(…)                         — as moe_q8_<fmt>_<bm>_<epi>
// Block: WG warpgroups (BM = 64·WG token rows) × 128 output columns; one K step = 128 = one
// promotion block. Shared memory per stage: A [BM][128] e4m3 and (fp8) B [128][128] e4m3 in the
// 128-byte-swizzled K-major layout that wgmma reads through matrix descriptors (16-byte chunk c of
// row r stored at chunk c ^ (r & 7); 8-row atoms of 1 KB on 1 KB boundaries); fp4: the packed
// bytes B [128][64] per stage, converted one step ahead into one of two swizzled e4m3 tiles plus the
// per-row weight scale 2^(s_max − 127) (the same exact conversion as gq_gemm).
// Per step and warpgroup: 4 × wgmma m64n128k32 into a fresh partial (scale-d 0 on the first), then
// acc += partial · s_a · s_w in f32 — DeepSeek's per-128 promotion. wgmma sums its 32 products with
// its own internal alignment (not IEEE f32), so results differ from gemm_q8 in the last bits.
// cp.async ring of GwLayout::STAGES stages; each writer fences the generic→async proxy before the barrier
// that precedes the MMAs. Learned from the PTX ISA (wgmma, matrix descriptors, swizzling modes) and
// DeepSeek's DeepGEMM design; the code is ours. Fences, descriptors and the swizzle: common.cuh.

__device__ __forceinline__ void gw_mma(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d) {
    GW_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

// One K step (128) of a warpgroup's 64 × 128 tile: four wgmma m64n128k32 into a fresh partial d
// (scale-d 0 on the first), committed as one group (gw_gemm, moe_ws, moe_wt).
__device__ __forceinline__ void gw_issue_k128(float (&d)[64], unsigned long long da, unsigned long long db) {
    gw_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) gw_mma(d, da + 2 * kk, db + 2 * kk, kk);
    gw_commit();
}

// gw_mma / gw_issue_k128 with each descriptor given by its low word (gw_desc_lo: start address
// >> 4 and the leading offset; the high word — stride 1024 B, 128-byte swizzle — is gw_desc's
// constant 0x40000040, written into the instruction): with warp-uniform addresses the compiler
// builds the descriptors in uniform registers, a few instructions per MMA instead of ~12
// (moe_ws, moe_wt; the same descriptors, so the same products).
__device__ __forceinline__ void gw_mma_lo(float (&d)[64], u32 alo, u32 blo, int scale_d) {
    GW_ASM(
        "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %66, 0;\nmov.b64 da, {%64, 0x40000040};\nmov.b64 db, {%65, 0x40000040};\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, da, db, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(alo), "r"(blo), "r"(scale_d));
}
__device__ __forceinline__ void gw_issue_k128_lo(float (&d)[64], u32 alo, u32 blo) {
    gw_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) gw_mma_lo(d, alo + 2 * kk, blo + 2 * kk, kk);
    gw_commit();
}

// Waits for the warpgroup's wgmma groups and makes the partial d readable.
__device__ __forceinline__ void gw_wait_partial(float (&d)[64]) {
    gw_wait0();
    gw_fence_regs(d);
}

// Shared memory of a block: STAGES copy stages (activations BM × 128 e4m3, weights 128 rows × 128
// e4m3 or 64 packed fp4 bytes), for fp4 two converted e4m3 tiles, their row scales and the table.
// Five stages for 128-row blocks (one per SM); four for 64-row blocks, so that two fit an SM.
template <int FMT, int WG>
struct GwLayout {
    static constexpr int BM = 64 * WG;
    static constexpr int STAGES = WG == 2 ? 5 : 4;
    static constexpr int A_STAGE = BM * 128;
    static constexpr int B_STAGE = FMT == 2 ? 128 * 128 : 128 * 64;
    static constexpr int BCONV = FMT == 2 ? 0 : 128 * 128;
    static constexpr int WSC = FMT == 2 ? 0 : 2 * 128 * 4;
    static constexpr int LUT = FMT == 3 ? 9 * 8 : 0;
    static constexpr int TOTAL = 1024 + STAGES * (A_STAGE + B_STAGE) + 2 * BCONV + WSC + LUT;
};

// acc += one K step's partial tmp · s_a · s_w in f32 — the per-128 promotion of gw_gemm and
// moe_ws (the thread's rows row_a, row_a + 8: sa0, sa1). DIRECT (fp8 weights): the block scales swg
// (the tile's gate or only rows) and swu (EPI 1's up rows, odd 8-column groups); fp4: the step's
// per-column scales wsc[0 .. 127].
template <bool DIRECT, int EPI>
__device__ __forceinline__ void gw_promote(float (&acc)[64], const float (&tmp)[64], float sa0, float sa1, float swg, float swu, const float* wsc,
                                           int c2) {
    if (DIRECT) {
        const float f[4] = {sa0 * swg, sa0 * swu, sa1 * swg, sa1 * swu};
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[4 * j + e] = fmaf(tmp[4 * j + e], f[(e >> 1) * 2 + (EPI == 1 && (j & 1))], acc[4 * j + e]);
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const float2 w = *reinterpret_cast<const float2*>(wsc + j * 8 + c2);
            acc[4 * j + 0] = fmaf(tmp[4 * j + 0], sa0 * w.x, acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(tmp[4 * j + 1], sa0 * w.y, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(tmp[4 * j + 2], sa1 * w.x, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(tmp[4 * j + 3], sa1 * w.y, acc[4 * j + 3]);
        }
    }
}

// fp8 weights: the rows of 128-block scales (one byte per K step) of a tile's gate (or only)
// columns, sw_g, and for EPI 1 of its up columns, sw_u (gw_gemm, moe_ws).
template <int EPI>
__device__ __forceinline__ void gw_fp8_scale_rows(const GqProb& P, const u8*& sw_g, const u8*& sw_u) {
    const int KT = P.K >> 7;
    const u8* s;
    int n = fused_srow<EPI>(P, min(P.n0, P.N - 1), s);
    sw_g = s + (size_t)(n >> 7) * KT;
    if (EPI == 1) {
        n = fused_srow<EPI>(P, min(P.n0 + 8, P.N - 1), s);
        sw_u = s + (size_t)(n >> 7) * KT;
    }
}

// A warpgroup tile's epilogue (gw_gemm, moe_ws): the thread's accumulators (rows row_a, row_a + 8;
// 16 column pairs from n0 + c2) through epilogue EPI (rows ≥ T are not stored by EPI 0).
template <int EPI>
__device__ __forceinline__ void gw_store(const GqEpi& E, int T, int N, int row_a, int n0, int c2, const float (&acc)[64]) {
    const GqRow R[2] = {gq_row<EPI>(E, row_a), gq_row<EPI>(E, row_a + 8)};
    if constexpr (EPI == 1) {
#pragma unroll
        for (int jj = 0; jj < 8; jj++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                gq_swiglu_store(E, N, R[h], (n0 >> 1) + 8 * jj + c2, acc[4 * (2 * jj) + 2 * h], acc[4 * (2 * jj) + 2 * h + 1],
                                acc[4 * (2 * jj + 1) + 2 * h], acc[4 * (2 * jj + 1) + 2 * h + 1]);
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) gq_store2<EPI>(E, T, N, R[h], n0 + j * 8 + c2, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
}

// Per K step (128 values): one barrier, then the four wgmma k32 MMAs of the step are issued first
// and, while they run, the copies of step kt + STAGES − 1, the fp4 conversion of step kt + 1 (each
// thread converts the 32-value groups it copied itself, so only its own copies must have landed) and
// the scale loads; then the wait and the promotion. Per-thread copy addresses are computed once per
// tile (the step only adds its offset).
template <int FMT, int WG, int EPI>
__device__ __forceinline__ void gw_gemm(const GqProb& P, const GqEpi& E) {
    typedef GwLayout<FMT, WG> L;
    constexpr int NT = 128 * WG, ST = L::STAGES, BM = L::BM;
    constexpr bool DIRECT = FMT == 2;
    constexpr int AC = BM * 8 / NT;                         // activation copies per thread per step
    constexpr int BCPR = DIRECT ? 8 : 4;                    // 16-byte weight copies per row per step
    constexpr int BC = 128 * BCPR / NT;                     // weight copies per thread per step
    constexpr int UNITS = DIRECT ? 1 : BC;                  // fp4: 32-value groups converted per thread
    constexpr int RB = DIRECT ? 128 : 64;                   // weight bytes per row per step
    static_assert(AC >= 1 && BC >= 1 && (BM * 8) % NT == 0 && (128 * BCPR) % NT == 0, "copies must divide among the threads");

    extern __shared__ __align__(16) u8 gw_sh[];
    u8* gbase;
    const u32 base = gw_smem_base(gw_sh, L::TOTAL, gbase);
    const u32 as_base = base, bs_base = base + ST * L::A_STAGE, bc_base = bs_base + ST * L::B_STAGE;
    const u8* bs_gen = gbase + ST * L::A_STAGE;
    u8* bconv = gbase + ST * (L::A_STAGE + L::B_STAGE);
    float* wsc = reinterpret_cast<float*>(bconv + 2 * L::BCONV);
    u32* lut = reinterpret_cast<u32*>(bconv + 2 * L::BCONV + L::WSC);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3;
    const int m0 = P.m0, n0 = P.n0, N = P.N, K = P.K;
    const int KT = K >> 7;
    const size_t wrow = FMT == 2 ? (size_t)K : (size_t)K / 2;
    const int sg = K >> 5;
    if (FMT == 3) gq_fill_lut(lut, tid, NT);

    // Activation copies: rows tid / 8 + i·NT / 8, chunk tid % 8 (one swizzle pattern for all i).
    const u8* a_src = P.q + (size_t)(m0 + (tid >> 3)) * K + (tid & 7) * 16;
    const size_t a_step = (size_t)(NT / 8) * K;
    const u32 a_off = gw_swz(tid >> 3, tid & 7);
    // Weight copies: rows tid / BCPR + i·NT / BCPR, chunk tid % BCPR; rows past N copy nothing.
    const u8* b_src[BC];
    bool b_ok[BC];
    const u8* s_row[UNITS] = {};  // fp4: unit u's (= copy u's) row of group scales, null past N
#pragma unroll
    for (int i = 0; i < BC; i++) {
        const int n = n0 + tid / BCPR + i * (NT / BCPR);
        b_ok[i] = n < N;
        b_src[i] = b_ok[i] ? fused_wrow<EPI>(P, n, wrow) + (tid % BCPR) * 16 : P.W;
        if constexpr (!DIRECT) {
            s_row[i] = nullptr;
            if (b_ok[i]) {
                const u8* s;
                const int sn = fused_srow<EPI>(P, n, s);
                s_row[i] = s + (size_t)sn * sg;
            }
        }
    }
    const u32 b_off = DIRECT ? gw_swz(tid / BCPR, tid % BCPR) : (u32)((tid / BCPR) * 64 + (tid % BCPR) * 16);

    auto issue = [&](int kt) {
        if (kt < KT) {
            const int slot = kt % ST;
            const u32 a_dst = as_base + slot * L::A_STAGE + a_off;
#pragma unroll
            for (int i = 0; i < AC; i++) gm_cp16(a_dst + i * (NT / 8) * 128, a_src + i * a_step + kt * 128, true);
            const u32 b_dst = bs_base + slot * L::B_STAGE + b_off;
#pragma unroll
            for (int i = 0; i < BC; i++) {
                gm_cp16(b_dst + i * (NT / BCPR) * (DIRECT ? 128 : 64), b_src[i] + (size_t)kt * RB, b_ok[i]);
            }
        }
        gm_commit();
    };

    // fp4: the four group-scale bytes of 128-block kt of unit u's row (1.0 each past the end).
    auto scale_word = [&](int kt, int u) -> u32 {
        if (FMT != 3 || kt >= KT || s_row[u] == nullptr) return 0x7f7f7f7fu;
        return __ldg(reinterpret_cast<const u32*>(s_row[u]) + kt);
    };

    // fp4: unit u = the 32 values this thread copied (row tid / 4 + u·NT / 4, group tid % 4) → 32
    // e4m3 bytes relative to the row's largest group scale in the block; that scale → wsc.
    auto convert = [&](int kt, const u32* sw) {
        const u8* raw = bs_gen + (kt % ST) * L::B_STAGE;
        u8* dst = bconv + (kt & 1) * L::BCONV;
        const int g = tid & 3;
#pragma unroll
        for (int u = 0; u < UNITS; u++) {
            const int r = (tid >> 2) + u * (NT / 4);
            const uint4 v = *reinterpret_cast<const uint4*>(raw + r * 64 + g * 16);
            u32 smax;
            *reinterpret_cast<uint4*>(dst + gw_swz(r, 2 * g)) = gq_fp4_unit(make_uint2(v.x, v.y), sw[u], g, lut, &smax);
            *reinterpret_cast<uint4*>(dst + gw_swz(r, 2 * g + 1)) = gq_fp4_unit(make_uint2(v.z, v.w), sw[u], g, lut, &smax);
            if (g == 0) wsc[(kt & 1) * 128 + r] = fs_e8m0((u8)smax);
        }
    };

    float acc[64], tmp[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    const int g4 = lane >> 2, c2 = (lane & 3) * 2;
    const int row_a = m0 + wg * 64 + wq * 16 + g4;
    const float* sa_r0 = P.sa + (size_t)row_a * KT;
    const float* sa_r1 = P.sa + (size_t)(row_a + 8) * KT;
    // fp8: the block-scale rows of the tile's gate (or only) and up columns.
    const u8* sw_g = nullptr;
    const u8* sw_u = nullptr;
    if (DIRECT) gw_fp8_scale_rows<EPI>(P, sw_g, sw_u);
    u32 sreg[UNITS];
    conv_pipeline_start<ST, UNITS, DIRECT>(issue, scale_word, convert, sreg);

    for (int kt = 0; kt < KT; kt++) {
        gm_wait<ST - 2>();  // step kt has landed (this thread's copies)
        gw_fence_proxy();
        __syncthreads();
        const u32 a_tile = as_base + (kt % ST) * L::A_STAGE + wg * 64 * 128;
        const u32 b_tile = DIRECT ? bs_base + (kt % ST) * L::B_STAGE : bc_base + (kt & 1) * L::BCONV;
        gw_issue_k128(tmp, gw_desc(a_tile), gw_desc(b_tile));
        const float sa0 = __ldg(sa_r0 + kt), sa1 = __ldg(sa_r1 + kt);
        float swg = 1.f, swu = 1.f;
        if (DIRECT) {
            swg = fs_e8m0(__ldg(sw_g + kt));
            if (EPI == 1) swu = fs_e8m0(__ldg(sw_u + kt));
        }
        issue(kt + ST - 1);
        if (!DIRECT) gm_wait<ST - 2>();  // step kt + 1 has landed (this thread's copies: all it converts)
        gq_pipeline_step<UNITS, DIRECT>(kt, KT, scale_word, convert, sreg);
        gw_wait_partial(tmp);
        gw_promote<DIRECT, EPI>(acc, tmp, sa0, sa1, swg, swu, wsc + (kt & 1) * 128, c2);
    }
    gm_wait<0>();
    gw_store<EPI>(E, P.T, N, row_a, n0, c2, acc);
}

// ---------------------------------------------------------------------------------------------
// Entry points of both families (WGMMA = true: gw_gemm, else gq_gemm; same arguments and outputs).

// The plain GEMM's tile: 1-D grid over 128 × 128 tiles, rasterised in groups of GQ_GROUP token tiles
// per output tile column.
__device__ __forceinline__ GqProb gq_plain(const u8* q, const float* sa, const u8* W, const u8* S, int T, int N, int K) {
    const int tiles_m = (T + 127) / 128, tiles_n = (N + 127) / 128, per_group = GQ_GROUP * tiles_n;
    const int pid = blockIdx.x, first_m = (pid / per_group) * GQ_GROUP, gsz = min(tiles_m - first_m, GQ_GROUP);
    GqProb p = {q, sa, W, S, nullptr, nullptr, (first_m + (pid % per_group) % gsz) * 128, ((pid % per_group) / gsz) * 128, T, N, K};
    return p;
}

template <bool WGMMA, int FMT, int BM, int EPI>
__device__ __forceinline__ void fp8_tile(const GqProb& p, const GqEpi& e) {
    if constexpr (WGMMA) gw_gemm<FMT, BM / 64, EPI>(p, e);
    else gq_gemm<FMT, BM, 128, 2, BM == 128 ? 4 : 2, EPI>(p, e);
}

#define FP8_GEMM_ENTRY(NAME, WGMMA, FMT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                                  \
        NAME(const u8* __restrict__ q, const float* __restrict__ sa, const u8* __restrict__ W, const u8* __restrict__ S, \
             float* __restrict__ y, int T, int N, int K) {                                                                \
        GqEpi e = {y, nullptr, 0, 0.f, nullptr, nullptr};                                                                 \
        fp8_tile<WGMMA, FMT, 128, 0>(gq_plain(q, sa, W, S, T, N, K), e);                                                  \
    }

FP8_GEMM_ENTRY(gemm_q8_fp8, false, 2)
FP8_GEMM_ENTRY(gemm_q8_fp4, false, 3)
FP8_GEMM_ENTRY(gemm_w8_fp8, true, 2)
FP8_GEMM_ENTRY(gemm_w8_fp4, true, 3)

// Unit w of the grouped MoE's queue (item w / tiles_n: an expert and its 128- or 64-row tile of
// grouped rows; column tile w % tiles_n) as a GEMM problem over that expert's weights.
template <int EPI>
__device__ __forceinline__ GqProb gq_moe_unit(const u8* q, const float* sa, const unsigned long long* wtab, const unsigned long long* stab,
                                              const unsigned long long* w3tab, const unsigned long long* s3tab, const int* items, int tiles_n,
                                              int N, int K, int w) {
    const int it = w / tiles_n, ex = items[2 * it];
    GqProb p;
    p.q = q;
    p.sa = sa;
    p.W = reinterpret_cast<const u8*>(wtab[ex]);
    p.S = reinterpret_cast<const u8*>(stab[ex]);
    p.W3 = EPI == 1 ? reinterpret_cast<const u8*>(w3tab[ex]) : nullptr;
    p.S3 = EPI == 1 ? reinterpret_cast<const u8*>(s3tab[ex]) : nullptr;
    p.m0 = items[2 * it + 1];
    p.n0 = (w % tiles_n) * 128;
    p.T = 0x7fffffff;
    p.N = N;
    p.K = K;
    return p;
}

// The grouped MoE over the on-device queue of (expert, row tile) items (gemm.cu moe_gemm).
template <bool WGMMA, int FMT, int BM, int EPI>
__device__ __forceinline__ void moe_fp8(const u8* q, const float* sa, const unsigned long long* wtab, const unsigned long long* stab,
                                        const unsigned long long* w3tab, const unsigned long long* s3tab, const int* items,
                                        const int* n_items, float* y, float* hf, int ldh, const int* dst, const float* gamma, int N,
                                        int K, float limit) {
    const int tiles_n = (N + 127) / 128;
    const int total = *n_items * tiles_n;
    GqEpi e = {y, hf, ldh, limit, dst, gamma};
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
        fp8_tile<WGMMA, FMT, BM, EPI>(gq_moe_unit<EPI>(q, sa, wtab, stab, w3tab, s3tab, items, tiles_n, N, K, w), e);
        __syncthreads();  // the next unit refills shared memory other warps may still be reading
    }
}

#define MOE_FP8_ENTRY(NAME, WGMMA, FMT, BM, EPI)                                                                          \
    extern "C" __global__ void __launch_bounds__(BM * 2, 1)                                                               \
        NAME(const u8* __restrict__ q, const float* __restrict__ sa, const unsigned long long* __restrict__ wtab,         \
             const unsigned long long* __restrict__ stab, const unsigned long long* __restrict__ w3tab,                   \
             const unsigned long long* __restrict__ s3tab, const int* __restrict__ items, const int* __restrict__ n_items, \
             float* __restrict__ y, float* __restrict__ hf, int ldh, const int* __restrict__ dst,                         \
             const float* __restrict__ gamma, int N, int K, float limit) {                                                \
        moe_fp8<WGMMA, FMT, BM, EPI>(q, sa, wtab, stab, w3tab, s3tab, items, n_items, y, hf, ldh, dst, gamma, N, K, limit); \
    }

// moe_<q8|w8>_<fmt>_<bm>_<plain|swiglu|scatter>; block = 2·BM threads (8 or 4 warps).
#define MOE_FP8_FMT(P, WGMMA, F, FMT)                                  \
    MOE_FP8_ENTRY(moe_##P##_##F##_128_plain, WGMMA, FMT, 128, 0)     \
    MOE_FP8_ENTRY(moe_##P##_##F##_128_swiglu, WGMMA, FMT, 128, 1)    \
    MOE_FP8_ENTRY(moe_##P##_##F##_128_scatter, WGMMA, FMT, 128, 2)   \
    MOE_FP8_ENTRY(moe_##P##_##F##_64_plain, WGMMA, FMT, 64, 0)       \
    MOE_FP8_ENTRY(moe_##P##_##F##_64_swiglu, WGMMA, FMT, 64, 1)      \
    MOE_FP8_ENTRY(moe_##P##_##F##_64_scatter, WGMMA, FMT, 64, 2)

MOE_FP8_FMT(q8, false, fp8, 2)
MOE_FP8_FMT(q8, false, fp4, 3)
MOE_FP8_FMT(w8, true, fp8, 2)
MOE_FP8_FMT(w8, true, fp4, 3)

// ---------------------------------------------------------------------------------------------
// moe_ws_<fmt>_128_<epi>(…): the grouped MoE of moe_w8_<fmt>_128_<epi> (same arguments, same
// outputs bit for bit: the same four wgmma k32 per K step and warpgroup, the same promotion) with
// warp specialisation (switch MOE_FP8_WS). Block of GWS_THREADS = 512: warpgroups 0 and 1 multiply
// (64 token rows each) and promote; warpgroups 2 and 3 produce, with 40 registers per thread so
// that the multiply warpgroups get 216 (setmaxnreg). Per K step the producers copy the activation
// tile and the weight tile (fp4: packed) into a ring of GwsLayout::STAGES stages with cp.async;
// fp4: load the rows' scale words with plain loads and store them into the stage a step later;
// GWS_LAG steps behind their copies convert fp4 weights to e4m3 (gq_fp4_unit's conversion) and
// mark the stage full on an mbarrier (one arrival per producer thread, after fence.proxy.async so
// that wgmma sees the data). Each multiply warp waits on it, multiplies, promotes and releases the
// stage on a second mbarrier (one arrival per warp). Nothing else synchronises the block, and the
// ring runs across the block's units, so the next unit's copies overlap this one's epilogue.
// Producers and multiply warpgroups walk the same unit sequence (grid-stride over the queue).
// Learned from the PTX ISA (mbarrier, wgmma, setmaxnreg, proxy fences) and DeepGEMM's
// producer/consumer design; the code is ours.

// Steps between a stage's copies and its conversion / full mark: every stage in that window is
// unavailable to the multiply warpgroups, so a short lag leaves more ready stages. 2 was faster
// than 3; 1 was 1.4% faster on one run but not qualified (bench/moe_ws_variants_h200.log).
#define GWS_LAG 2
#define GWS_PRODUCERS 256                     // producer threads (two warpgroups)
#define GWS_THREADS (256 + GWS_PRODUCERS)

// One stage: A [128][128] e4m3 (swizzled); fp4: converted B [128][128] e4m3 (swizzled), packed B
// [128][64], one scale word per producer thread and unit (512 × 4 bytes), row scales [128] f32;
// fp8: B [128][128] e4m3 (swizzled). Then the full and empty barriers and the fp4 table.
template <int FMT>
struct GwsLayout {
    static constexpr bool FP4 = FMT == 3;
    static constexpr int STAGES = FP4 ? 5 : 6;
    static constexpr int A = 0, B = 16384, BC = 16384, BR = 32768, SW = 40960, WSC = 43008;  // B (fp8), BC (fp4): the same place
    static constexpr int STAGE = FP4 ? 44032 : 32768;  // multiples of 1024 (swizzle atoms)
    static constexpr int BARS = STAGES * STAGE;
    static constexpr int LUT = BARS + 2 * STAGES * 8;
    static constexpr int TOTAL = 1024 + LUT + (FP4 ? 72 : 0);
};

template <int FMT, int EPI>
__device__ __forceinline__ void moe_ws(const u8* q, const float* sa, const unsigned long long* wtab, const unsigned long long* stab,
                                       const unsigned long long* w3tab, const unsigned long long* s3tab, const int* items, const int* n_items,
                                       float* y, float* hf, int ldh, const int* dst, const float* gamma, int N, int K, float limit) {
    typedef GwsLayout<FMT> L;
    constexpr int ST = L::STAGES;
    constexpr bool FP4 = FMT == 3;
    extern __shared__ __align__(16) u8 gws_sh[];
    if (blockDim.x != GWS_THREADS) __trap();  // without its producers the ring would never fill
    u8* gbase;
    const u32 base = gw_smem_base(gws_sh, L::TOTAL, gbase);
    const u32 full0 = base + L::BARS, empty0 = full0 + ST * 8;
    u32* lut = reinterpret_cast<u32*>(gbase + L::LUT);
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            gws_bar_init(full0 + 8 * s, GWS_PRODUCERS);
            gws_bar_init(empty0 + 8 * s, 8);
        }
    }
    if (FP4) gq_fill_lut(lut, tid, GWS_THREADS);
    __syncthreads();

    const int tiles_n = (N + 127) / 128;
    const int total = *n_items * tiles_n;
    const int KT = K >> 7;
    GqEpi E = {y, hf, ldh, limit, dst, gamma};
    auto prob = [&](int w) { return gq_moe_unit<EPI>(q, sa, wtab, stab, w3tab, s3tab, items, tiles_n, N, K, w); };

    if (tid >= 256) {
        // Producer warpgroups: registers handed to the multiply warpgroups.
        GW_ASM("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        const int p = tid - 256;
        constexpr int NP = GWS_PRODUCERS;
        constexpr int LAG = GWS_LAG;
        static_assert(LAG >= 1 && LAG <= ST - 1, "the lag must leave the ring room (no deadlock)");
        constexpr int AC = 1024 / NP;                  // activation copies per thread per step
        constexpr int BCP = (FP4 ? 512 : 1024) / NP;  // weight copies per thread per step (16 bytes each)
        const size_t wrow = FP4 ? (size_t)K / 2 : (size_t)K;
        const int sg = K >> 5;
        int j = 0, jc = 0;        // steps copied, steps marked full
        GwsRing<ST> cp, cv;       // their ring positions
        // fp4: the scale words of the last step copied, loaded with plain loads (a 4-byte cp.async
        // per thread costs 32 shared-memory wavefronts) and stored into its stage one step later,
        // before that step is converted (GWS_LAG ≥ 1 steps later).
        u32 pend[FP4 ? BCP : 1];
        int pend_stage = -1;
        auto store_pending = [&] {
            if (FP4 && pend_stage >= 0) {
#pragma unroll
                for (int i = 0; i < BCP; i++) *reinterpret_cast<u32*>(gbase + pend_stage * L::STAGE + L::SW + (i * NP + p) * 4) = pend[i];
            }
        };
        // Mark step jc full: its copies (and fp4: its conversion) are this thread's to finish.
        auto finish = [&](bool drain) {
            if (drain) gm_wait<0>();
            else gm_wait<LAG>();
            const int s = cv.s;
            if constexpr (FP4) {
                const u8* st = gbase + s * L::STAGE;
                const int g = p & 3;
#pragma unroll
                for (int u = 0; u < BCP; u++) {
                    const int r = (p >> 2) + (NP / 4) * u;
                    const uint4 v = *reinterpret_cast<const uint4*>(st + L::BR + r * 64 + g * 16);
                    const u32 sw = *reinterpret_cast<const u32*>(st + L::SW + (u * NP + p) * 4);
                    u8* bc = gbase + s * L::STAGE + L::BC;
                    // gq_fp4_unit's conversion, the scale word decoded once for the unit's 32 values.
                    u32 m;
                    gq_fp4x32_store(v, gq_fp4_table(sw, g, lut, &m), bc, r, g);
                    if (g == 0) reinterpret_cast<float*>(gbase + s * L::STAGE + L::WSC)[r] = fs_e8m0((u8)m);
                }
            }
            gw_fence_proxy();
            gws_arrive(full0 + 8 * s);
            jc++;
            cv.next();
        };
        for (int w = blockIdx.x; w < total; w += gridDim.x) {
            const GqProb P = prob(w);
            // Activation copies: rows p / 8 + (NP / 8) i, chunk p % 8.
            const u8* a_src = P.q + (size_t)(P.m0 + (p >> 3)) * K + (p & 7) * 16;
            const u32 a_off = gw_swz(p >> 3, p & 7);
            // Weight copies: fp4 rows p / 4 + (NP / 4) i, 16-byte group p % 4 (+ that row's scale
            // word); fp8 rows p / 8 + (NP / 8) i, chunk p % 8. Rows past N copy zeros.
            const u8* b_src[BCP];
            const u8* s_src[FP4 ? BCP : 1];
            bool b_ok[BCP];
#pragma unroll
            for (int i = 0; i < BCP; i++) {
                const int r = FP4 ? (p >> 2) + (NP / 4) * i : (p >> 3) + (NP / 8) * i;
                const int n = P.n0 + r;
                b_ok[i] = n < N;
                b_src[i] = b_ok[i] ? fused_wrow<EPI>(P, n, wrow) + (FP4 ? (p & 3) : (p & 7)) * 16 : P.W;
                if constexpr (FP4) {
                    s_src[i] = P.S;
                    if (b_ok[i]) {
                        const u8* s;
                        const int sn = fused_srow<EPI>(P, n, s);
                        s_src[i] = s + (size_t)sn * sg;
                    }
                }
            }
            for (int kt = 0; kt < KT; kt++) {
                const int s = cp.s;
                gws_wait(empty0 + 8 * s, cp.ph ^ 1);
                const u32 sb = base + s * L::STAGE;
#pragma unroll
                for (int i = 0; i < AC; i++) gm_cp16(sb + L::A + a_off + i * (NP / 8) * 128, a_src + (size_t)i * (NP / 8) * K + kt * 128, true);
#pragma unroll
                for (int i = 0; i < BCP; i++) {
                    if constexpr (FP4) {
                        const int r = (p >> 2) + (NP / 4) * i;
                        gm_cp16(sb + L::BR + r * 64 + (p & 3) * 16, b_src[i] + (size_t)kt * 64, b_ok[i]);
                    } else {
                        const int r = (p >> 3) + (NP / 8) * i;
                        gm_cp16(sb + L::B + gw_swz(r, p & 7), b_src[i] + (size_t)kt * 128, b_ok[i]);
                    }
                }
                gm_commit();
                if constexpr (FP4) {
                    store_pending();
                    // Rows past N: scale word 0 (gw_gemm: 1.0 each); their columns are never stored.
#pragma unroll
                    for (int i = 0; i < BCP; i++) pend[i] = b_ok[i] ? __ldg(reinterpret_cast<const u32*>(s_src[i]) + kt) : 0u;
                    pend_stage = s;
                }
                j++;
                cp.next();
                if (j - jc > LAG) finish(false);
            }
        }
        store_pending();
        while (jc < j) finish(true);
        return;
    }

    // Consumer warpgroups 0 and 1.
    GW_ASM("setmaxnreg.inc.sync.aligned.u32 216;" ::: "memory");
    const int lane = tid & 31, warp = tid >> 5, wq = warp & 3;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform for the compiler (gw_mma_lo)
    const int g4 = lane >> 2, c2 = (lane & 3) * 2;
    GwsRing<ST> ring;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
        const GqProb P = prob(w);
        const int n0 = P.n0;
        const int row_a = P.m0 + wg * 64 + wq * 16 + g4;
        const float* sa_r0 = P.sa + (size_t)row_a * KT;
        const float* sa_r1 = P.sa + (size_t)(row_a + 8) * KT;
        const u8* sw_g = nullptr;
        const u8* sw_u = nullptr;
        if (!FP4) gw_fp8_scale_rows<EPI>(P, sw_g, sw_u);
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.f;
        // Step kt's scales: activation rows row_a and row_a + 8, fp8 weight blocks (gate, up).
        struct Sc {
            float a0, a1, swg, swu;
        };
        // Without branches: the step past the last reads the last step's scales (unused).
        auto scales = [&](int kt) {
            const int k = min(kt, KT - 1);
            Sc c = {__ldg(sa_r0 + k), __ldg(sa_r1 + k), 1.f, 1.f};
            if (!FP4) {
                c.swg = fs_e8m0_sel(__ldg(sw_g + k));
                if (EPI == 1) c.swu = fs_e8m0_sel(__ldg(sw_u + k));
            }
            return c;
        };
        // The scales' global loads run a step ahead of their use.
        float tmp[64];
        Sc cur = scales(0);
        for (int kt = 0; kt < KT; kt++, ring.next()) {
            const Sc next = scales(kt + 1);
            const u32 sb = base + ring.s * L::STAGE;
            gws_wait(full0 + 8 * ring.s, ring.ph);
            __syncwarp();  // converged for the .aligned wgmma instructions
            gw_issue_k128_lo(tmp, gw_desc_lo(sb + L::A + wg * 64 * 128), gw_desc_lo(sb + (FP4 ? L::BC : L::B)));
            gw_wait_partial(tmp);
            gw_promote<!FP4, EPI>(acc, tmp, cur.a0, cur.a1, cur.swg, cur.swu, reinterpret_cast<const float*>(gbase + ring.s * L::STAGE + L::WSC), c2);
            __syncwarp();
            if (lane == 0) gws_arrive(empty0 + 8 * ring.s);  // the stage is free again
            cur = next;
        }
        gw_store<EPI>(E, 0x7fffffff, N, row_a, n0, c2, acc);
    }
}

#define MOE_WS_ENTRY(NAME, FMT, EPI)                                                                                      \
    extern "C" __global__ void __launch_bounds__(GWS_THREADS, 1)                                                          \
        NAME(const u8* __restrict__ q, const float* __restrict__ sa, const unsigned long long* __restrict__ wtab,         \
             const unsigned long long* __restrict__ stab, const unsigned long long* __restrict__ w3tab,                   \
             const unsigned long long* __restrict__ s3tab, const int* __restrict__ items, const int* __restrict__ n_items, \
             float* __restrict__ y, float* __restrict__ hf, int ldh, const int* __restrict__ dst,                         \
             const float* __restrict__ gamma, int N, int K, float limit) {                                                \
        moe_ws<FMT, EPI>(q, sa, wtab, stab, w3tab, s3tab, items, n_items, y, hf, ldh, dst, gamma, N, K, limit);           \
    }

MOE_WS_ENTRY(moe_ws_fp8_128_plain, 2, 0)
MOE_WS_ENTRY(moe_ws_fp8_128_swiglu, 2, 1)
MOE_WS_ENTRY(moe_ws_fp8_128_scatter, 2, 2)
MOE_WS_ENTRY(moe_ws_fp4_128_plain, 3, 0)
MOE_WS_ENTRY(moe_ws_fp4_128_swiglu, 3, 1)
MOE_WS_ENTRY(moe_ws_fp4_128_scatter, 3, 2)

// ---------------------------------------------------------------------------------------------
// moe_wt_fp4_256_<epi>(…, bsg, bsu): the grouped MoE of moe_ws_fp4_128_<epi> for FP4 experts in
// 256-row tiles (switch MOE_FP8_WT; moe_ws's arguments and two more, the same outputs bit for bit)
// with the activations q in the tiled layout (gq_tiled: 64-row × 128-byte blocks, swizzled as wgmma
// reads them; written by moe_gather_q8 and act_quant_fp8 in their tiled modes) and the FP4 weights
// converted to e4m3 relative to the largest group scale of their 128 × 128 block (bsg: the tables
// of fp4_block_smax for W / W1, bsu: for W3, [E][ceil(rows / 128)][K / 128] bytes) instead of
// their row's: the converted values differ from moe_ws's by a power of two per column, which the
// f32 promotion multiplies back exactly (the tensor cores' sums scale with them, as measured for
// MOE_FP4_TO_FP8), and the promotion needs one weight scale per tile and step (gw_promote's FP8
// form) instead of one per column. The host takes these kernels only where every group scale of a
// block lies within 8 binades of its largest (exact e4m3; DeepSeek's converter re-expresses FP4
// experts with 128 × 128 block scales, spec §6).
// Block of GWT_THREADS = 384: warpgroups 0 and 1 multiply 128 token rows each as two 64-row
// sub-tiles (wg and wg + 2, GWT_SUB_INTERLEAVE; per K step and sub-tile moe_ws's four wgmma
// m64n128k32 and its promotion, into one accumulator set per sub-tile), warpgroup 2 produces with 72 registers per thread so that the
// multiply warpgroups get 216 (setmaxnreg: the split must sum to the 384 × 168 the launch gives,
// since the multiply warpgroups' raise draws on what the producer released). Per K step the producer's thread 0 announces the
// stage's activation bytes on its full barrier and copies each live sub-tile (one whose first row
// is a routed pair, dst ≥ 0: an expert's padding rows come last) with one 8 KB cp.async.bulk;
// every producer thread copies its 4 × 16 packed weight bytes into its own place in a separate
// ring of GWT_LAG + 1 steps (cp.async) and loads its scale words and the step's block scales, and
// GWT_LAG steps later converts those 128 values (into registers, all four units' loads first,
// before it awaits the stage; then stores them into the stage) and arrives. Sub-tiles of padding
// rows alone are neither copied, multiplied nor stored. So each weight tile is converted once per
// 256 token rows instead of once per 128, the activations cost the producer one instruction per
// sub-tile, and a tile multiplies only the 64-row sub-tiles that hold routed rows. Learned from the
// PTX ISA (cp.async.bulk, mbarrier transaction counts) and DeepGEMM's producer/consumer design;
// the code is ours. The multiply warpgroups' outputs leave through per-warp staging blocks as
// 128-byte row segments (gwt_store, GWT_EPI_STAGED; 2 % off the layer at 8K and 32K: 5.22–5.27 vs
// 5.30–5.43 ms, bench/moe_wt_variants_h200.log), for which the ring has 3 stages (timed as 4). The
// packed weights stay four 16-byte cp.async per producer thread and step: one 64-byte
// cp.async.bulk per tile row instead made the layer 30 % slower at 8K (20 % at 32K; the same log,
// 9588e06), two 2-D tensor copies per step by one thread 8 % at 8K (~2 % at 32K; 4af605a).

// The copy lag and the ring depth, overridable for timing (FLASHSEEK_KERNEL_DEFINES; nvrtc.rs) as
// long as GwtLayout fits the WT_SMEM bytes the host launches with (3 stages: lag ≤ 2, ≤ 3 with
// GWT_EPI_STAGED=0; 2 stages: lag ≤ 6; 4 stages do not fit; more traps
// in gw_smem_base).
#ifndef GWT_LAG
#define GWT_LAG 2
#endif
#ifndef GWT_STAGES
#define GWT_STAGES 3
#endif
// The epilogue through per-warp staging blocks (gwt_store; 1, the default) or gw_store's direct
// 8-byte stores (0; timing only: the same values at the same places).
#ifndef GWT_EPI_STAGED
#define GWT_EPI_STAGED 1
#endif
// Timing diagnostics only (FLASHSEEK_KERNEL_DEFINES=MOE_WT_DIAG=n, n a sum of bits; wrong
// results): 1 the producer stores its packed bytes unconverted, 2 the multiply warpgroups skip the
// wgmma and promotion, 4 they skip the promotion, 8 the producer stores no converted tile, 16 the
// kernel returns at once (its setmaxnreg then compiles away, the register count is not WT_REGS and
// Gpu::open turns moe_wt off: useless), 32 the producer skips its proxy fence, 64 it loads no scale words (made
// up instead: the plain loads whose values it stores a step later), 128 it copies no packed weights
// (cp.async), 256 no activation sub-tiles (its full barrier expects no bytes), 512 the multiply
// warpgroups load no scales (made up), 1024 they store no outputs. 0 (default): the kernel. What
// they measured: bench/moe_wt_variants_h200.log (bits 1-64 the twenty-second session, 128-1024 the
// twenty-third).
#ifndef MOE_WT_DIAG
#define MOE_WT_DIAG 0
#endif
// The multiply warpgroups' sub-tiles: wg and wg + 2 (1, the default: the live sub-tiles are a
// prefix, so a tile of two gives each warpgroup one) or 2 wg and 2 wg + 1 (0: the form before
// 800d456, where warpgroup 1 sat idle on tiles of at most 128 routed rows). The same bits.
#ifndef GWT_SUB_INTERLEAVE
#define GWT_SUB_INTERLEAVE 1
#endif
#define GWT_PRODUCERS 128
#define GWT_THREADS (256 + GWT_PRODUCERS)

// fp4_block_smax(stab, N, K, out, bad): for expert e (grid x), 128-row block nb (grid y, NB =
// gridDim.y = ceil(N / 128)) and 128-column block kb (threads): out[(e·NB + nb)·KB + kb] = the
// largest ue8m0 group scale byte of rows nb·128 … min(N, nb·128 + 128) − 1, groups 4 kb … 4 kb + 3
// of stab[e] ([N, K/32] bytes; K a multiple of 128); *bad |= 1 when some group scale of the block
// lies more than 8 binades below it or it is 255 (NaN). Any block size.
extern "C" __global__ void fp4_block_smax(const unsigned long long* __restrict__ stab, int N, int K, u8* __restrict__ out, int* __restrict__ bad) {
    const int e = blockIdx.x, nb = blockIdx.y, NB = gridDim.y, KB = K >> 7, sg = K >> 5;
    const u8* s = reinterpret_cast<const u8*>(stab[e]);
    for (int kb = threadIdx.x; kb < KB; kb += blockDim.x) {
        u32 mx = 0u, mn = 255u;
        for (int r = nb * 128; r < min(N, nb * 128 + 128); r++) {
            const u32 w = __ldg(reinterpret_cast<const u32*>(s + (size_t)r * sg) + kb);
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const u32 v = (w >> (8 * b)) & 0xffu;
                mx = max(mx, v);
                mn = min(mn, v);
            }
        }
        out[((size_t)e * NB + nb) * KB + kb] = (u8)mx;
        if (mx == 255u || mn + 8u < mx) atomicOr(bad, 1);
    }
}

// Shared memory: STAGES stages of A (four 64-row sub-tiles, 32 KB) and the converted B [128][128]
// e4m3 (16 KB), both swizzled; the packed-weight ring (RAW steps of [128][64] bytes) and its words
// (RAW × 5 × 128 u32: per producer thread its four units' scale words and the step's block
// scales); the epilogue's staging blocks (GWT_EPI_STAGED: 16 × 40 f32 per multiply warp); the full
// and empty barriers; the fp4 table.
struct GwtLayout {
    static constexpr int STAGES = GWT_STAGES, RAW = GWT_LAG + 1;
    static constexpr int A = 0, BC = 32768, STAGE = 49152;
    static constexpr int BR = STAGES * STAGE;
    static constexpr int SW = BR + RAW * 8192, SW_SLOT = 5 * GWT_PRODUCERS * 4;
    static constexpr int EPS = SW + RAW * SW_SLOT, EPS_WARP = 16 * 40, EPS_BYTES = GWT_EPI_STAGED ? 8 * EPS_WARP * 4 : 0;
    static constexpr int BARS = EPS + EPS_BYTES;
    static constexpr int LUT = BARS + 2 * STAGES * 8;
    static constexpr int TOTAL = 1024 + LUT + 72;
};

// moe_wt's epilogue (GWT_EPI_STAGED): gw_store's values to gw_store's places, staged through the
// warp's block sc (16 rows × 40 f32; conflict-free for the float2 writes of a half warp and the
// float4 reads of a quarter warp) 32 output columns at a time, then stored as 128-byte row segments:
// a 16-byte store per lane covering four rows per instruction, where gw_store's 8-byte stores cover
// eight rows in 32-byte pieces (the direct stores cost the layer ~0.6 ms at T = 8,192, MOE_WT_DIAG
// 1024, and bf16 outputs of half the bytes had not helped: their request count was the suspect;
// staged, the layer gained ~0.1 ms, bench/moe_wt_variants_h200.log).
// The thread's rows are row_a, row_a + 8 of the warp's 16 (row_a − lane / 4 …); per chunk it stores
// rows lane / 8 + 4 i (i < 4), columns 4 (lane % 8) … + 3. EPI 1 stores hidden units (n0 / 2 + …;
// N / 2 of them), EPI 2 rows dst[row] ≥ 0, EPI 0 every row (moe_wt has no T bound). YB (EPI 2
// only; switch MOE_DOWN_BF16_OUT): E.y holds bf16, each value rounded to nearest even as it is
// staged, 64 columns a chunk, stored as 128-byte row segments as the f32 ones are.
template <int EPI, bool YB = false>
__device__ __forceinline__ void gwt_store(const GqEpi& E, int N, int row_a, int n0, int lane, float* sc, const float (&acc)[64]) {
    static_assert(!YB || EPI == 2, "bf16 outputs are the scatter's");
    const int g4 = lane >> 2, c2 = (lane & 3) * 2, wr = row_a - g4;
    const GqRow R[2] = {gq_row<EPI>(E, row_a), gq_row<EPI>(E, row_a + 8)};
    // Output row of each stored row (row i / 2 of R on lane 4 (ρ % 8), ρ = lane / 8 + 4 i).
    int orow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int rho = (lane >> 3) + 4 * i;
        if constexpr (EPI == 2) {
            orow[i] = __shfl_sync(0xffffffffu, R[i >> 1].orow, 4 * (rho & 7));
        } else {
            orow[i] = wr + rho;
        }
    }
    constexpr int NC = EPI == 1 ? 2 : 4;
    const int width = EPI == 1 ? N / 2 : N, c0 = EPI == 1 ? n0 >> 1 : n0;
    float* out = EPI == 1 ? E.hf : E.y;
    const size_t ld = EPI == 1 ? (size_t)E.ldh : (size_t)N;
    if constexpr (YB) {
        // bf16 rows: two chunks of 64 columns, staged as bf16 pairs (16 rows × 72 values, the
        // block's first 2,304 bytes; conflict-free for a warp's 4-byte writes and a quarter warp's
        // 16-byte reads), stored as 128-byte row segments (a 16-byte store per lane).
        u32* sb = reinterpret_cast<u32*>(sc);
        u16* outb = reinterpret_cast<u16*>(E.y);
        const bool vec8 = (ld & 7) == 0 && (reinterpret_cast<size_t>(outb) & 15) == 0;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            __syncwarp();  // the previous chunk's reads are done
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                const int j = 8 * q + jj;
#pragma unroll
                for (int h = 0; h < 2; h++) sb[(g4 + 8 * h) * 36 + 4 * jj + (c2 >> 1)] = gm_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            }
            __syncwarp();
            const int col = c0 + 64 * q + 8 * (lane & 7);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (orow[i] < 0) continue;
                const uint4 v = *reinterpret_cast<const uint4*>(sb + ((lane >> 3) + 4 * i) * 36 + 4 * (lane & 7));
                u16* d = outb + (size_t)orow[i] * ld + col;
                if (vec8 && col + 7 < width) {
                    *reinterpret_cast<uint4*>(d) = v;
                } else {
                    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int x = 0; x < 8; x++)
                        if (col + x < width) d[x] = (u16)(w[x >> 1] >> (16 * (x & 1)));
                }
            }
        }
        return;
    }
    const bool vec = (ld & 3) == 0 && (reinterpret_cast<size_t>(out) & 15) == 0;
#pragma unroll
    for (int q = 0; q < NC; q++) {
        __syncwarp();  // the previous chunk's reads are done
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const int j = 4 * q + jj;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float v0, v1;
                if constexpr (EPI == 1) {
                    v0 = fs_swiglu(acc[4 * (2 * j) + 2 * h], acc[4 * (2 * j + 1) + 2 * h], E.limit) * R[h].gam;
                    v1 = fs_swiglu(acc[4 * (2 * j) + 2 * h + 1], acc[4 * (2 * j + 1) + 2 * h + 1], E.limit) * R[h].gam;
                } else {
                    v0 = acc[4 * j + 2 * h];
                    v1 = acc[4 * j + 2 * h + 1];
                }
                *reinterpret_cast<float2*>(sc + (g4 + 8 * h) * 40 + 8 * jj + c2) = make_float2(v0, v1);
            }
        }
        __syncwarp();
        const int col = c0 + 32 * q + 4 * (lane & 7);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (EPI == 2 && orow[i] < 0) continue;
            const float4 v = *reinterpret_cast<const float4*>(sc + ((lane >> 3) + 4 * i) * 40 + 4 * (lane & 7));
            float* d = out + (size_t)orow[i] * ld + col;
            if (vec && col + 3 < width) {
                *reinterpret_cast<float4*>(d) = v;
            } else {
                if (col < width) d[0] = v.x;
                if (col + 1 < width) d[1] = v.y;
                if (col + 2 < width) d[2] = v.z;
                if (col + 3 < width) d[3] = v.w;
            }
        }
    }
}

template <int EPI, bool YB = false>
__device__ __forceinline__ void moe_wt(const u8* q, const float* sa, const unsigned long long* wtab, const unsigned long long* stab,
                                       const unsigned long long* w3tab, const unsigned long long* s3tab, const int* items, const int* n_items,
                                       float* y, float* hf, int ldh, const int* dst, const float* gamma, int N, int K, float limit,
                                       const u8* bsg, const u8* bsu) {
    typedef GwtLayout L;
    constexpr int ST = L::STAGES, RAW = L::RAW, NP = GWT_PRODUCERS, LAG = GWT_LAG;
    static_assert(LAG >= 1, "the copies run ahead of the conversion");
    extern __shared__ __align__(16) u8 gwt_sh[];
    if (blockDim.x != GWT_THREADS) __trap();  // without its producer the ring would never fill
#if MOE_WT_DIAG & 16
    return;
#endif
    u8* gbase;
    const u32 base = gw_smem_base(gwt_sh, L::TOTAL, gbase);
    const u32 full0 = base + L::BARS, empty0 = full0 + ST * 8;
    u32* lut = reinterpret_cast<u32*>(gbase + L::LUT);
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            gws_bar_init(full0 + 8 * s, NP + 1);  // each producer thread after converting, and thread 0's byte count
            gws_bar_init(empty0 + 8 * s, 8);
        }
        gws_bar_init_fence();
    }
    gq_fill_lut(lut, tid, GWT_THREADS);
    __syncthreads();

    const int tiles_n = (N + 127) / 128;
    const int total = *n_items * tiles_n;
    const int KT = K >> 7;
    // Weight rows of the tile's matrices (EPI 1: W1 and W3 of N / 2 rows each) in 128-row blocks.
    const int NBW = ((EPI == 1 ? N / 2 : N) + 127) >> 7;
    GqEpi E = {y, hf, ldh, limit, dst, gamma};
    auto prob = [&](int w) { return gq_moe_unit<EPI>(q, sa, wtab, stab, w3tab, s3tab, items, tiles_n, N, K, w); };
    auto live = [&](int m0, int st) { return __ldg(dst + m0 + 64 * st) >= 0; };
    // Offset of unit w's block scales (step 0) in bsg / bsu: its expert, the 128-row block of its
    // weight rows (EPI 1: the tile's 128 columns are 64 rows of W1 and of W3, in one block of each).
    auto block_row = [&](int w, int n0) {
        const int nb = (EPI == 1 ? n0 >> 1 : n0) >> 7;
        return ((size_t)items[2 * (w / tiles_n)] * NBW + nb) * KT;
    };

    if (tid >= 256) {
        GW_ASM("setmaxnreg.dec.sync.aligned.u32 72;" ::: "memory");
        const int p = tid - 256, g = p & 3;
        const size_t wrow = (size_t)K / 2;
        const int sg = K >> 5;
        // The block's steps: its units (grid-stride) × KT. The packed weights of step j + LAG are
        // copied (into raw slot (j + LAG) % RAW) before step j's stage is awaited, so the copies run
        // LAG steps ahead of the conversion whatever the ring of stages holds.
        const int units = blockIdx.x < total ? (total - 1 - blockIdx.x) / gridDim.x + 1 : 0;
        const int steps = units * KT;
        // Copy side: unit cw (grid-stride index), step ck within it, steps issued jn.
        int cw = blockIdx.x, ck = 0, jn = 0;
        const u8* b_src[4];
        const u8* s_src[4];
        u32 b_ok = 0;
        size_t cbrow = 0;
        auto copy_unit = [&] {
            const GqProb P = prob(cw);
            cbrow = block_row(cw, P.n0);
            b_ok = 0;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int n = P.n0 + (p >> 2) + 32 * u;
                const bool ok = n < N;
                b_ok |= (u32)ok << u;
                // Weight row p / 4 + 32 u, 16-byte group p % 4 (+ that row's scale words). Rows past N copy zeros.
                b_src[u] = ok ? fused_wrow<EPI>(P, n, wrow) + g * 16 : P.W;
                s_src[u] = P.S;
                if (ok) {
                    const u8* sp;
                    const int sn = fused_srow<EPI>(P, n, sp);
                    s_src[u] = sp + (size_t)sn * sg;
                }
            }
        };
        if (steps > 0) copy_unit();
        // The scale words of the last step issued (and its block scales, gate | up << 8), loaded
        // with plain loads and stored into the thread's own words of that step's raw slot when the
        // next copy is issued (before that step is converted).
        u32 pend[5];
        int pend_slot = -1;
        auto issue = [&] {
            if (pend_slot >= 0) {
#pragma unroll
                for (int u = 0; u < 5; u++) *reinterpret_cast<u32*>(gbase + L::SW + pend_slot * L::SW_SLOT + (u * NP + p) * 4) = pend[u];
                pend_slot = -1;
            }
            if (jn < steps) {
                const int slot = jn % RAW;
#if !(MOE_WT_DIAG & 128)
#pragma unroll
                for (int u = 0; u < 4; u++) gm_cp16(base + L::BR + slot * 8192 + ((p >> 2) + 32 * u) * 64 + g * 16, b_src[u] + (size_t)ck * 64, (b_ok >> u) & 1u);
#endif
                // Rows past N: scale word 0; their columns are never stored.
#pragma unroll
#if MOE_WT_DIAG & 64
                for (int u = 0; u < 5; u++) pend[u] = u == 4 ? 0x0808u : 0u;  // group scales ≤ the block's: table rows in range
#else
                for (int u = 0; u < 4; u++) pend[u] = (b_ok >> u) & 1u ? __ldg(reinterpret_cast<const u32*>(s_src[u]) + ck) : 0u;
                pend[4] = (u32)__ldg(bsg + cbrow + ck) | (EPI == 1 ? (u32)__ldg(bsu + cbrow + ck) << 8 : 0u);
#endif
                pend_slot = slot;
                jn++;
                if (++ck == KT) {
                    ck = 0;
                    cw += gridDim.x;
                    if (jn < steps) copy_unit();
                }
            }
            gm_commit();  // an empty group past the last step keeps wait_group's count
        };
        for (int i = 0; i < LAG; i++) issue();
        GwsRing<ST> ring;
        int j = 0;  // steps converted
        for (int w = blockIdx.x; w < total; w += gridDim.x) {
            const GqProb P = prob(w);
            // The live sub-tiles are a prefix: a tile's rows are one expert's (items start at its
            // bm-aligned offset), whose padding rows come last (moe_group_plan), and its first row
            // is routed (no item covers padding alone). The multiply warpgroups test each one.
            int nlive = 1;
#pragma unroll
            for (int st = 1; st < 4; st++) nlive += live(P.m0, st);
            const u8* a_src = P.q + (size_t)(P.m0 >> 6) * KT * 8192;
            for (int kt = 0; kt < KT; kt++, j++, ring.next()) {
                issue();  // step j + LAG
                const int s = ring.s;
                // Step j's packed bytes are this thread's own copies, LAG groups back. They are
                // converted into registers before the stage is awaited (the ring of packed bytes is
                // separate), so only the stores wait for the multiply warpgroups.
                gm_wait<LAG>();
                const int slot = j % RAW;
                const u8* raw = gbase + L::BR + slot * 8192;
                const u32* words = reinterpret_cast<const u32*>(gbase + L::SW + slot * L::SW_SLOT);
                const u32 bm = words[4 * NP + p];
                // All four units' packed bytes and table rows are loaded before any is converted, so
                // that their shared-memory latencies overlap.
                uint4 v[4];
                uint2 tb[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int r = (p >> 2) + 32 * u;
                    v[u] = *reinterpret_cast<const uint4*>(raw + r * 64 + g * 16);
                    // The group's e4m3 magnitudes times 2^(s_grp − s_block) (gq_fp4_table's table rows).
                    const u32 smax = EPI == 1 && ((r >> 3) & 1) ? bm >> 8 : bm & 0xffu;
                    const int dd = max((int)((words[u * NP + p] >> (8 * g)) & 0xffu) - (int)smax, -8) + 8;
                    tb[u] = *reinterpret_cast<const uint2*>(lut + 2 * dd);
                }
                uint4 o[4][2];
#if MOE_WT_DIAG & 1
#pragma unroll
                for (int u = 0; u < 4; u++) o[u][0] = o[u][1] = make_uint4(v[u].x ^ tb[u].x, v[u].y, v[u].z, v[u].w ^ tb[u].y);
#else
#pragma unroll
                for (int u = 0; u < 4; u++) gq_fp4x32(v[u], tb[u], o[u][0], o[u][1]);
#endif
                gws_wait(empty0 + 8 * s, ring.ph ^ 1);
                if (p == 0) {
#if MOE_WT_DIAG & 256
                    const int ncopy = 0;
#else
                    const int ncopy = nlive;
#endif
                    const u32 bar = full0 + 8 * s, bytes = (u32)ncopy * 8192u;
                    GW_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
                    for (int st = 0; st < ncopy; st++) gws_bulk_copy<8192>(base + s * L::STAGE + L::A + st * 8192, a_src + ((size_t)st * KT + kt) * 8192, bar);
                }
                u8* bc = gbase + s * L::STAGE + L::BC;
#if MOE_WT_DIAG & 8
                if ((o[0][0].x & o[1][0].y & o[2][1].z & o[3][1].w) == 0x12345678u)
#endif
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int r = (p >> 2) + 32 * u;
                    *reinterpret_cast<uint4*>(bc + gw_swz(r, 2 * g)) = o[u][0];
                    *reinterpret_cast<uint4*>(bc + gw_swz(r, 2 * g + 1)) = o[u][1];
                }
#if !(MOE_WT_DIAG & 32)
                gw_fence_proxy();
#endif
                gws_arrive(full0 + 8 * s);
            }
        }
        gm_wait<0>();
        return;
    }

    // Multiply warpgroups 0 and 1: sub-tiles S0 = wg and S0 + SS = wg + 2 (GWT_SUB_INTERLEAVE, the
    // default: a tile of two live sub-tiles gives each warpgroup one) or 2 wg and 2 wg + 1 (0).
    GW_ASM("setmaxnreg.inc.sync.aligned.u32 216;" ::: "memory");
    constexpr int SS = GWT_SUB_INTERLEAVE ? 2 : 1;
    const int lane = tid & 31, warp = tid >> 5, wq = warp & 3;
    // The warpgroup index, broadcast from lane 0 so that the compiler sees a warp-uniform value and
    // builds the wgmma descriptors in uniform registers.
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    const int g4 = lane >> 2, c2 = (lane & 3) * 2;
    GwsRing<ST> ring;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
        const GqProb P = prob(w);
        const int s0 = GWT_SUB_INTERLEAVE ? wg : 2 * wg;
        const bool l0 = live(P.m0, s0), l1 = live(P.m0, s0 + SS);
        const int row0 = P.m0 + s0 * 64 + wq * 16 + g4;  // this thread's rows row0, row0 + 8 (+ 64 SS in the second sub-tile)
        const float* sa0 = P.sa + (size_t)row0 * KT;
        const size_t brow = block_row(w, P.n0);
        const u8* swg = bsg + brow;
        const u8* swu = bsu + brow;
        float acc0[64], acc1[64], tmp[64];
#pragma unroll
        for (int i = 0; i < 64; i++) {
            acc0[i] = 0.f;
            acc1[i] = 0.f;
        }
        // Step kt's scales: activation rows row0, row0 + 8, row0 + 64 SS, row0 + 64 SS + 8, the tile's block
        // scale bytes (gate or only, up); loaded a step ahead, the bytes decoded where they are used
        // (so that nothing waits on the loads before the step's MMAs).
        struct Sc {
            float a0, a1, b0, b1;
            u32 wg, wu;
        };
        // Without branches: a sub-tile that is not live reads the scales of the tile's first rows
        // (always routed) and the step past the last reads the last step's; neither is used.
        const float* safe = P.sa + (size_t)(P.m0 + wq * 16 + g4) * KT;
        const float* pa0 = l0 ? sa0 : safe;
        const float* pa1 = l0 ? sa0 + 8 * KT : safe;
        const float* pb0 = l1 ? sa0 + 64 * SS * KT : safe;
        const float* pb1 = l1 ? sa0 + (64 * SS + 8) * KT : safe;
        auto scales = [&](int kt) {
            const int k = min(kt, KT - 1);
#if MOE_WT_DIAG & 512
            return Sc{1.f + k, 2.f, 3.f, 4.f, 127u, 127u};
#else
            return Sc{__ldg(pa0 + k), __ldg(pa1 + k), __ldg(pb0 + k), __ldg(pb1 + k), __ldg(swg + k), EPI == 1 ? __ldg(swu + k) : 127u};
#endif
        };
        Sc cur = scales(0);
        for (int kt = 0; kt < KT; kt++, ring.next()) {
            const Sc next = scales(kt + 1);
            const u32 sb = base + ring.s * L::STAGE;
            gws_wait(full0 + 8 * ring.s, ring.ph);
            __syncwarp();  // converged for the .aligned wgmma instructions
            // Sub-tile st of this warpgroup into acc (its rows' activation scales sa0, sa1).
            auto multiply = [&](float (&acc)[64], int st, float sa0, float sa1) {
#if MOE_WT_DIAG & 2
                acc[st] += sa0 * sa1;
#else
                gw_issue_k128_lo(tmp, gw_desc_lo(sb + L::A + (s0 + SS * st) * 8192), gw_desc_lo(sb + L::BC));
                gw_wait_partial(tmp);
#if MOE_WT_DIAG & 4
                acc[st] += tmp[st] * sa0;
#else
                gw_promote<true, EPI>(acc, tmp, sa0, sa1, fs_e8m0_sel(cur.wg), fs_e8m0_sel(cur.wu), nullptr, c2);
#endif
#endif
            };
            if (l0) multiply(acc0, 0, cur.a0, cur.a1);
            if (l1) multiply(acc1, 1, cur.b0, cur.b1);
            __syncwarp();
            if (lane == 0) gws_arrive(empty0 + 8 * ring.s);  // the stage is free again
            cur = next;
        }
#if MOE_WT_DIAG & 1024
        if (acc0[0] + acc1[1] == 1234.5f)
#endif
        {
#if GWT_EPI_STAGED
            float* sc = reinterpret_cast<float*>(gbase + L::EPS) + warp * L::EPS_WARP;
            if (l0) gwt_store<EPI, YB>(E, N, row0, P.n0, lane, sc, acc0);
            if (l1) gwt_store<EPI, YB>(E, N, row0 + 64 * SS, P.n0, lane, sc, acc1);
#else
            if (YB) __trap();  // the bf16 scatter stores only through the staging blocks
            if (l0) gw_store<EPI>(E, 0x7fffffff, N, row0, P.n0, c2, acc0);
            if (l1) gw_store<EPI>(E, 0x7fffffff, N, row0 + 64 * SS, P.n0, c2, acc1);
#endif
        }
    }
}

#define MOE_WT_ENTRY(NAME, EPI, YB)                                                                                       \
    extern "C" __global__ void __launch_bounds__(GWT_THREADS, 1)                                                          \
        NAME(const u8* __restrict__ q, const float* __restrict__ sa, const unsigned long long* __restrict__ wtab,         \
             const unsigned long long* __restrict__ stab, const unsigned long long* __restrict__ w3tab,                   \
             const unsigned long long* __restrict__ s3tab, const int* __restrict__ items, const int* __restrict__ n_items, \
             float* __restrict__ y, float* __restrict__ hf, int ldh, const int* __restrict__ dst,                         \
             const float* __restrict__ gamma, int N, int K, float limit, const u8* __restrict__ bsg,                      \
             const u8* __restrict__ bsu) {                                                                                \
        moe_wt<EPI, YB>(q, sa, wtab, stab, w3tab, s3tab, items, n_items, y, hf, ldh, dst, gamma, N, K, limit, bsg, bsu);  \
    }

MOE_WT_ENTRY(moe_wt_fp4_256_plain, 0, false)
MOE_WT_ENTRY(moe_wt_fp4_256_swiglu, 1, false)
MOE_WT_ENTRY(moe_wt_fp4_256_scatter, 2, false)
// MOE_DOWN_BF16_OUT: the scatter's rows in bf16 (y a u16 buffer; the f32 scatter's values rounded to
// nearest even, as DeepSeek's FP8/FP4 GEMMs write their outputs, spec §6 "Output is bf16").
MOE_WT_ENTRY(moe_wt_fp4_256_scatter_bf16, 2, true)

extern "C" __global__ void lt_scales(const float* __restrict__ sa, int T, int KB, float* __restrict__ sat, const u8* __restrict__ sw,
                                     int NB, float* __restrict__ swf) {
    const int KBp = (KB + 3) & ~3;
    const long long n1 = (long long)T * KB, n2 = (long long)NB * KBp;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n1 + n2; i += (long long)gridDim.x * blockDim.x) {
        if (i < n1) {
            const long long kb = i / T, t = i % T;
            sat[i] = sa[t * KB + kb];
        } else {
            const long long j = i - n1, nb = j / KBp, kb = j % KBp;
            swf[j] = kb < KB ? fs_e8m0(sw[nb * KB + kb]) : 1.0f;
        }
    }
}

// moe_gather_q8's loop in index type Ix (u32 where the group count fits: a 32-bit division per
// group instead of a 64-bit one; the same bytes).
template <class Ix>
__device__ __forceinline__ void moe_gather_groups(const u8* __restrict__ q, const float* __restrict__ sa, const int* __restrict__ row_tok,
                                                  u8* __restrict__ xq, float* __restrict__ xsa, int Kp, int tiled, Ix total) {
    const Ix q16 = (Ix)(Kp / 16), threads = (Ix)gridDim.x * blockDim.x;
    const int KB = Kp >> 7;
    for (Ix i = (Ix)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += threads) {
        const Ix ri = i / q16;
        const long long r = (long long)ri;
        const int c = (int)(i - ri * q16);
        const int tok = row_tok[r];
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (tok >= 0) v = *reinterpret_cast<const uint4*>(q + (size_t)tok * Kp + c * 16);
        *reinterpret_cast<uint4*>(xq + (tiled ? gq_tiled(r, c * 16, KB) : r * Kp + c * 16)) = v;
        if ((c & 7) == 0) xsa[r * KB + (c >> 3)] = tok >= 0 ? sa[(size_t)tok * KB + (c >> 3)] : 1.f;
    }
}

// moe_gather_q8(q, sa, row_tok, offsets, xq, xsa, Kp, E, tiled): grouped rows of per-token quantized
// activations: xq [R, Kp] = q[row_tok[r]] (zero for padding rows; tiled ≠ 0: in gq_tiled's layout,
// R a multiple of 64), xsa [R, Kp/128] (1 for padding). Grid-stride over (row, 16-byte column
// group); any grid, block 256.
extern "C" __global__ void moe_gather_q8(const u8* __restrict__ q, const float* __restrict__ sa, const int* __restrict__ row_tok,
                                         const int* __restrict__ offsets, u8* __restrict__ xq, float* __restrict__ xsa, int Kp, int E,
                                         int tiled) {
    const long long total = (long long)offsets[E] * (Kp / 16);
    // (The 32-bit loop cannot wrap: the host's grid holds at most 540,672 threads.) A negative count
    // (no valid grouping writes one) runs no turn, as before.
    if (!AQ_WIDE_INDEX && total >= 0 && total < (1ll << 31)) {
        moe_gather_groups<unsigned>(q, sa, row_tok, xq, xsa, Kp, tiled, (unsigned)total);
    } else {
        moe_gather_groups<long long>(q, sa, row_tok, xq, xsa, Kp, tiled, total);
    }
}

// scale_rows_by_route(h, dst, gamma, rows, width): h[r, :] *= gamma[dst[r]] (0 when dst[r] < 0) —
// the official order (γ before the down projection's activation quantisation) for the unfused and
// per-expert MoE paths. Grid-stride over elements; any grid, block 256.
extern "C" __global__ void scale_rows_by_route(float* __restrict__ h, const int* __restrict__ dst, const float* __restrict__ gamma,
                                               int rows, int width) {
    const long long total = (long long)rows * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int d = dst[i / width];
        h[i] *= d < 0 ? 0.f : gamma[d];
    }
}
