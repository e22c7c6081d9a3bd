// common.cuh — header-free helpers shared by every flashseek kernel (prepended by the loader,
// crates/engine/src/cuda/nvrtc.rs). Plain CUDA C++: no CUDA headers, so NVRTC needs no include
// paths and a HIP port stays possible.
//
// Decoders follow spec §6: bf16 = the high half of an f32; FP8 e4m3fn (bias 7, no inf, 0x7F/0xFF
// NaN, subnormals m·2^-9); ue8m0 scale byte e = 2^(e-127) (0xFF NaN); FP4 e2m1 nibble: low 3 bits
// index [0, .5, 1, 1.5, 2, 3, 4, 6], bit 3 sign.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float fs_bf16(u16 b) { return __uint_as_float(((u32)b) << 16); }
// Four bf16 values packed low half first (an 8-byte load of bf16 bits) widened exactly to f32.
__device__ __forceinline__ float4 fs_bf16x4(uint2 w) {
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
}

__device__ __forceinline__ float fs_e8m0(u8 e) {
    if (e == 0) return __uint_as_float(0x00400000u);  // 2^-127 (subnormal)
    if (e == 255) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(((u32)e) << 23);
}

// fs_e8m0 without branches (selects), for a byte in the low 8 bits of e: the same values.
__device__ __forceinline__ float fs_e8m0_sel(u32 e) {
    u32 b = e << 23;
    b = e == 0u ? 0x00400000u : b;
    b = e == 255u ? 0x7fc00000u : b;
    return __uint_as_float(b);
}

__device__ __forceinline__ float fs_e4m3(u8 v) {
    u32 s = v >> 7, e = (v >> 3) & 15u, m = v & 7u;
    float r;
    if (e == 15u && m == 7u) r = __uint_as_float(0x7fc00000u);
    else if (e == 0u) r = (float)m * 0.001953125f;          // m · 2^-9
    else r = __uint_as_float(((e + 120u) << 23) | (m << 20)); // (1 + m/8) · 2^(e-7)
    return s ? -r : r;
}

__device__ __forceinline__ float fs_e2m1(u32 nib) {
    const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    float r = mag[nib & 7u];
    return (nib & 8u) ? -r : r;
}

// Two f32 values to e4m3 bytes (lo in the low byte), round to nearest even, saturating at ±448.
__device__ __forceinline__ u32 gq_e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return (u32)r;
}

// 2^e as f32 for e in [-126, 127].
__device__ __forceinline__ float gq_pow2(int e) { return __uint_as_float((u32)(e + 127) << 23); }

// DeepSeek's activation quantisation of one 128-value block (spec §6, §10.1; OFF-K act_quant),
// warp-collective: lane l holds values 4 l … 4 l + 3 in v. amax = max(max|x|, 1e-4), s =
// 2^ceil(log2(amax / 448)) by the official bit trick on the f32 quotient (exponent clamped to
// [-126, 127]); returns the four e4m3 bytes of e4m3(v / s) (v[0] in the low byte) and s. The one
// definition act_quant_fp8 (gemm_q8.cu), the fused gemvs (linear.cu linear_*_q) and the FP8
// attention output (attention.cu atc_epilogue_fp8, switch WO_A_FP8) share, through fs_q8_exp.
// fs_q8_exp: the exponent e of that scale s = 2^e from a block's largest magnitude (before the
// 1e-4 floor).
__device__ __forceinline__ int fs_q8_exp(float amax) {
    amax = fmaxf(amax, 1e-4f);
    const u32 qb = __float_as_uint(__fdiv_rn(amax, 448.f));
    const int e = (int)((qb >> 23) & 0xffu) - 127 + ((qb & 0x7fffffu) != 0u);
    return min(max(e, -126), 127);
}

__device__ __forceinline__ u32 fs_q8_quant4(const float (&v)[4], float& s) {
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int e = fs_q8_exp(amax);
    s = gq_pow2(e);
    const float inv = gq_pow2(-e);
    return gq_e4m3x2(v[0] * inv, v[1] * inv) | (gq_e4m3x2(v[2] * inv, v[3] * inv) << 16);
}

// SwiGLU with the clamps of spec §4.11: silu(min(g, L)) · clamp(u, ±L), a NaN u kept (the CPU's
// order of operations; every MoE path uses this one).
__device__ __forceinline__ float fs_swiglu(float g, float u, float limit) {
    const float gv = fminf(g, limit);
    const float uc = u != u ? u : fminf(fmaxf(u, -limit), limit);
    const float sg = 1.f / (1.f + expf(-gv));
    return (gv * sg) * uc;
}

// The rotation of one interleaved RoPE pair (a, b) by an angle with cosine c and (signed) sine s:
// the expression every RoPE in the kernels shares so that they round alike.
__device__ __forceinline__ void fs_rope_rot(float& a, float& b, float c, float s) {
    const float a0 = a, b0 = b;
    a = a0 * c - b0 * s;
    b = b0 * c + a0 * s;
}

// One interleaved RoPE pair (spec §3.2): (a, b) rotated by angle ang, the sine times sign (−1: the
// inverse); rope_f32 and rms_norm_rows_f32 use it.
__device__ __forceinline__ void fs_rope_pair(float& a, float& b, float ang, float sign) {
    fs_rope_rot(a, b, cosf(ang), sign * sinf(ang));
}

// The squares of a float4 summed pairwise, (x² + y²) + (z² + w²): rms_norm_rows_f32's per-float4
// term, shared with the attention kernel's fused q norm (MLA_FUSED_Q_NORM) so both sum alike.
__device__ __forceinline__ float fs_sq4(float4 v) { return (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w); }

__device__ __forceinline__ float fs_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// s summed over the block of nwarps warps (blockDim.x / 32): each warp's fs_warp_sum, then warp 0
// sums the warps' totals in warp order; every thread gets the total. red holds ≥ 32 floats, and
// every thread of the block must call it (it synchronises). rms_norm_f32 and hc_pre_norm_f32 share
// it, so their norms sum alike.
__device__ __forceinline__ float fs_block_sum(float s, float* red, unsigned nwarps) {
    s = fs_warp_sum(s);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < nwarps ? red[threadIdx.x] : 0.f;
        v = fs_warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    return red[0];
}

// Tensor-core and async-copy helpers (gemm.cu, attention.cu): shared-memory addresses, cp.async,
// ldmatrix (plain and transposed), mma.sync m16n8k16 bf16 → f32, f32 pairs → bf16x2.
__device__ __forceinline__ u32 gm_smem(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void gm_cp16(u32 dst, const void* src, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

__device__ __forceinline__ void gm_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void gm_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void gm_ldsm4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void gm_mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// mma.sync m16n8k32 e4m3 × e4m3 → f32 (gemm_q8.cu, indexer.cu): A = 4 regs of 4 e4m3 (rows g, g + 8;
// bytes 4·(lane % 4) and 16 + 4·(lane % 4)), B = 2 regs (column g, the same bytes), C/D as m16n8k16.
__device__ __forceinline__ void gm_mma_e4m3(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 → bf16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 gm_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The lo half of the split bf16 of two f32 values a, b whose hi half is h = gm_bf16x2(a, b):
// bf16x2(a − hi_a, b − hi_b) (the differences are exact in f32), so that x ≈ hi + lo with about 16
// significant bits — the second plane of every split-bf16 operand.
__device__ __forceinline__ u32 gm_bf16x2_lo(float a, float b, u32 h) {
    return gm_bf16x2(a - __uint_as_float(h << 16), b - __uint_as_float(h & 0xffff0000u));
}

__device__ __forceinline__ void gm_ldsm4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// Hopper warpgroup MMA (wgmma) basics, for gemm_q8.cu (FP8) and gemm.cu (bf16). Learned from the PTX
// ISA (wgmma, matrix descriptors, swizzling modes) and DeepSeek's DeepGEMM design; the code is ours.
//
// wgmma exists only on sm_90a: elsewhere (sm_100, sm_120, …) these compile to a trap and the host
// never picks the wgmma kernels (gemm_q8.cu's w8 and gemm.cu's wb families require sm_90a), so the
// files still build there.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GW_ASM(...) asm volatile(__VA_ARGS__)
#else
#define GW_ASM(...) __trap()
#endif

__device__ __forceinline__ void gw_fence_proxy() { GW_ASM("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void gw_fence() { GW_ASM("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void gw_commit() { GW_ASM("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void gw_wait0() { GW_ASM("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void gw_wait1() { GW_ASM("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// Matrix descriptor of a K-major 128-byte-swizzled tile at shared address a: start a >> 4, leading
// offset 1 (unused when swizzled), stride 1024 bytes between 8-row atoms, swizzle mode 1 (128 B).
__device__ __forceinline__ unsigned long long gw_desc(u32 a) {
    return (unsigned long long)((a & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// gw_desc's low word (start address >> 4, leading offset 1); its high word is the constant
// 0x40000040, which the *_lo wgmma wrappers (gemm_q8.cu gw_mma_lo, indexer.cu iwg_mma8_lo) write into
// the instruction, so that the compiler keeps warp-uniform descriptors in uniform registers.
__device__ __forceinline__ u32 gw_desc_lo(u32 a) { return ((a & 0x3FFFFu) >> 4) | (1u << 16); }

// Byte offset of 16-byte chunk c of row r in a swizzled tile of 128-byte rows.
__device__ __forceinline__ u32 gw_swz(int r, int c) { return (u32)(r * 128 + ((c ^ (r & 7)) << 4)); }

// The 1 KB-aligned start of a block's dynamic shared memory (swizzle atoms) as a shared address
// (returned) and a generic pointer (gbase); traps when the launch gave less than `total` bytes.
__device__ __forceinline__ u32 gw_smem_base(u8* sh, int total, u8*& gbase) {
    u32 dsz;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsz));
    if (dsz < (u32)total) __trap();
    const u32 raw0 = gm_smem(sh);
    const u32 base = (raw0 + 1023u) & ~1023u;
    gbase = sh + (base - raw0);
    return base;
}

// Keeps the compiler from reading wgmma results before the wait that makes them valid (registers
// written asynchronously are invisible to it).
template <int N>
__device__ __forceinline__ void gw_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// mbarriers (shared::cta): init with an arrival count, arrive, and wait for a phase's completion
// (warp-specialised kernels: gemm_q8.cu moe_ws, gemm.cu moe_wbs).
__device__ __forceinline__ void gws_bar_init(u32 bar, u32 count) {
    GW_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void gws_arrive(u32 bar) {
    GW_ASM("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` of barrier bar has completed.
__device__ __forceinline__ void gws_wait(u32 bar, u32 parity) {
    GW_ASM("{\n.reg .pred p;\nGWS_WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra GWS_WAIT_%=;\n}\n" ::"r"(bar), "r"(parity)
           : "memory");
}

// Makes the barriers just initialised visible to the async proxy (cp.async.bulk's transaction
// counts) before any thread uses them.
__device__ __forceinline__ void gws_bar_init_fence() { GW_ASM("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One cp.async.bulk of BYTES (a multiple of 16) from global src to shared dst, completing on
// mbarrier bar, whose current phase must expect the bytes (mbarrier.arrive.expect_tx) (gemm_q8.cu
// moe_wt, indexer.cu indexer_topk_wgmma).
template <int BYTES>
__device__ __forceinline__ void gws_bulk_copy(u32 dst, const void* src, u32 bar) {
    GW_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "n"(BYTES), "r"(bar) : "memory");
}

// A position in the ring: stage and the parity of its round (the phase its barriers are in).
template <int ST>
struct GwsRing {
    int s = 0, ph = 0;
    __device__ __forceinline__ void next() {
        if (++s == ST) {
            s = 0;
            ph ^= 1;
        }
    }
};

// Start of a ring of ST copy stages whose weight tiles are converted in shared memory one step
// ahead (gemm_q8.cu's FP4 → e4m3, gemm.cu's wgmma FP8/FP4 → bf16; DIRECT = nothing to convert):
// stages 0 … ST−2 issued, step 0 converted, sreg = the scale words of step 1.
template <int ST, int UNITS, bool DIRECT, class Issue, class ScaleWord, class Convert>
__device__ __forceinline__ void conv_pipeline_start(Issue& issue, ScaleWord& scale_word, Convert& convert, u32 (&sreg)[UNITS]) {
#pragma unroll
    for (int s = 0; s < ST - 1; s++) issue(s);
    if (!DIRECT) {
        u32 s0[UNITS];
#pragma unroll
        for (int u = 0; u < UNITS; u++) {
            s0[u] = scale_word(0, u);
            sreg[u] = scale_word(1, u);
        }
        gm_wait<ST - 2>();
        __syncthreads();
        convert(0, s0);
    }
}

// Output column n of a GEMM tile → its weight row (every GEMM family: gemm.cu's GmProb, gemm_q8.cu's
// GqProb, both with W, S, W3, S3). EPI 1 (fused SwiGLU) interleaves the gate W and up W3 rows in
// blocks of 8 columns; other epilogues read W row n. Rows of `wrow` bytes.
template <int EPI, class Prob>
__device__ __forceinline__ const u8* fused_wrow(const Prob& P, int n, size_t wrow) {
    if (EPI == 1) return ((n >> 3) & 1 ? P.W3 : P.W) + (size_t)((n >> 4) * 8 + (n & 7)) * wrow;
    return P.W + (size_t)n * wrow;
}

// The same column's scale base (*s: S, or S3 for an up row) and its row in that matrix.
template <int EPI, class Prob>
__device__ __forceinline__ int fused_srow(const Prob& P, int n, const u8*& s) {
    s = P.S;
    if (EPI == 1) {
        s = (n >> 3) & 1 ? P.S3 : P.S;
        n = (n >> 4) * 8 + (n & 7);
    }
    return n;
}
