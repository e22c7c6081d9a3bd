// norm.cu — RMSNorm (spec §3.1).
//
// rms_norm_f32: x [rows, n] f32 row-major → y [rows, n]; y = w ⊙ x / sqrt(mean(x²) + eps), or
// unweighted when w == nullptr. Launch: grid (rows), block 256; shared 32 floats.
// Accumulation: f32 per thread (strided), then a fixed warp/block tree → deterministic.

extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, int n, float eps) {
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    __shared__ float part[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    s = fs_warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        v = fs_warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float r = rsqrtf(part[0] / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (w ? w[i] : 1.f) * (xr[i] * r);
}
