// rope.cu — interleaved partial RoPE on the trailing rope slice of each head (spec §3.2), and its
// inverse (spec §4.6 output de-rotation).
//
// rope_f32: x [tokens, heads, head_dim] f32, in place. Pair i of the trailing `rope_dim` channels
// of token t rotates by φ = (pos0 + t)·inv_freq[i] (angle product in f32, like the reference),
// sign −1 for the inverse. Launch: grid ceil(tokens·heads / R), block (rope_dim/2, R) — thread
// (i, y) of block b rotates pair i of row b·R + y (R rows per block so that short rows still fill
// a block; rows ≥ tokens·heads exit). Extra last argument: rows = tokens·heads.

extern "C" __global__ void rope_f32(float* __restrict__ x, const float* __restrict__ inv_freq, int heads,
                                    int head_dim, int rope_dim, int pos0, float sign, int rows) {
    int row = blockIdx.x * blockDim.y + threadIdx.y;
    int i = threadIdx.x;
    if (row >= rows || i >= rope_dim / 2) return;
    int t = row / heads;
    float* p = x + (size_t)row * head_dim + (head_dim - rope_dim) + 2 * i;
    float a = p[0], b = p[1];
    fs_rope_pair(a, b, (float)(pos0 + t) * inv_freq[i], sign);
    p[0] = a;
    p[1] = b;
}
