// gemm.cu — tensor-core linear layers for many tokens (prefill): y[t, n] = Σ_k x[t, k] · W[n, k]
// with bf16 activations (or split ones, x = hi + lo), W dequantized exactly to bf16 in shared
// memory, and f32 accumulation (mma.sync m16n8k16 bf16 → f32; on sm_90a wgmma m64n128k16 /
// m64n256k16, the gemm_wb_* / moe_wb_* / moe_wbs_* kernels at the end of this file). The exact f32 path is
// linear.cu; `Gpu::linear` picks this one for T ≥ 64 as FLASHSEEK_TC_LINEAR says (gpu.rs `TcMode`: split by
// default, bf16, or 0 = off).
//
// Two launches per linear layer:
//   gemm_x_bf16(x, xb, T, K, Tp, split): x [T, K] f32 → xb [Tp, Kp] bf16 bits (round to nearest
//     even), Kp = K rounded up to 32, Tp = T rounded up to 128; padding rows and columns are zero,
//     so the GEMM reads activations with no bounds checks and 16-byte aligned rows. With split, a
//     second plane [Tp, Kp] follows with bf16(x − hi).
//   gemm_tc_<fmt>[_m|_s][_x2](xb, W, S, y, T, N, K): the GEMM, same (x, W, S, y, T, N, K) order as
//     linear.cu (x here is xb); _x2 reads both planes and issues two MMAs per weight fragment (hi,
//     then lo, into the same accumulators). Weight layouts are linear.cu's:
//       f32:  W f32 [N, K]                                               (K % 4 == 0)
//       bf16: W bf16 bits [N, K]                                         (K % 8 == 0)
//       fp8:  W e4m3 [N, K] + ue8m0 scales [ceil(N/128), ceil(K/128)]    (K % 16 == 0)
//       fp4:  W packed e2m1 [N, K/2] (low nibble = even k) + ue8m0 [N, K/32] (K % 32 == 0)
//
// Tiles (block BM tokens × BN outputs, K step 32; warps WM × WN, each a (BM/WM) × (BN/WN) tile):
//   gemm_tc_<fmt>    BM 128, BN 256, 8 warps (2 × 4), warp tile 64 × 64   (large T·N)
//   gemm_tc_<fmt>_m  BM 128, BN 128, 8 warps (2 × 4), warp tile 64 × 32
//   gemm_tc_<fmt>_s  BM  64, BN  64, 4 warps (2 × 2), warp tile 32 × 32   (few tiles)
// Grid: 1-D, ceil(T/BM)·ceil(N/BN) blocks, rasterised in groups of 8 token tiles per output tile
// column (the weight tile is reused from L2 by 8 consecutive blocks). Dynamic shared memory, sized by
// the host (crates/engine/src/cuda/gpu.rs `gemm_smem_bytes`, the same formula as GmLayout below; a
// smaller launch traps).
//
// Pipeline (STAGES = 4, 3 for f32): cp.async copies the activation tile and the raw weight bytes of
// K step kt + STAGES − 1 while step kt multiplies. Raw weights of step kt + 1 are dequantized into
// one of two bf16 tiles (ping-pong) during step kt, so one barrier per K step orders everything:
//   f32:  cvt.rn.bf16x2.f32 (rounds W to bf16: the only weight format that is not exact in bf16)
//   bf16: no dequant; ldmatrix reads the staged tile directly
//   fp8:  bit placement e4m3 → bf16 (value · 2^-120, subnormals included), times 2^(s−7) with one
//         bf16x2 multiply (exact: e4m3 has 3 mantissa bits, the scale is a power of two)
//   fp4:  byte → bf16x2 pair table (256 entries, one copy per lane: conflict-free), times 2^(s−127)
// Scale bytes are loaded into registers two K steps ahead of their use.
// Deterministic: each output is one thread's f32 accumulator over K in a fixed order; no atomics
// (every tile gives the same bits). Not reproduced: FP8 NaN encodings (0x7F / 0xFF) decode as
// ±480·scale here (checkpoints hold none); FP8 scale bytes 0–2 (2^-127..2^-125) can round the
// smallest weights (bf16 subnormals stop at 2^-133). Every other value is exact (checked: all bytes).
//
// Measured on H200 (gpu-check, 2048 tokens): FP8 [32768, 1024] 188 TFLOP/s (split 138), FP8
// [4096, 8192] 192 (136), FP4 [2048, 4096] 126 (105), BF16 [1024, 4096] 169 (82, Medium tile),
// against 0.5–7 TFLOP/s for linear.cu at the same shapes. Headroom: mma.sync with one barrier per
// 32-wide K step; the wgmma kernels below are the sm_90a answer.

#define GM_BK 32
#define GM_LDS 40    // bf16 per padded shared-memory row (80 bytes: ldmatrix rows hit distinct banks)
#define GM_GROUP 8   // token tiles per raster group

__device__ __forceinline__ u32 gm_mul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// Bytes v0, v1 of w (sel 0x1404) or v2, v3 (sel 0x3424) as e4m3 → bf16x2 holding value · 2^-120:
// the byte goes to the high byte of its 16-bit lane, sign stays at bit 15, exponent and mantissa
// shift down by 4 into the bf16 exponent's low bits and mantissa top (e = 0 lands on bf16 subnormals,
// which is again the e4m3 subnormal times 2^-120).
__device__ __forceinline__ u32 gm_e4m3x2(u32 w, u32 sel) {
    u32 t = __byte_perm(w, 0u, sel);
    return (t & 0x80008000u) | ((t & 0x7f007f00u) >> 4);
}

// The bf16 bits of 2^(e-127) for a ue8m0 byte (0 → 2^-127, a bf16 subnormal; 255 → NaN).
__device__ __forceinline__ u32 gm_e8m0_bf16(u32 e) {
    return e == 0u ? 0x0040u : e == 255u ? 0x7fc0u : (e << 7);
}

// 16 e4m3 bytes of one 128-block (ue8m0 scale byte s) as 8 bf16x2 words, exact: the byte placement
// gives value · 2^-120, then one multiply by 2^(s−7); where 2^(s−7) overflows bf16 (s > 134), by
// 2^120 (undoing the placement) and then by 2^(s−127).
__device__ __forceinline__ void gm_fp8x16_bf16(uint4 v, u32 s, u32* o) {
    bool two = s > 134u;
    u32 f1 = two ? (247u << 7) : ((s + 120u) << 7);
    f1 |= f1 << 16;
    u32 f2 = gm_e8m0_bf16(s);
    f2 |= f2 << 16;
    u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o[2 * i] = gm_mul2(gm_e4m3x2(w[i], 0x1404u), f1);
        o[2 * i + 1] = gm_mul2(gm_e4m3x2(w[i], 0x3424u), f1);
    }
    if (two) {
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = gm_mul2(o[i], f2);
    }
}

// The bf16 bits of an e2m1 nibble (exact): 0.5 = 0x3F00, else exponent 126 + (m >> 1), mantissa m & 1.
__device__ __forceinline__ u32 gm_e2m1_bf16(u32 nib) {
    u32 m = nib & 7u;
    u32 mag = m == 0u ? 0u : m == 1u ? 0x3F00u : ((126u + (m >> 1)) << 7) | ((m & 1u) << 6);
    return mag | ((nib & 8u) << 12);
}

template <int FMT, int BM, int BN, bool SPLIT>
struct GmLayout {
    static constexpr int STAGES = FMT == 0 ? 3 : 4;
    static constexpr int A_PLANE = BM * GM_LDS * 2;
    static constexpr int A_STAGE = SPLIT ? 2 * A_PLANE : A_PLANE;
    // Raw weight row pitch in shared memory (bytes): f32 128 + 16 pad, bf16 the padded bf16 row,
    // fp8 32 + 16 pad, fp4 16 (pads keep the dequant reads conflict-free).
    static constexpr int RP = FMT == 0 ? 144 : FMT == 1 ? GM_LDS * 2 : FMT == 2 ? 48 : 16;
    static constexpr int RAW_STAGE = BN * RP;
    static constexpr int BTILE = FMT == 1 ? 0 : BN * GM_LDS * 2;
    static constexpr int LUT = FMT == 3 ? 256 * 32 * 4 : 0;
    static constexpr int TOTAL = STAGES * (A_STAGE + RAW_STAGE) + 2 * BTILE + LUT;
};

// One output tile's problem. Plain linear layers (EPI 0, gemm_tc_*): rows m0.. of xb, weights W/S,
// output y [T, N] (rows ≥ T not written). Grouped MoE tiles (moe_gemm_*) point W/S (and W3/S3) at one
// expert and m0 at the tile's first grouped row.
struct GmProb {
    const u16* xb;     // activations: [rows, Kp] bf16 (+ low plane at lo_plane elements with SPLIT)
    size_t lo_plane;
    const u8* W;       // weight [N, K] (EPI 1: the gate W1 [N/2, K])
    const u8* S;       // its scales
    const u8* W3;      // EPI 1: the up projection W3 [N/2, K]
    const u8* S3;
    int m0, n0;        // tile origin (activation row, output column)
    int T, N, K;       // rows bound for EPI 0 writes, outputs (EPI 1: 2·inter), inputs
};

// Epilogues: 0 = store f32 y[row, col] (row < T); 1 = fused SwiGLU: the weight tile interleaves gate
// and up rows in blocks of 8 (fused column c: hidden unit (c >> 4)·8 + (c & 7), gate when bit 3 is 0),
// so one thread holds g and u of the same unit and writes h = silu(min(g, L))·clamp(u, ±L) as bf16
// (plus the low plane with SPLIT) into hb [rows, ldh]; 2 = scatter f32 rows: y[dst[row], col]
// (dst[row] < 0: padding row, not written).
struct GmEpi {
    float* y;
    u16* hb;
    size_t h_lo;
    int ldh;
    float limit;
    const int* dst;
};

// Scale byte of weight row n (of the tile's matrix: EPI 1 interleaves gate and up rows in blocks of
// 8) at input k: FP8 per 128 × 128 block, FP4 per row and 32 inputs.
template <int FMT, int EPI>
__device__ __forceinline__ u32 gm_scale_byte(const GmProb& P, int n, int k, int sk) {
    const u8* s;
    n = fused_srow<EPI>(P, n, s);
    if (FMT == 2) return __ldg(s + (size_t)(n >> 7) * sk + (k >> 7));
    return __ldg(s + (size_t)n * (P.K >> 5) + (k >> 5));
}

// Epilogue 1 for one row and two adjacent hidden units col, col + 1: h = silu(min(g, L))·clamp(u, ±L)
// as bf16 into hb (with SPLIT also bf16(h − hi) into the low plane at h_lo).
template <bool SPLIT>
__device__ __forceinline__ void gm_swiglu_store(const GmEpi& E, int row, int col, float g0, float g1, float u0, float u1) {
    const float hv[2] = {fs_swiglu(g0, u0, E.limit), fs_swiglu(g1, u1, E.limit)};
    const u32 hi = gm_bf16x2(hv[0], hv[1]);
    u16* dst = E.hb + (size_t)row * E.ldh + col;
    *reinterpret_cast<u32*>(dst) = hi;
    if (SPLIT) {
        *reinterpret_cast<u32*>(dst + E.h_lo) = gm_bf16x2_lo(hv[0], hv[1], hi);
    }
}

// Epilogues 0 and 2 for one row and two adjacent output columns col, col + 1 (either may lie past N).
template <int EPI>
__device__ __forceinline__ void gm_store2(const GmEpi& E, int T, int N, int row, int col, float v0, float v1) {
    const int orow = EPI == 2 ? E.dst[row] : row;
    if (EPI == 0 ? row < T : orow >= 0) {
        float* dst = E.y + (size_t)orow * N + col;
        if ((N & 1) == 0 && col + 1 < N) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
            if (col < N) dst[0] = v0;
            if (col + 1 < N) dst[1] = v1;
        }
    }
}

template <int FMT, int BM, int BN, int WM, int WN, bool SPLIT, int EPI>
__device__ __forceinline__ void gm_gemm(const GmProb& P, const GmEpi& E) {
    const u16* __restrict__ xb = P.xb;
    const u8* __restrict__ W = P.W;
    const u8* __restrict__ S = P.S;
    const int T = P.T, N = P.N, K = P.K;
    typedef GmLayout<FMT, BM, BN, SPLIT> L;
    constexpr int NT = WM * WN * 32;
    constexpr int ST = L::STAGES;
    constexpr bool DIRECT = FMT == 1;
    constexpr int RB = FMT == 0 ? 128 : FMT == 1 ? 64 : FMT == 2 ? 32 : 16;  // raw bytes per row per K step
    constexpr int CPR = RB / 16;                                             // 16-byte copies per row
    constexpr int DQ = FMT == 0 ? 4 : 16;                                    // values per dequant unit
    constexpr int UPR = GM_BK / DQ;                                          // dequant units per row
    constexpr int UNITS = DIRECT ? 1 : BN * UPR / NT;                        // dequant units per thread
    constexpr int WTM = BM / WM, WTN = BN / WN, MT = WTM / 16, NT8 = WTN / 8;
    static_assert(DIRECT || (BN * UPR) % NT == 0, "dequant units must divide among the threads");
    static_assert((BM * 4) % NT == 0, "activation copies must divide among the threads");
    static_assert(NT8 % 2 == 0, "B fragments are loaded in pairs");

    extern __shared__ __align__(16) u8 gm_sh[];
    {
        u32 dsz;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsz));
        if (dsz < (u32)L::TOTAL) __trap();
    }
    u8* As = gm_sh;
    u8* Rs = As + ST * L::A_STAGE;
    u8* Bt = Rs + ST * L::RAW_STAGE;
    u32* lut = reinterpret_cast<u32*>(Bt + 2 * L::BTILE);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int m0 = P.m0, n0 = P.n0;
    const int Kp = (K + 31) & ~31, KT = Kp / GM_BK;
    const size_t lo_plane = P.lo_plane;  // SPLIT: the low halves follow the high ones
    const size_t wrow = FMT == 0 ? (size_t)K * 4 : FMT == 1 ? (size_t)K * 2 : FMT == 2 ? (size_t)K : (size_t)K / 2;
    const int sk = (K + 127) >> 7;

    if (FMT == 3) {
        for (int i = tid; i < 256 * 32; i += NT) {
            u32 b = (u32)i >> 5;
            lut[i] = gm_e2m1_bf16(b & 15u) | (gm_e2m1_bf16(b >> 4) << 16);
        }
    }

    const u32 as_base = gm_smem(As), rs_base = gm_smem(Rs), bt_base = gm_smem(Bt);

    // Copies of K step kt into ring slot kt % ST (always commits a group, empty past the end).
    auto issue = [&](int kt) {
        if (kt < KT) {
            const int slot = kt % ST;
            const u32 a_dst = as_base + slot * L::A_STAGE;
#pragma unroll
            for (int i = 0; i < BM * 4 / NT; i++) {
                int q = tid + i * NT, r = q >> 2, c = q & 3;
                const u16* src = xb + (size_t)(m0 + r) * Kp + kt * GM_BK + c * 8;
                gm_cp16(a_dst + r * (GM_LDS * 2) + c * 16, src, true);
                if (SPLIT) gm_cp16(a_dst + L::A_PLANE + r * (GM_LDS * 2) + c * 16, src + lo_plane, true);
            }
            const u32 r_dst = rs_base + slot * L::RAW_STAGE;
#pragma unroll
            for (int i = 0; i < (BN * CPR + NT - 1) / NT; i++) {
                int q = tid + i * NT;
                if ((BN * CPR) % NT == 0 || q < BN * CPR) {
                    int r = q / CPR, c = q % CPR;
                    size_t kb = (size_t)kt * RB + c * 16;
                    bool ok = n0 + r < N && kb < wrow;
                    const u8* src = ok ? fused_wrow<EPI>(P, n0 + r, wrow) + kb : W;
                    gm_cp16(r_dst + r * L::RP + c * 16, src, ok);
                }
            }
        }
        gm_commit();
    };

    // Scale byte of dequant unit u at K step kt (127 = 1.0 outside the matrix).
    auto scale_of = [&](int kt, int u) -> u32 {
        int q = tid + u * NT, r = q % BN, c = q / BN;
        int n = n0 + r, k = kt * GM_BK + c * DQ;
        if (FMT < 2 || kt >= KT || n >= N || k >= K) return 127u;
        return gm_scale_byte<FMT, EPI>(P, n, k, sk);
    };

    // Raw weights of K step kt → bf16 tile kt & 1.
    auto dequant = [&](int kt, const u32* sc) {
        const u8* raw = Rs + (kt % ST) * L::RAW_STAGE;
        u8* dst = Bt + (kt & 1) * L::BTILE;
#pragma unroll
        for (int u = 0; u < UNITS; u++) {
            int q = tid + u * NT, r = q % BN, c = q / BN;
            if (FMT == 0) {
                float4 v = *reinterpret_cast<const float4*>(raw + r * L::RP + c * 16);
                *reinterpret_cast<uint2*>(dst + r * (GM_LDS * 2) + c * 8) = make_uint2(gm_bf16x2(v.x, v.y), gm_bf16x2(v.z, v.w));
            } else if (FMT == 2) {
                uint4 v = *reinterpret_cast<const uint4*>(raw + r * L::RP + c * 16);
                u32 o[8];
                gm_fp8x16_bf16(v, sc[u], o);
                uint4* d = reinterpret_cast<uint4*>(dst + r * (GM_LDS * 2) + c * 32);
                d[0] = make_uint4(o[0], o[1], o[2], o[3]);
                d[1] = make_uint4(o[4], o[5], o[6], o[7]);
            } else if (FMT == 3) {
                uint2 v = *reinterpret_cast<const uint2*>(raw + r * L::RP + c * 8);
                u32 f = gm_e8m0_bf16(sc[u]);
                f |= f << 16;
                u32 w[2] = {v.x, v.y};
                u32 o[8];
#pragma unroll
                for (int i = 0; i < 8; i++) o[i] = gm_mul2(lut[((w[i >> 2] >> (8 * (i & 3))) & 0xffu) * 32 + lane], f);
                uint4* d = reinterpret_cast<uint4*>(dst + r * (GM_LDS * 2) + c * 32);
                d[0] = make_uint4(o[0], o[1], o[2], o[3]);
                d[1] = make_uint4(o[4], o[5], o[6], o[7]);
            }
        }
    };

    float acc[MT][NT8][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    // Scales of K steps kt+1 .. kt+ST-2 (index 0 = the step dequantized next).
    constexpr int SR = ST - 2 > 0 ? ST - 2 : 1;
    u32 sreg[SR][UNITS];

#pragma unroll
    for (int s = 0; s < ST - 1; s++) issue(s);
    if (!DIRECT) {
        u32 sc0[UNITS];
#pragma unroll
        for (int u = 0; u < UNITS; u++) sc0[u] = scale_of(0, u);
#pragma unroll
        for (int j = 0; j < SR; j++)
#pragma unroll
            for (int u = 0; u < UNITS; u++) sreg[j][u] = scale_of(1 + j, u);
        gm_wait<ST - 2>();
        __syncthreads();
        dequant(0, sc0);
    }

    for (int kt = 0; kt < KT; kt++) {
        if (DIRECT) gm_wait<ST - 2>();  // step kt has landed
        else gm_wait<ST - 3>();         // step kt + 1 has landed (kt was waited for one step ago)
        __syncthreads();
        issue(kt + ST - 1);
        if (!DIRECT) {
            if (kt + 1 < KT) dequant(kt + 1, sreg[0]);
            if (FMT >= 2) {
#pragma unroll
                for (int j = 0; j + 1 < SR; j++)
#pragma unroll
                    for (int u = 0; u < UNITS; u++) sreg[j][u] = sreg[j + 1][u];
#pragma unroll
                for (int u = 0; u < UNITS; u++) sreg[SR - 1][u] = scale_of(kt + ST - 1, u);
            }
        }
        const u32 a_base = as_base + (kt % ST) * L::A_STAGE;
        const u32 b_base = DIRECT ? rs_base + (kt % ST) * L::RAW_STAGE : bt_base + (kt & 1) * L::BTILE;
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            u32 af[MT][4], bfr[NT8][2];
#pragma unroll
            for (int np = 0; np < NT8 / 2; np++) {
                int row = wn * WTN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                gm_ldsm4(b_base + (row * GM_LDS + kk + ((lane >> 3) & 1) * 8) * 2, bfr[2 * np][0], bfr[2 * np][1], bfr[2 * np + 1][0],
                         bfr[2 * np + 1][1]);
            }
#pragma unroll
            for (int p = 0; p < (SPLIT ? 2 : 1); p++) {  // high halves, then (SPLIT) low halves
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int row = wm * WTM + mt * 16 + (lane & 15);
                    gm_ldsm4(a_base + p * L::A_PLANE + (row * GM_LDS + kk + (lane >> 4) * 8) * 2, af[mt][0], af[mt][1], af[mt][2],
                             af[mt][3]);
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT8; nt++) gm_mma(acc[mt][nt], af[mt], bfr[nt][0], bfr[nt][1]);
            }
        }
    }
    gm_wait<0>();

    const int g = lane >> 2, c2 = (lane & 3) * 2;
    if (EPI == 1) {
        // acc[.][2j] = gate, acc[.][2j + 1] = up of hidden units hb0 + 8j + c2 (+1); rows of padded
        // tiles are all written (zero inputs give h = 0), so the down GEMM reads no stale values.
        const int hb0 = (n0 + wn * WTN) >> 1;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int j = 0; j < NT8 / 2; j++) {
                const int col = hb0 + 8 * j + c2;
                if (2 * col >= N) continue;
#pragma unroll
                for (int h = 0; h < 2; h++)
                    gm_swiglu_store<SPLIT>(E, m0 + wm * WTM + mt * 16 + g + 8 * h, col, acc[mt][2 * j][2 * h], acc[mt][2 * j][2 * h + 1],
                                           acc[mt][2 * j + 1][2 * h], acc[mt][2 * j + 1][2 * h + 1]);
            }
        }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT8; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                gm_store2<EPI>(E, T, N, m0 + wm * WTM + mt * 16 + g + 8 * h, n0 + wn * WTN + nt * 8 + c2, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
}

#ifndef FS_GEMM_WGMMA_ONLY
// split ≠ 0: also the low halves x − bf16(x), rounded to bf16, as a second plane [Tp, Kp] after the
// first (x = hi + lo to about 16 significant bits).
extern "C" __global__ void gemm_x_bf16(const float* __restrict__ x, u16* __restrict__ xb, int T, int K, int Tp, int split) {
    const int Kp = (K + 31) & ~31, q4 = Kp / 4;
    const size_t total = (size_t)Tp * q4;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / q4), k = (int)(i % q4) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < T && k < K) v = __ldg(reinterpret_cast<const float4*>(x + (size_t)t * K + k));
        u32 h0 = gm_bf16x2(v.x, v.y), h1 = gm_bf16x2(v.z, v.w);
        *reinterpret_cast<uint2*>(xb + (size_t)t * Kp + k) = make_uint2(h0, h1);
        if (split) {
            *reinterpret_cast<uint2*>(xb + total * 4 + (size_t)t * Kp + k) = make_uint2(gm_bf16x2_lo(v.x, v.y, h0), gm_bf16x2_lo(v.z, v.w, h1));
        }
    }
}

// w_fp8_bf16(W, S, N, K, out): an FP8 weight [N, K] (+ ue8m0 scales [ceil(N/128), ceil(K/128)]) as
//   bf16 bits [N, K], the values the GEMM tiles hold (gm_fp8x16_bf16, exact), for cuBLASLt's bf16
//   GEMM (switch LINEAR_CUBLASLT, gpu.rs). K % 16 == 0. Grid-stride over 16-byte groups, block 256.
extern "C" __global__ void w_fp8_bf16(const u8* __restrict__ W, const u8* __restrict__ S, int N, int K, u16* __restrict__ out) {
    const int KB = (K + 127) >> 7;
    const long long groups = (long long)N * (K >> 4);
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (long long)gridDim.x * blockDim.x) {
        const long long n = g / (K >> 4);
        const int k = (int)(g % (K >> 4)) << 4;
        u32 o[8];
        gm_fp8x16_bf16(*reinterpret_cast<const uint4*>(W + g * 16), S[(n >> 7) * KB + (k >> 7)], o);
        uint4* d = reinterpret_cast<uint4*>(out + g * 16);
        d[0] = make_uint4(o[0], o[1], o[2], o[3]);
        d[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

#endif  // FS_GEMM_WGMMA_ONLY

// The plain GEMM's tile origin: 1-D grid rasterised in groups of GM_GROUP token tiles per output
// tile column.
template <int BM, int BN>
__device__ __forceinline__ GmProb gm_plain(const u16* x, const u8* W, const u8* S, int T, int N, int K) {
    const int tiles_m = (T + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int per_group = GM_GROUP * tiles_n;
    const int pid = blockIdx.x;
    const int first_m = (pid / per_group) * GM_GROUP;
    const int gsz = min(tiles_m - first_m, GM_GROUP);
    const int pm = first_m + (pid % per_group) % gsz, pn = (pid % per_group) / gsz;
    const int Kp = (K + 31) & ~31;
    GmProb p;
    p.xb = x;
    p.lo_plane = (size_t)((T + 127) & ~127) * Kp;
    p.W = W;
    p.S = S;
    p.W3 = nullptr;
    p.S3 = nullptr;
    p.m0 = pm * BM;
    p.n0 = pn * BN;
    p.T = T;
    p.N = N;
    p.K = K;
    return p;
}

// An extern "C" plain GEMM entry (xb, W, S, y, T, N, K) of THREADS threads running the tile
// function TILE (parenthesised: its template arguments hold commas) on gm_plain's BM × BN tile;
// both families (gemm_tc_*, gemm_wb_*) are declared through it.
#define GEMM_PLAIN_ENTRY(NAME, THREADS, BM, BN, TILE)                                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                            \
        NAME(const u16* __restrict__ x, const u8* __restrict__ W, const u8* __restrict__ S, float* __restrict__ y, int T, \
             int N, int K) {                                                                                            \
        GmEpi e = {y, nullptr, 0, 0, 0.f, nullptr};                                                                     \
        TILE(gm_plain<BM, BN>(x, W, S, T, N, K), e);                                                                    \
    }

#ifndef FS_GEMM_WGMMA_ONLY
#define GM_ENTRY(NAME, FMT, BM, BN, WM, WN, SPLIT) \
    GEMM_PLAIN_ENTRY(NAME, WM * WN * 32, BM, BN, (gm_gemm<FMT, BM, BN, WM, WN, SPLIT, 0>))

// Every GEMM entry takes (xb, W, S, y, T, N, K); S is ignored (pass 0) for f32 and bf16.
GM_ENTRY(gemm_tc_f32, 0, 128, 256, 2, 4, false)
GM_ENTRY(gemm_tc_bf16, 1, 128, 256, 2, 4, false)
GM_ENTRY(gemm_tc_fp8, 2, 128, 256, 2, 4, false)
GM_ENTRY(gemm_tc_fp4, 3, 128, 256, 2, 4, false)
GM_ENTRY(gemm_tc_f32_m, 0, 128, 128, 2, 4, false)
GM_ENTRY(gemm_tc_bf16_m, 1, 128, 128, 2, 4, false)
GM_ENTRY(gemm_tc_fp8_m, 2, 128, 128, 2, 4, false)
GM_ENTRY(gemm_tc_fp4_m, 3, 128, 128, 2, 4, false)
GM_ENTRY(gemm_tc_f32_s, 0, 64, 64, 2, 2, false)
GM_ENTRY(gemm_tc_bf16_s, 1, 64, 64, 2, 2, false)
GM_ENTRY(gemm_tc_fp8_s, 2, 64, 64, 2, 2, false)
GM_ENTRY(gemm_tc_fp4_s, 3, 64, 64, 2, 2, false)
// Split activations (x = hi + lo, two MMAs per weight fragment; exact-weight formats only).
GM_ENTRY(gemm_tc_bf16_x2, 1, 128, 256, 2, 4, true)
GM_ENTRY(gemm_tc_fp8_x2, 2, 128, 256, 2, 4, true)
GM_ENTRY(gemm_tc_fp4_x2, 3, 128, 256, 2, 4, true)
GM_ENTRY(gemm_tc_bf16_m_x2, 1, 128, 128, 2, 4, true)
GM_ENTRY(gemm_tc_fp8_m_x2, 2, 128, 128, 2, 4, true)
GM_ENTRY(gemm_tc_fp4_m_x2, 3, 128, 128, 2, 4, true)
GM_ENTRY(gemm_tc_bf16_s_x2, 1, 64, 64, 2, 2, true)
GM_ENTRY(gemm_tc_fp8_s_x2, 2, 64, 64, 2, 2, true)
GM_ENTRY(gemm_tc_fp4_s_x2, 3, 64, 64, 2, 2, true)
#endif  // FS_GEMM_WGMMA_ONLY

// ---------------------------------------------------------------------------------------------
// Grouped MoE GEMM (issue 6 §5; host glue `Gpu::moe_experts_grouped`, ops_moe.rs). The routed
// (token, slot) pairs are grouped by expert on the device (moe.cu moe_group_*): expert e owns the
// grouped rows [off_e, off_e + count_e) padded to a multiple of the tile height BM (padding rows are
// zero inputs with dst −1). `items` [n_items][2] = (expert, first grouped row) lists the non-empty
// BM-row tiles (the work queue); every block walks work units w = item · tiles_n + column tile,
// starting at blockIdx.x with stride gridDim.x — one launch covers every expert. The grid is either
// the bound on the work (one unit per block) or a persistent grid of a few blocks per SM
// (MOE_PERSISTENT); both give the same bits (each unit is computed by one block, in a fixed order).
//
//   moe_gemm_<fmt>_<bm>[_x2]_<epi>(xb, lo_plane, wtab, stab, w3tab, s3tab, items, n_items, y, hb,
//                                  h_lo, ldh, dst, N, K, limit)
//     xb    grouped activations [R, Kp] bf16 (+ the low plane at lo_plane elements with _x2)
//     wtab, stab: per-expert device addresses of W [N, K] (epi swiglu: W1 [N/2, K]) and its scales
//     w3tab, s3tab: per-expert W3 and scales (epi swiglu only; else unused)
//     epi plain:   y [R, N] f32 (grouped rows; the unfused gate or up projection)
//     epi swiglu:  gate and up in one tile (N = 2·inter), h = silu(min(g, L))·clamp(u, ±L) written as
//                  bf16 (+ low plane at h_lo) into hb [R, ldh]: the down GEMM's input, no f32 round trip
//     epi scatter: y [T·k, N] f32, row dst[r] (the (token, slot) of grouped row r; −1 = padding)
//   Tiles: bm 128 = 128 × 128 with 8 warps (2 × 4), bm 64 = 64 × 128 with 4 warps (2 × 2).
//   The per-output arithmetic is gm_gemm's, so a grouped row gives the same bits as the plain GEMM
//   of the same weights at any tile (same K steps, same MMA order).

template <int FMT, int WG, int BN, bool SPLIT, int EPI>
__device__ __forceinline__ void gb_gemm(const GmProb& P, const GmEpi& E);  // below

// Work unit w of the queue (item w / tiles_n: expert and first grouped row; column tile w % tiles_n
// of BN outputs) as a tile problem (moe_gemm, moe_wbs).
template <int FMT, int BN, int EPI>
__device__ __forceinline__ GmProb gm_moe_unit(const u16* xb, long long lo_plane, const unsigned long long* wtab, const unsigned long long* stab,
                                              const unsigned long long* w3tab, const unsigned long long* s3tab, const int* items, int tiles_n,
                                              int N, int K, int w) {
    const int it = w / tiles_n, pn = w % tiles_n;
    const int ex = items[2 * it], row0 = items[2 * it + 1];
    GmProb p;
    p.xb = xb;
    p.lo_plane = (size_t)lo_plane;
    p.W = reinterpret_cast<const u8*>(wtab[ex]);
    p.S = FMT >= 2 ? reinterpret_cast<const u8*>(stab[ex]) : nullptr;
    p.W3 = EPI == 1 ? reinterpret_cast<const u8*>(w3tab[ex]) : nullptr;
    p.S3 = EPI == 1 && FMT >= 2 ? reinterpret_cast<const u8*>(s3tab[ex]) : nullptr;
    p.m0 = row0;
    p.n0 = pn * BN;
    p.T = 0x7fffffff;
    p.N = N;
    p.K = K;
    return p;
}

// WGMMA: the tile is gb_gemm's (BM / 64 warpgroups × BN; WM, WN unused), else gm_gemm's.
template <bool WGMMA, int FMT, int BM, int BN, int WM, int WN, bool SPLIT, int EPI>
__device__ __forceinline__ void moe_gemm(const u16* xb, long long lo_plane, const unsigned long long* wtab,
                                         const unsigned long long* stab, const unsigned long long* w3tab,
                                         const unsigned long long* s3tab, const int* items, const int* n_items, float* y,
                                         u16* hb, long long h_lo, int ldh, const int* dst, int N, int K, float limit) {
    const int tiles_n = (N + BN - 1) / BN;
    const int total = *n_items * tiles_n;
    GmEpi e = {y, hb, (size_t)h_lo, ldh, limit, dst};
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
        const GmProb p = gm_moe_unit<FMT, BN, EPI>(xb, lo_plane, wtab, stab, w3tab, s3tab, items, tiles_n, N, K, w);
        if constexpr (WGMMA) gb_gemm<FMT, BM / 64, BN, SPLIT, EPI>(p, e);
        else gm_gemm<FMT, BM, BN, WM, WN, SPLIT, EPI>(p, e);
        __syncthreads();  // the next unit refills shared memory other warps may still be reading
    }
}

// An extern "C" grouped-MoE entry (the moe_gemm argument list) of THREADS threads running RUN, a
// parenthesised moe_gemm specialisation; every family (moe_gemm_*, moe_wb_*, moe_wbs_*) is declared through it.
#define MOE_ENTRY(NAME, THREADS, RUN)                                                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                              \
        NAME(const u16* __restrict__ xb, long long lo_plane, const unsigned long long* __restrict__ wtab,                  \
             const unsigned long long* __restrict__ stab, const unsigned long long* __restrict__ w3tab,                   \
             const unsigned long long* __restrict__ s3tab, const int* __restrict__ items, const int* __restrict__ n_items, \
             float* __restrict__ y, u16* __restrict__ hb, long long h_lo, int ldh, const int* __restrict__ dst, int N,    \
             int K, float limit) {                                                                                        \
        RUN(xb, lo_plane, wtab, stab, w3tab, s3tab, items, n_items, y, hb, h_lo, ldh, dst, N, K, limit);                  \
    }

#ifndef FS_GEMM_WGMMA_ONLY
#define MOE_GEMM_ENTRY(NAME, FMT, BM, WM, WN, SPLIT, EPI) \
    MOE_ENTRY(NAME, WM * WN * 32, (moe_gemm<false, FMT, BM, 128, WM, WN, SPLIT, EPI>))

#define MOE_GEMM_FMT(F, FMT)                                             \
    MOE_GEMM_ENTRY(moe_gemm_##F##_128_plain, FMT, 128, 2, 4, false, 0)   \
    MOE_GEMM_ENTRY(moe_gemm_##F##_128_swiglu, FMT, 128, 2, 4, false, 1)  \
    MOE_GEMM_ENTRY(moe_gemm_##F##_128_scatter, FMT, 128, 2, 4, false, 2) \
    MOE_GEMM_ENTRY(moe_gemm_##F##_64_plain, FMT, 64, 2, 2, false, 0)     \
    MOE_GEMM_ENTRY(moe_gemm_##F##_64_swiglu, FMT, 64, 2, 2, false, 1)    \
    MOE_GEMM_ENTRY(moe_gemm_##F##_64_scatter, FMT, 64, 2, 2, false, 2)   \
    MOE_GEMM_ENTRY(moe_gemm_##F##_128_x2_plain, FMT, 128, 2, 4, true, 0) \
    MOE_GEMM_ENTRY(moe_gemm_##F##_128_x2_swiglu, FMT, 128, 2, 4, true, 1) \
    MOE_GEMM_ENTRY(moe_gemm_##F##_128_x2_scatter, FMT, 128, 2, 4, true, 2) \
    MOE_GEMM_ENTRY(moe_gemm_##F##_64_x2_plain, FMT, 64, 2, 2, true, 0)   \
    MOE_GEMM_ENTRY(moe_gemm_##F##_64_x2_swiglu, FMT, 64, 2, 2, true, 1)  \
    MOE_GEMM_ENTRY(moe_gemm_##F##_64_x2_scatter, FMT, 64, 2, 2, true, 2)

MOE_GEMM_FMT(bf16, 1)
MOE_GEMM_FMT(fp8, 2)
MOE_GEMM_FMT(fp4, 3)
#endif  // FS_GEMM_WGMMA_ONLY

// ---------------------------------------------------------------------------------------------
// The same GEMMs on Hopper's warpgroup MMA (switch BF16_WGMMA, on by default; sm_90a only; bf16,
// FP8 and FP4 weights with K % 64 == 0 — the host checks both and otherwise uses the kernels above).
// Their entry points are emitted only when FS_GEMM_WGMMA_ONLY is defined (the loader compiles this
// file twice, as gemm.cu and gemm_wb.cu, so the halves compile in parallel), the others only when
// it is not:
//   gemm_wb_<fmt>[_w][_x2](xb, W, S, y, T, N, K)    — as gemm_tc_<fmt>[_x2], block tile 128 × 128
//                                                      (_w: 128 × 256)
//   moe_wb_<fmt>_<bm>[_x2]_<epi>(…)                 — as moe_gemm_<fmt>_<bm>[_x2]_<epi>, block tile
//                                                      64 × 128 (bm 64) or 128 × 256 (bm 128)
//   moe_wbs_fp4_128_x2_<epi>(…)                     — moe_wb_fp4_128_x2_<epi> warp-specialised
//                                                      (switch MOE_BF16_WS; after moe_wb below)
// Block: WG warpgroups (BM = 64·WG rows) × BN output columns (wgmma m64nBNk16; the wide tile reads
// each activation tile once per 256 outputs instead of per 128 — measured 15.57 vs 16.22 ms per
// Flash MoE layer at T = 8,192, 9b2e6b8 vs e96e6c8); one K step = 64 values = one 128-byte row of
// bf16. Shared memory per stage: the activation tile [BM][64] bf16 per plane (hi, and lo with _x2)
// in the 128-byte-swizzled K-major layout wgmma reads (common.cuh gw_swz, gw_desc), and the weight
// tile's raw bytes [BN][64 values]: bf16 weights are copied straight into the swizzled layout; FP8
// and FP4 ones are dequantized exactly to bf16 (the values gm_gemm's tiles hold) into one
// of two swizzled tiles, one step ahead — the conversion of step kt + 1 runs while the tensor cores
// multiply step kt (keeping one step's wgmma in flight across the loop's barrier instead, with the
// copies one step less ahead and a second barrier before each conversion, measured slower on H200:
// 20 Flash layers prefill 11,055 vs 11,222 tok/s at 8K, one MoE layer 16.02 ms at T = 8,192 in
// gpu-check at 42e1bba vs 15.57 in the MoE timings at 9b2e6b8). Per step and warpgroup: 4 × wgmma
// m64nBNk16 bf16 → f32 (8 with _x2: for each 16-wide slice the hi plane, then the lo plane, as
// gm_gemm orders its MMAs) accumulating in registers over all of K. Each output is one warpgroup's
// fixed instruction sequence (deterministic: the same bits for any grid, tile height or SwiGLU
// fusion); measured on H200 the outputs also equal gm_gemm's bit for bit (every 16-wide slice is one
// tensor-core dot product either way), which gpu-check asserts (`… Wgmma bits`, `moe_grouped …
// BF16_WGMMA=off bits`). Epilogues as gm_gemm's (gm_swiglu_store, gm_store2).

template <int FMT, int WG, int BN, bool SPLIT>
struct GbLayout {
    static constexpr int BM = 64 * WG;
    static constexpr int A_PLANE = BM * 128;
    static constexpr int A_STAGE = SPLIT ? 2 * A_PLANE : A_PLANE;
    static constexpr int RB = FMT == 1 ? 128 : FMT == 2 ? 64 : 32;  // weight bytes per row per K step
    static constexpr int B_STAGE = BN * RB;
    static constexpr int BCONV = FMT == 1 ? 0 : BN * 128;
    // 4 stages where they fit one block's 227 KB; 3 for 64-row split blocks (two fit an SM).
    static constexpr int STAGES = (WG == 1 && SPLIT) ? 3 : (1024 + 4 * (A_STAGE + B_STAGE) + 2 * BCONV <= 232448 ? 4 : 3);
    static constexpr int TOTAL = 1024 + STAGES * (A_STAGE + B_STAGE) + 2 * BCONV;
    static_assert(TOTAL <= 232448, "a block's shared memory");
};

// wgmma m64n<BN>k16 bf16 × bf16 → f32 (BN 128 or 256), both operands K-major from shared memory,
// d += a·b.
template <int BN>
__device__ __forceinline__ void gb_mma(float (&d)[BN / 2], unsigned long long da, unsigned long long db) {
    if constexpr (BN == 256) {
        GW_ASM("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, 1, 1, 1, 0, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
               : "l"(da), "l"(db));
    } else {
        GW_ASM("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, 1, 1, 0, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(da), "l"(db));
    }
}

// Eight e2m1 nibbles of w (value j in nibble j, low nibble first) as eight bf16 in four bf16x2 words,
// exact (the values of gm_e2m1_bf16): per four nibbles, one prmt picks each magnitude's bf16 high
// byte and one its low byte from 8-entry byte tables (0, 0.5, 1, 1.5, 2, 3, 4, 6 = 0x0000, 0x3F00,
// 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0), a third and fourth interleave them into pairs,
// and the nibbles' sign bits move to bits 15 and 31.
__device__ __forceinline__ void gb_e2m1x8(u32 w, u32* o) {
    const u32 m = w & 0x77777777u;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const u32 sel = (m >> (16 * h)) & 0xffffu;
        const u32 hb = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
        const u32 lb = __byte_perm(0xC0800000u, 0xC0804000u, sel);
        const u32 s = w >> (16 * h);  // sign bits of the four values at bits 3, 7, 11, 15
        o[2 * h] = __byte_perm(lb, hb, 0x5140u) | ((s << 12) & 0x8000u) | ((s << 24) & 0x80000000u);
        o[2 * h + 1] = __byte_perm(lb, hb, 0x7362u) | ((s << 4) & 0x8000u) | ((s << 16) & 0x80000000u);
    }
}

// A warpgroup tile's epilogue (gb_gemm, moe_wbs): the thread's accumulators acc[4j + e] hold row
// row_a + 8·(e >> 1), column n0 + 8j + c2 + (e & 1); stored as gm_gemm's epilogues do.
template <int BN, bool SPLIT, int EPI>
__device__ __forceinline__ void gb_epilogue(const GmEpi& E, const GmProb& P, const float (&acc)[BN / 2], int row_a, int c2) {
    const int n0 = P.n0, N = P.N;
    if constexpr (EPI == 1) {
#pragma unroll
        for (int jj = 0; jj < BN / 16; jj++) {
            const int col = (n0 >> 1) + 8 * jj + c2;
            if (2 * col >= N) continue;
#pragma unroll
            for (int h = 0; h < 2; h++)
                gm_swiglu_store<SPLIT>(E, row_a + 8 * h, col, acc[8 * jj + 2 * h], acc[8 * jj + 2 * h + 1], acc[8 * jj + 4 + 2 * h],
                                       acc[8 * jj + 4 + 2 * h + 1]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) gm_store2<EPI>(E, P.T, N, row_a + 8 * h, n0 + 8 * j + c2, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
}

template <int FMT, int WG, int BN, bool SPLIT, int EPI>
__device__ __forceinline__ void gb_gemm(const GmProb& P, const GmEpi& E) {
    typedef GbLayout<FMT, WG, BN, SPLIT> L;
    constexpr int NT = 128 * WG, ST = L::STAGES, BM = L::BM;
    constexpr bool DIRECT = FMT == 1;
    constexpr int CPR = L::RB / 16;                   // 16-byte weight copies per row per step
    constexpr int UNITS = DIRECT ? 1 : BN * 4 / NT;   // 16-value dequant units per thread per step
    static_assert(FMT >= 1 && FMT <= 3, "bf16, FP8 or FP4 weights");
    static_assert(BN == 128 || BN == 256, "wgmma n128 or n256");
    static_assert((BM * 8) % NT == 0 && (BN * CPR) % NT == 0, "copies must divide among the threads");

    extern __shared__ __align__(16) u8 gb_sh[];
    {
        u32 dsz;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsz));
        if (dsz < (u32)L::TOTAL || (P.K & 63) != 0) __trap();  // K steps of 64, rows of K values
    }
    const u32 raw0 = gm_smem(gb_sh);
    const u32 base = (raw0 + 1023u) & ~1023u;  // swizzle atoms on 1 KB boundaries
    u8* gbase = gb_sh + (base - raw0);
    const u32 as_base = base, bs_base = base + ST * L::A_STAGE, bc_base = bs_base + ST * L::B_STAGE;
    const u8* bs_gen = gbase + ST * L::A_STAGE;
    u8* bconv = gbase + ST * (L::A_STAGE + L::B_STAGE);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3;
    const int m0 = P.m0, n0 = P.n0, N = P.N, K = P.K;
    const int KT = K >> 6;
    const size_t wrow = FMT == 1 ? (size_t)K * 2 : FMT == 2 ? (size_t)K : (size_t)K / 2;
    const int sk = (K + 127) >> 7;

    // Copies of K step kt into ring slot kt % ST (always commits a group, empty past the end).
    auto issue = [&](int kt) {
        if (kt < KT) {
            const int slot = kt % ST;
            const u32 a_dst = as_base + slot * L::A_STAGE;
#pragma unroll
            for (int i = 0; i < BM * 8 / NT; i++) {
                const int q = tid + i * NT, r = q >> 3, c = q & 7;
                const u16* src = P.xb + (size_t)(m0 + r) * K + kt * 64 + c * 8;
                gm_cp16(a_dst + gw_swz(r, c), src, true);
                if (SPLIT) gm_cp16(a_dst + L::A_PLANE + gw_swz(r, c), src + P.lo_plane, true);
            }
            const u32 b_dst = bs_base + slot * L::B_STAGE;
#pragma unroll
            for (int i = 0; i < BN * CPR / NT; i++) {
                const int q = tid + i * NT, r = q / CPR, c = q % CPR;
                const bool ok = n0 + r < N;
                const u8* src = ok ? fused_wrow<EPI>(P, n0 + r, wrow) + (size_t)kt * L::RB + c * 16 : P.W;
                gm_cp16(b_dst + (DIRECT ? gw_swz(r, c) : (u32)(r * L::RB + c * 16)), src, ok);
            }
        }
        gm_commit();
    };

    // Scale byte of dequant unit u (row q / 4, values 16·(q % 4) ..) at K step kt (127 = 1.0 outside).
    auto scale_of = [&](int kt, int u) -> u32 {
        const int q = tid + u * NT, r = q >> 2, c = q & 3;
        int n = n0 + r;
        const int k = kt * 64 + c * 16;
        if (DIRECT || kt >= KT || n >= N) return 127u;
        return gm_scale_byte<FMT, EPI>(P, n, k, sk);
    };

    // Raw weights of K step kt → swizzled bf16 tile kt & 1.
    auto convert = [&](int kt, const u32* sc) {
        const u8* raw = bs_gen + (kt % ST) * L::B_STAGE;
        u8* dst = bconv + (kt & 1) * L::BCONV;
#pragma unroll
        for (int u = 0; u < UNITS; u++) {
            const int q = tid + u * NT, r = q >> 2, c = q & 3;
            u32 o[8];
            if (FMT == 2) {
                gm_fp8x16_bf16(*reinterpret_cast<const uint4*>(raw + r * 64 + c * 16), sc[u], o);
            } else if (FMT == 3) {
                const uint2 v = *reinterpret_cast<const uint2*>(raw + r * 32 + c * 8);
                u32 f = gm_e8m0_bf16(sc[u]);
                f |= f << 16;
                gb_e2m1x8(v.x, o);
                gb_e2m1x8(v.y, o + 4);
#pragma unroll
                for (int i = 0; i < 8; i++) o[i] = gm_mul2(o[i], f);
            }
            *reinterpret_cast<uint4*>(dst + gw_swz(r, 2 * c)) = make_uint4(o[0], o[1], o[2], o[3]);
            *reinterpret_cast<uint4*>(dst + gw_swz(r, 2 * c + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
        }
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
    u32 sreg[UNITS];  // scales of the step converted next

    conv_pipeline_start<ST, UNITS, DIRECT>(issue, scale_of, convert, sreg);

    for (int kt = 0; kt < KT; kt++) {
        if (DIRECT) gm_wait<ST - 2>();  // step kt has landed
        else gm_wait<ST - 3>();         // step kt + 1 has landed too (its weights are converted below)
        gw_fence_proxy();               // this thread's copies and conversions → the async proxy
        __syncthreads();
        issue(kt + ST - 1);
        const u32 a_tile = as_base + (kt % ST) * L::A_STAGE + wg * 64 * 128;
        const u32 b_tile = DIRECT ? bs_base + (kt % ST) * L::B_STAGE : bc_base + (kt & 1) * L::BCONV;
        const unsigned long long da = gw_desc(a_tile), db = gw_desc(b_tile);
        gw_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            gb_mma<BN>(acc, da + 2 * kk, db + 2 * kk);
            if (SPLIT) gb_mma<BN>(acc, gw_desc(a_tile + L::A_PLANE) + 2 * kk, db + 2 * kk);
        }
        gw_commit();
        if (!DIRECT && kt + 1 < KT) {
            convert(kt + 1, sreg);
#pragma unroll
            for (int u = 0; u < UNITS; u++) sreg[u] = scale_of(kt + 2, u);
        }
        gw_wait0();
    }
    gm_wait<0>();
    gb_epilogue<BN, SPLIT, EPI>(E, P, acc, m0 + wg * 64 + wq * 16 + (lane >> 2), (lane & 3) * 2);
}

#ifdef FS_GEMM_WGMMA_ONLY
#define GB_ENTRY(NAME, FMT, BN, SPLIT) GEMM_PLAIN_ENTRY(NAME, 256, 128, BN, (gb_gemm<FMT, 2, BN, SPLIT, 0>))

// gemm_wb_<fmt>[_x2]: 128 × 128 tiles; gemm_wb_<fmt>_w[_x2]: 128 × 256 (half the activation reads
// per output).
GB_ENTRY(gemm_wb_bf16, 1, 128, false)
GB_ENTRY(gemm_wb_fp8, 2, 128, false)
GB_ENTRY(gemm_wb_fp4, 3, 128, false)
GB_ENTRY(gemm_wb_bf16_x2, 1, 128, true)
GB_ENTRY(gemm_wb_fp8_x2, 2, 128, true)
GB_ENTRY(gemm_wb_fp4_x2, 3, 128, true)
GB_ENTRY(gemm_wb_bf16_w, 1, 256, false)
GB_ENTRY(gemm_wb_fp8_w, 2, 256, false)
GB_ENTRY(gemm_wb_fp4_w, 3, 256, false)
GB_ENTRY(gemm_wb_bf16_w_x2, 1, 256, true)
GB_ENTRY(gemm_wb_fp8_w_x2, 2, 256, true)
GB_ENTRY(gemm_wb_fp4_w_x2, 3, 256, true)

#define MOE_WB_ENTRY(NAME, FMT, BM, SPLIT, EPI) MOE_ENTRY(NAME, BM * 2, (moe_gemm<true, FMT, BM, BM * 2, 0, 0, SPLIT, EPI>))

#define MOE_WB_FMT(F, FMT)                                             \
    MOE_WB_ENTRY(moe_wb_##F##_128_plain, FMT, 128, false, 0)          \
    MOE_WB_ENTRY(moe_wb_##F##_128_swiglu, FMT, 128, false, 1)         \
    MOE_WB_ENTRY(moe_wb_##F##_128_scatter, FMT, 128, false, 2)        \
    MOE_WB_ENTRY(moe_wb_##F##_64_plain, FMT, 64, false, 0)            \
    MOE_WB_ENTRY(moe_wb_##F##_64_swiglu, FMT, 64, false, 1)           \
    MOE_WB_ENTRY(moe_wb_##F##_64_scatter, FMT, 64, false, 2)          \
    MOE_WB_ENTRY(moe_wb_##F##_128_x2_plain, FMT, 128, true, 0)        \
    MOE_WB_ENTRY(moe_wb_##F##_128_x2_swiglu, FMT, 128, true, 1)       \
    MOE_WB_ENTRY(moe_wb_##F##_128_x2_scatter, FMT, 128, true, 2)      \
    MOE_WB_ENTRY(moe_wb_##F##_64_x2_plain, FMT, 64, true, 0)          \
    MOE_WB_ENTRY(moe_wb_##F##_64_x2_swiglu, FMT, 64, true, 1)         \
    MOE_WB_ENTRY(moe_wb_##F##_64_x2_scatter, FMT, 64, true, 2)

MOE_WB_FMT(bf16, 1)
MOE_WB_FMT(fp8, 2)
MOE_WB_FMT(fp4, 3)

// ---------------------------------------------------------------------------------------------
// moe_wbs_fp4_128_x2_<epi>(…): the grouped MoE of moe_wb_fp4_128_x2_<epi> — FP4 experts, split
// activations, 128 × 256 tiles; the exact default's routed experts — with the same arguments and
// the same outputs bit for bit (each warpgroup issues the same wgmma m64n256k16 sequence per K step:
// for each 16-wide slice hi, then lo, on the same bf16 weight values — gbs_e2m1x2 below computes
// them another way, exactly), warp-specialised (switch MOE_BF16_WS). Block of GBS_THREADS = 384:
// warpgroups 0 and 1 multiply (64 token rows each), warpgroup 2 produces; at one block per SM every
// thread may hold 168 registers, enough for the 128 accumulators of m64n256 (no setmaxnreg: a
// 512-thread block would leave 128 per thread at compile time, too few for that instruction).
// Per K step of 64 values the producers copy both activation planes and
// the packed FP4 weight rows of the 256 outputs into a ring of GbsLayout::STAGES stages with
// cp.async, load the rows' scale bytes with plain loads, and one step later (GBS_LAG) convert the
// weights to the swizzled bf16 tile wgmma reads, fence.proxy.async and arrive on the stage's full
// mbarrier (one arrival per producer thread). Each multiply warp waits on it; its warpgroup issues
// the 8 MMAs, waits for them and releases the stage on the empty mbarrier (one arrival per warp;
// the two warpgroups share the tensor cores, so one's MMAs may run while the other waits). Accumulators stay in registers
// over all of K (no promotion: bf16 products are exact in f32). No block barrier after the start;
// the ring runs across the block's units, so the next unit's copies overlap this one's epilogue.
// Learned from the PTX ISA (mbarrier, wgmma, setmaxnreg, proxy fences) and DeepGEMM's
// producer/consumer design; the code is ours (the same structure as gemm_q8.cu moe_ws). Measured
// on H200 (bench/moe_wbs_variants_h200.log): one Flash MoE layer at T = 8,192 13.13 ms vs 15.56 with
// moe_wb; the multiply warps then wait on their own MMAs in half of their stall samples (their
// shared-memory operands: the split reads each weight slice twice).
#define GBS_PRODUCERS 128
#define GBS_THREADS (256 + GBS_PRODUCERS)
// Steps between a stage's copies and its conversion. With 3 stages a lag of 1 lets the producers
// convert step kt + 1 while the tensor cores multiply step kt with a step of copy latency hidden
// (2 would wait for step kt's release before converting kt + 1; 0 would hide none).
#define GBS_LAG 1

// One stage: A hi [128][64] bf16 and A lo [128][64] (swizzled), the converted B [256][64] bf16
// (swizzled), the packed FP4 B [256][32]; 72 KB, so 3 stages fit. Then the full and empty barriers.
struct GbsLayout {
    static constexpr int STAGES = 3;
    static constexpr int A = 0, A_LO = 16384, BC = 32768, BR = 65536;
    static constexpr int STAGE = 73728;  // a multiple of 1024 (swizzle atoms)
    static constexpr int BARS = STAGES * STAGE;
    static constexpr int TOTAL = 1024 + BARS + 2 * STAGES * 8;
    static_assert(TOTAL <= 232448, "a block's shared memory");
};

// Two e2m1 nibbles (byte b: the even value in the low nibble) as a bf16x2 word of value · 2^-126,
// exact: each magnitude's 3 bits (e, m) become the bf16 exponent's low two bits and the mantissa's
// top bit — 2^(e−127)·(1 + m/2) for e ≥ 1, the subnormal m·2^-127 for e = 0, i.e. the e2m1 value
// 2^(e−1)·(1 + m/2) (e = 0: m/2) times 2^-126 — and the signs bits 15 and 31. One multiply places
// both magnitudes (b·2^6 + b·2^18: the copies do not overlap, so nothing carries; the mask keeps
// the wanted ones), a second both signs (b·2^12 + b·2^24). The same bf16 bits as gb_e2m1x8 followed
// by the scale multiply for every byte and scale (ops_moe.rs wbs_fp4_conversion_matches_gb_gemm).
__device__ __forceinline__ u32 gbs_e2m1x2(u32 b) { return ((b * 0x00040040u) & 0x01C001C0u) | ((b * 0x01001000u) & 0x80008000u); }

template <int EPI>
__device__ __forceinline__ void moe_wbs(const u16* xb, long long lo_plane, const unsigned long long* wtab, const unsigned long long* stab,
                                        const unsigned long long* w3tab, const unsigned long long* s3tab, const int* items, const int* n_items,
                                        float* y, u16* hb, long long h_lo, int ldh, const int* dst, int N, int K, float limit) {
    typedef GbsLayout L;
    constexpr int ST = L::STAGES, BN = 256;
    extern __shared__ __align__(16) u8 gbs_sh[];
    // Without its producers the ring would never fill; K steps of 64 values.
    if (blockDim.x != GBS_THREADS || (K & 63) != 0) __trap();
    u8* gbase;
    const u32 base = gw_smem_base(gbs_sh, L::TOTAL, gbase);
    const u32 full0 = base + L::BARS, empty0 = full0 + ST * 8;
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            gws_bar_init(full0 + 8 * s, GBS_PRODUCERS);
            gws_bar_init(empty0 + 8 * s, 8);
        }
    }
    __syncthreads();

    const int tiles_n = (N + BN - 1) / BN;
    const int total = *n_items * tiles_n;
    const int KT = K >> 6;
    auto prob = [&](int w) { return gm_moe_unit<3, BN, EPI>(xb, lo_plane, wtab, stab, w3tab, s3tab, items, tiles_n, N, K, w); };

    if (tid >= 256) {
        // The producer warpgroup.
        const int p = tid - 256;
        constexpr int NP = GBS_PRODUCERS;
        static_assert(GBS_LAG == 1, "the scale bytes are held in registers for exactly one step");
        static_assert(NP == 128, "copy and conversion assignment below");
        const int sg = K >> 5;        // scale bytes per weight row
        const size_t wrow = K >> 1;   // packed bytes per weight row
        // This thread's weight units (fused column rows r_u = p / 2 + 64 u, half h = p % 2 of the
        // step's 64 values: 16 packed bytes, one scale byte): copied, scale-loaded and converted by
        // the same thread, so only the full barrier orders them for the multiply warps.
        const int h = p & 1;
        int j = 0, jc = 0;    // steps copied, steps converted and marked full
        GwsRing<ST> cp, cv;   // their ring positions
        u32 pend[4] = {127u, 127u, 127u, 127u};  // scale bytes of the last step copied (units 0 … 3)
        // Converts step jc (copied one step ago; its scale bytes are pend) and marks it full.
        auto finish = [&](bool drain) {
            if (drain) gm_wait<0>();
            else gm_wait<GBS_LAG>();
            const u8* st = gbase + cv.s * L::STAGE;
            u8* bc = gbase + cv.s * L::STAGE + L::BC;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int r = (p >> 1) + 64 * u;
                const uint4 v = *reinterpret_cast<const uint4*>(st + L::BR + r * 32 + h * 16);
                const u32 vw[4] = {v.x, v.y, v.z, v.w};
                // gbs_e2m1x2 gives value · 2^-126; times 2^126 · 2^(s−127) = 2^(s−1), one multiply
                // while 2^(s−1) is a bf16 (s ≤ 128: groups whose largest value is at most 12),
                // else 2^126 (exact) and then gb_gemm's own multiply by 2^(s−127) (the same
                // operation, so the same inf / NaN).
                // (The second multiply is a branch taken by the whole warp or skipped by it: the
                // predicated form would issue it for every value.)
                const u32 sc = pend[u];
                const bool one = sc <= 128u;
                u32 f = one ? (sc + 126u) << 7 : 0x7E80u;
                f |= f << 16;
                u32 o[16];
#pragma unroll
                for (int i = 0; i < 16; i++) o[i] = gm_mul2(gbs_e2m1x2(__byte_perm(vw[i >> 2], 0u, 0x4440u | (i & 3))), f);
                if (!__all_sync(0xffffffffu, one)) {
                    u32 g = gm_e8m0_bf16(sc);
                    g |= g << 16;
                    if (!one) {
#pragma unroll
                        for (int i = 0; i < 16; i++) o[i] = gm_mul2(o[i], g);
                    }
                }
#pragma unroll
                for (int i = 0; i < 4; i++)
                    *reinterpret_cast<uint4*>(bc + gw_swz(r, 4 * h + i)) = make_uint4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
            }
            gw_fence_proxy();
            gws_arrive(full0 + 8 * cv.s);
            jc++;
            cv.next();
        };
        for (int w = blockIdx.x; w < total; w += gridDim.x) {
            const GmProb P = prob(w);
            // Activation copies: rows p / 8 + 16 i, chunk p % 8, both planes.
            const u16* a_src = P.xb + (size_t)(P.m0 + (p >> 3)) * K + (p & 7) * 8;
            const u32 a_off = gw_swz(p >> 3, p & 7);
            // Weight rows past N copy zeros with scale byte 127 (1.0), as gb_gemm's.
            const u8* b_src[4];
            const u8* s_src[4];
            bool b_ok[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int n = P.n0 + (p >> 1) + 64 * u;
                b_ok[u] = n < N;
                b_src[u] = b_ok[u] ? fused_wrow<EPI>(P, n, wrow) + h * 16 : P.W;
                s_src[u] = P.S;
                if (b_ok[u]) {
                    const u8* s;
                    const int sn = fused_srow<EPI>(P, n, s);
                    s_src[u] = s + (size_t)sn * sg + h;
                }
            }
            for (int kt = 0; kt < KT; kt++) {
                const int s = cp.s;
                gws_wait(empty0 + 8 * s, cp.ph ^ 1);
                const u32 sb = base + s * L::STAGE;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const u16* src = a_src + (size_t)i * 16 * K + kt * 64;
                    gm_cp16(sb + L::A + a_off + i * 16 * 128, src, true);
                    gm_cp16(sb + L::A_LO + a_off + i * 16 * 128, src + P.lo_plane, true);
                }
#pragma unroll
                for (int u = 0; u < 4; u++) gm_cp16(sb + L::BR + ((p >> 1) + 64 * u) * 32 + h * 16, b_src[u] + (size_t)kt * 32, b_ok[u]);
                gm_commit();
                j++;
                cp.next();
                // The previous step's conversion uses pend (loaded a step ago) before it takes this
                // step's scale bytes.
                if (j - jc > GBS_LAG) finish(false);
#pragma unroll
                for (int u = 0; u < 4; u++) pend[u] = b_ok[u] ? (u32)__ldg(s_src[u] + 2 * kt) : 127u;
            }
        }
        while (jc < j) finish(true);
        return;
    }

    // Multiply warpgroups 0 and 1.
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const GmEpi E = {y, hb, (size_t)h_lo, ldh, limit, dst};
    GwsRing<ST> ring;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
        const GmProb P = prob(w);
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
        for (int kt = 0; kt < KT; kt++, ring.next()) {
            const u32 sb = base + ring.s * L::STAGE;
            gws_wait(full0 + 8 * ring.s, ring.ph);
            __syncwarp();  // converged for the .aligned wgmma instructions
            const unsigned long long da = gw_desc(sb + L::A + wg * 64 * 128), dl = gw_desc(sb + L::A_LO + wg * 64 * 128), db = gw_desc(sb + L::BC);
            gw_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                gb_mma<BN>(acc, da + 2 * kk, db + 2 * kk);
                gb_mma<BN>(acc, dl + 2 * kk, db + 2 * kk);
            }
            gw_commit();
            gw_wait0();
            __syncwarp();
            if (lane == 0) gws_arrive(empty0 + 8 * ring.s);  // the stage is free again
        }
        gw_fence_regs(acc);
        gb_epilogue<BN, true, EPI>(E, P, acc, P.m0 + wg * 64 + wq * 16 + (lane >> 2), (lane & 3) * 2);
    }
}

#define MOE_WBS_ENTRY(NAME, EPI) MOE_ENTRY(NAME, GBS_THREADS, moe_wbs<EPI>)

MOE_WBS_ENTRY(moe_wbs_fp4_128_x2_plain, 0)
MOE_WBS_ENTRY(moe_wbs_fp4_128_x2_swiglu, 1)
MOE_WBS_ENTRY(moe_wbs_fp4_128_x2_scatter, 2)
#endif  // FS_GEMM_WGMMA_ONLY
