// compressor.cu — KV compressors (spec §4.8 HCA, §4.9 CSA; also the indexer's key compressor,
// §4.10 step 1): the position bias on the gate logits, the per-channel softmax pooling of a
// window's slots, and RoPE at strided positions (the entry positions e·ratio). The projections are
// `linear_*` (linear.cu) and the RMSNorm between pooling and RoPE is `rms_norm_f32` (norm.cu).
//
// add_position_bias_f32: logit [T, out] f32, in place; ape [ratio, out] f32.
//   logit[t, :] += ape[(pos0 + t) mod ratio, :] (one f32 add, as the reference).
//   Launch: grid ceil(T·out / 256), block 256.
//
// compressor_pool_f32: kv, logit [n_rows, out] f32 per-token projections (logit already biased),
//   the row of the token at absolute position p is (p − row_base); out = width (HCA) or 2·width
//   (CSA: A half = dims 0..width, B half = width..2·width). pooled [n_entries, width] f32.
//   Entry e = e0 + blockIdx.y, channel ch: slots = (HCA) the ratio tokens e·ratio + i, column ch;
//   (CSA, overlap = 1) the A halves of tokens (e−1)·ratio + i (absent for e = 0) then the B halves
//   of tokens e·ratio + i (column width + ch). pooled[e − e0, ch] = Σ_s softmax_s(logit_s)·kv_s
//   (max pass, then a sum pass in slot order; f32). Slots whose row is outside [0, n_rows) are
//   skipped (the launcher validates the range on the host).
//   Launch: grid (ceil(width / 128), n_entries), block 128 (one thread per channel; coalesced).
//
// rope_positions_f32: x [rows, heads, head_dim] f32, in place; like rope_f32 (rope.cu) but row t is
//   at position pos0 + t·stride (compressed entries: pos0 = e0·ratio, stride = ratio); sign −1 for
//   the inverse. Launch: grid (rows·heads), block rope_dim / 2.

extern "C" __global__ void add_position_bias_f32(float* __restrict__ logit, const float* __restrict__ ape, int T,
                                                 int out, int ratio, int pos0) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * out) return;
    int t = (int)(i / out);
    int d = (int)(i - (size_t)t * out);
    int slot = (pos0 + t) % ratio;
    logit[i] += ape[(size_t)slot * out + d];
}

// Slot s of entry e: the token row and the column, or row −1 when the slot does not exist.
__device__ __forceinline__ void fs_pool_slot(int s, int e, int ratio, int width, int overlap, int row_base, int& row,
                                             int& col, int ch) {
    if (overlap) {
        if (s < ratio) {  // A half of window e − 1
            row = e > 0 ? (e - 1) * ratio + s - row_base : -1;
            col = ch;
        } else {          // B half of window e
            row = e * ratio + (s - ratio) - row_base;
            col = width + ch;
        }
    } else {
        row = e * ratio + s - row_base;
        col = ch;
    }
}

extern "C" __global__ void compressor_pool_f32(const float* __restrict__ kv, const float* __restrict__ logit,
                                               float* __restrict__ pooled, int row_base, int n_rows, int out,
                                               int width, int ratio, int overlap, int e0) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int e = e0 + blockIdx.y;
    if (ch >= width) return;
    const int n_slots = overlap ? 2 * ratio : ratio;
    float mx = __int_as_float(0xff800000);  // −inf
    for (int s = 0; s < n_slots; s++) {
        int row, col;
        fs_pool_slot(s, e, ratio, width, overlap, row_base, row, col, ch);
        if (row < 0 || row >= n_rows) continue;
        mx = fmaxf(mx, logit[(size_t)row * out + col]);
    }
    float num = 0.f, den = 0.f;
    for (int s = 0; s < n_slots; s++) {
        int row, col;
        fs_pool_slot(s, e, ratio, width, overlap, row_base, row, col, ch);
        if (row < 0 || row >= n_rows) continue;
        size_t at = (size_t)row * out + col;
        float w = expf(logit[at] - mx);
        num += w * kv[at];
        den += w;
    }
    pooled[(size_t)blockIdx.y * width + ch] = num / den;
}

extern "C" __global__ void rope_positions_f32(float* __restrict__ x, const float* __restrict__ inv_freq, int heads,
                                              int head_dim, int rope_dim, int pos0, int stride, float sign) {
    int row = blockIdx.x;
    int t = row / heads;
    int i = threadIdx.x;
    if (i >= rope_dim / 2) return;
    float* p = x + (size_t)row * head_dim + (head_dim - rope_dim) + 2 * i;
    float ang = (float)(pos0 + t * stride) * inv_freq[i];
    float c = cosf(ang), s = sign * sinf(ang);
    float a = p[0], b = p[1];
    p[0] = a * c - b * s;
    p[1] = b * c + a * s;
}
