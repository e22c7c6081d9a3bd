// norm.cu — RMSNorm (spec §3.1).
//
// rms_norm_f32: x [rows, n] f32 row-major → y [rows, n]; y = w ⊙ x / sqrt(mean(x²) + eps), or
// unweighted when w == nullptr. Launch: grid (rows), block 256; shared 32 floats.
// Accumulation: f32 per thread (strided), then a fixed warp/block tree → deterministic.
//
// rms_norm_rows_f32: the same RMSNorm for rows of n ≤ RN_MAXN (1,024) values, n % 4 == 0, one warp
// per row (8 rows per block): lane ℓ keeps its float4s c = ℓ, ℓ + 32, … in registers (x is read once),
// sums their squares in that order ((x² + y²) + (z² + w²) per float4), then a fixed butterfly
// (fs_warp_sum) → deterministic; y = w ⊙ (x·r) as rms_norm_f32 writes it. With inv_freq ≠ nullptr
// it also applies rope_f32's rotation (fs_rope_pair, sign ±1) to the trailing rope_dim channels of
// each row, row r being token r / heads at position pos0 + r / heads: the per-head q norm + RoPE
// (spec §4.6) in one pass. rope_dim even, ≤ n. The host picks this kernel by n alone, so a row's bits
// do not depend on how many rows run. Launch: grid ceil(rows / 8), block 256.

extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, int n, float eps) {
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    __shared__ float part[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    float r = rsqrtf(fs_block_sum(s, part, blockDim.x >> 5) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (w ? w[i] : 1.f) * (xr[i] * r);
}

#define RN_MAXN 1024
#define RN_V (RN_MAXN / 128)  // float4s per lane
#define RN_ROWS 8             // rows (warps) per block

extern "C" __global__ void __launch_bounds__(32 * RN_ROWS)
rms_norm_rows_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int n,
                  float eps, const float* __restrict__ inv_freq, int heads, int rope_dim, int pos0, float sign) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * RN_ROWS + (threadIdx.x >> 5);
    if (row >= rows) return;  // warp-uniform; no block-wide synchronisation
    const int n4 = n >> 2;
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)row * n);
    float4 v[RN_V];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < RN_V; k++) {
        const int c = lane + 32 * k;
        v[k] = c < n4 ? xr[c] : make_float4(0.f, 0.f, 0.f, 0.f);
        s += fs_sq4(v[k]);
    }
    s = fs_warp_sum(s);
    const float r = rsqrtf(s / (float)n + eps);
    const int rs = n - rope_dim;  // first rotated channel
    const float pos = (float)(pos0 + row / heads);
    float4* yr = reinterpret_cast<float4*>(y + (size_t)row * n);
#pragma unroll
    for (int k = 0; k < RN_V; k++) {
        const int c = lane + 32 * k;
        if (c >= n4) break;
        float4 o;
        const float4 g = w ? reinterpret_cast<const float4*>(w)[c] : make_float4(1.f, 1.f, 1.f, 1.f);
        o.x = g.x * (v[k].x * r);
        o.y = g.y * (v[k].y * r);
        o.z = g.z * (v[k].z * r);
        o.w = g.w * (v[k].w * r);
        if (inv_freq) {
            const int e = 4 * c;
            if (e >= rs) fs_rope_pair(o.x, o.y, pos * inv_freq[(e - rs) >> 1], sign);
            if (e + 2 >= rs) fs_rope_pair(o.z, o.w, pos * inv_freq[(e + 2 - rs) >> 1], sign);
        }
        yr[c] = o;
    }
}
