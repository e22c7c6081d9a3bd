// linear.cu — y[t, n] = Σ_k x[t, k] · W[n, k] for small token counts (decode and short chunks),
// with the weight dequantized in-kernel (spec §6). One warp per output row n and per tile of up to
// TT tokens; the weight row is streamed once per tile with 16-byte loads; f32 accumulation per
// lane, then a fixed butterfly sum (deterministic).
//
// Inputs: x [T, K] f32 row-major; y [T, N] f32. Weight layouts (row-major, rows = outputs):
//   linear_f32:  W f32 [N, K]
//   linear_bf16: W bf16 bits [N, K]
//   linear_fp8:  W e4m3 [N, K] + ue8m0 scales [ceil(N/128), ceil(K/128)]   (K % 16 == 0)
//   linear_fp4:  W packed [N, K/2] (low nibble = even k) + ue8m0 scales [N, K/32]   (K % 32 == 0)
// Launch: grid (ceil(N / 8), ceil(T / TT)), block 256 (8 warps = 8 rows).

#define TT 8

template <int PER, typename Load>
__device__ __forceinline__ void fs_linear_rows(const float* __restrict__ x, float* __restrict__ y, int T, int N,
                                               int K, Load load) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * 8 + warp;
    int t0 = blockIdx.y * TT;
    if (n >= N) return;
    int tn = min(TT, T - t0);
    float acc[TT];
#pragma unroll
    for (int j = 0; j < TT; j++) acc[j] = 0.f;
    float w[PER];
    for (int k0 = lane * PER; k0 < K; k0 += 32 * PER) {
        load(n, k0, w);
#pragma unroll
        for (int j = 0; j < TT; j++) {
            if (j < tn) {
                const float* xr = x + (size_t)(t0 + j) * K + k0;
                float s = 0.f;
#pragma unroll
                for (int q = 0; q < PER; q++) s += w[q] * xr[q];
                acc[j] += s;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < TT; j++) {
        float v = fs_warp_sum(acc[j]);
        if (lane == 0 && j < tn) y[(size_t)(t0 + j) * N + n] = v;
    }
}

struct LoadF32 {
    const float* W; int K;
    __device__ void operator()(int n, int k0, float* w) const {
        const float4 v = *reinterpret_cast<const float4*>(W + (size_t)n * K + k0);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    }
};
struct LoadBf16 {
    const u16* W; int K;
    __device__ void operator()(int n, int k0, float* w) const {
        const uint4 v = *reinterpret_cast<const uint4*>(W + (size_t)n * K + k0);
        u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { w[2 * i] = fs_bf16((u16)(p[i] & 0xffffu)); w[2 * i + 1] = fs_bf16((u16)(p[i] >> 16)); }
    }
};
struct LoadFp8 {
    const u8* W; const u8* S; int K; int SK;
    __device__ void operator()(int n, int k0, float* w) const {
        const uint4 v = *reinterpret_cast<const uint4*>(W + (size_t)n * K + k0);
        float sc = fs_e8m0(S[(size_t)(n >> 7) * SK + (k0 >> 7)]);
        u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 16; i++) w[i] = fs_e4m3((u8)((p[i >> 2] >> (8 * (i & 3))) & 0xffu)) * sc;
    }
};
struct LoadFp4 {
    const u8* W; const u8* S; int K;
    __device__ void operator()(int n, int k0, float* w) const {
        const uint4 v = *reinterpret_cast<const uint4*>(W + (size_t)n * (K / 2) + k0 / 2);
        float sc = fs_e8m0(S[(size_t)n * (K / 32) + (k0 >> 5)]);
        u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = fs_e2m1((p[i >> 3] >> (4 * (i & 7))) & 0xfu) * sc;
    }
};

extern "C" __global__ void linear_f32(const float* __restrict__ x, const float* __restrict__ W, float* __restrict__ y,
                                      int T, int N, int K) {
    fs_linear_rows<4>(x, y, T, N, K, LoadF32{W, K});
}
extern "C" __global__ void linear_bf16(const float* __restrict__ x, const u16* __restrict__ W, float* __restrict__ y,
                                       int T, int N, int K) {
    fs_linear_rows<8>(x, y, T, N, K, LoadBf16{W, K});
}
extern "C" __global__ void linear_fp8(const float* __restrict__ x, const u8* __restrict__ W, const u8* __restrict__ S,
                                      float* __restrict__ y, int T, int N, int K) {
    fs_linear_rows<16>(x, y, T, N, K, LoadFp8{W, S, K, (K + 127) / 128});
}
extern "C" __global__ void linear_fp4(const float* __restrict__ x, const u8* __restrict__ W, const u8* __restrict__ S,
                                      float* __restrict__ y, int T, int N, int K) {
    fs_linear_rows<32>(x, y, T, N, K, LoadFp4{W, S, K});
}
