// rope.cu — interleaved partial RoPE on the trailing rope slice of each head (spec §3.2), and its
// inverse (spec §4.6 output de-rotation).
//
// rope_f32: x [tokens, heads, head_dim] f32, in place. Pair i of the trailing `rope_dim` channels
// of token t rotates by φ = (pos0 + t)·inv_freq[i] (angle product in f32, like the reference),
// sign −1 for the inverse. Launch: grid (tokens·heads), block rope_dim/2.

extern "C" __global__ void rope_f32(float* __restrict__ x, const float* __restrict__ inv_freq, int heads,
                                    int head_dim, int rope_dim, int pos0, float sign) {
    int row = blockIdx.x;
    int t = row / heads;
    int i = threadIdx.x;
    if (i >= rope_dim / 2) return;
    float* p = x + (size_t)row * head_dim + (head_dim - rope_dim) + 2 * i;
    float a = p[0], b = p[1];
    fs_rope_pair(a, b, (float)(pos0 + t) * inv_freq[i], sign);
    p[0] = a;
    p[1] = b;
}
