// attention.cu — the single-softmax sparse attention of one layer (spec §4.6): per query token and
// head, logits over the raw window rows followed by a per-query list of compressed entries, a
// learned per-head sink in the denominator only, the weighted sum of the full K=V rows, then the
// inverse RoPE (spec §3.2) on the output's trailing rope slice at the query position.
//
// sparse_attention_f32 inputs (all f32 row-major unless noted):
//   q         [T, H, c]        queries (normed, rotated); query t is at absolute position pos = pos0 + t
//   kv        [kv_rows, c]     raw K=V rows; the row of absolute position j is kv[(j − kv_base)·c]
//   entries   [n_entries, c]   compressed K=V entries (may be null when there are none)
//   comp_off  [T + 1] i32      CSR offsets of the per-query compressed lists (null: no compressed keys)
//   comp_idx  [comp_off[T]] i32  entry indices of the lists, ascending per query (null: identity
//                              lists, element j of query t's list is entry j — the HCA case)
//   sinks     [H]              per-head sink logits (unscaled)
//   inv_freq  [rope_dim / 2]   RoPE inverse frequencies of the layer's rope
//   out       [T, H, c]
// Candidates of query t, in order: window rows at positions max(0, pos − window + 1) … pos, then
// compressed entries comp_idx[comp_off[t] .. comp_off[t+1]]. Window positions outside
// [kv_base, kv_base + kv_rows) and entry indices outside [0, n_entries) are skipped (weight 0);
// the launcher validates the window range on the host.
//   l_j = (q·k_j)·scale (scale = c^−1/2), m = max(max_j l_j, sink),
//   o   = Σ_j exp(l_j − m)·k_j / (Σ_j exp(l_j − m) + exp(sink − m)),
//   then pairs (2i, 2i+1) of the trailing rope_dim channels of o rotate by −pos·inv_freq[i]
//   (angle product in f32, like the reference).
// Algorithm: online softmax over tiles of ATT_TILE candidates, in candidate order. Per tile: the
// row pointers go to shared memory, each warp computes the logits of every 4th candidate (lane-
// strided float4 dot product + fixed butterfly sum), then every thread updates the running max
// and denominator identically (serial over the tile) and rescales/accumulates its own float4
// output chunks. No atomics; the reduction order is fixed → deterministic.
// Launch: grid (T·H) with block b = t·H + h, block ATT_THREADS (128); static shared memory
// ATT_TILE·(8 + 4) bytes. Limits: c % 4 == 0, c ≤ ATT_MAXC (1024), rope_dim even, ≤ c.

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_TILE 32
#define ATT_MAXC 1024
#define ATT_QV (ATT_MAXC / 4 / 32)          // float4 chunks per lane in the dot products
#define ATT_OV (ATT_MAXC / 4 / ATT_THREADS) // float4 output chunks per thread
#define ATT_NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
sparse_attention_f32(const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ entries,
                     const int* __restrict__ comp_off, const int* __restrict__ comp_idx,
                     const float* __restrict__ sinks, const float* __restrict__ inv_freq, float* __restrict__ out,
                     int H, int c, int rope_dim, int pos0, int window, int kv_base, int kv_rows, int n_entries,
                     float scale) {
    __shared__ const float* rowp[ATT_TILE];
    __shared__ float logit[ATT_TILE];

    const int t = blockIdx.x / H;
    const int h = blockIdx.x - t * H;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c4 = c >> 2;
    const int pos = pos0 + t;
    const int lo = max(0, pos - window + 1);
    const int n_win = pos - lo + 1;
    int c_begin = 0, n_comp = 0;
    if (comp_off != nullptr) {
        c_begin = comp_off[t];
        n_comp = max(0, comp_off[t + 1] - c_begin);
    }
    const int n_cand = n_win + n_comp;

    // This query head, lane-strided float4 chunks (chunk ci = lane + 32·i).
    const float4* q4 = reinterpret_cast<const float4*>(q + ((size_t)t * H + h) * c);
    float4 qr[ATT_QV];
#pragma unroll
    for (int i = 0; i < ATT_QV; i++) {
        int ci = lane + 32 * i;
        qr[i] = ci < c4 ? q4[ci] : make_float4(0.f, 0.f, 0.f, 0.f);
    }

    // Running state: the sink starts the max and contributes exp(sink − m) to the denominator.
    float m = sinks[h];
    float den = 1.f;
    float4 acc[ATT_OV];
#pragma unroll
    for (int i = 0; i < ATT_OV; i++) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);

    for (int base = 0; base < n_cand; base += ATT_TILE) {  // block-uniform trip count
        const int nt = min(ATT_TILE, n_cand - base);
        if (tid < ATT_TILE) {
            const float* p = nullptr;
            const int j = base + tid;
            if (tid < nt) {
                if (j < n_win) {
                    int r = lo + j - kv_base;
                    if (r >= 0 && r < kv_rows) p = kv + (size_t)r * c;
                } else {
                    int e = comp_idx != nullptr ? comp_idx[c_begin + (j - n_win)] : (j - n_win);
                    if (e >= 0 && e < n_entries) p = entries + (size_t)e * c;
                }
            }
            rowp[tid] = p;
        }
        __syncthreads();

        // Logits: warp w takes tile slots w, w + ATT_WARPS, … (the branch is warp-uniform).
        for (int s = warp; s < ATT_TILE; s += ATT_WARPS) {
            const float* p = rowp[s];
            float l = ATT_NEG_INF;
            if (s < nt && p != nullptr) {
                const float4* k4 = reinterpret_cast<const float4*>(p);
                float part = 0.f;
#pragma unroll
                for (int i = 0; i < ATT_QV; i++) {
                    int ci = lane + 32 * i;
                    if (ci < c4) {
                        float4 k = k4[ci];
                        part += qr[i].x * k.x + qr[i].y * k.y + qr[i].z * k.z + qr[i].w * k.w;
                    }
                }
                l = fs_warp_sum(part) * scale;
            }
            if (lane == 0) logit[s] = l;
        }
        __syncthreads();

        // Online softmax update; every thread computes the same m/den in the same order.
        float tmax = ATT_NEG_INF;
        for (int s = 0; s < nt; s++) tmax = fmaxf(tmax, logit[s]);
        const float m_new = fmaxf(m, tmax);
        const float corr = (m_new == m) ? 1.f : expf(m - m_new);
        den *= corr;
#pragma unroll
        for (int i = 0; i < ATT_OV; i++) {
            acc[i].x *= corr; acc[i].y *= corr; acc[i].z *= corr; acc[i].w *= corr;
        }
        for (int s = 0; s < nt; s++) {
            const float l = logit[s];
            if (l == ATT_NEG_INF) continue;  // skipped row (uniform across the block)
            const float pr = expf(l - m_new);
            den += pr;
            const float4* k4 = reinterpret_cast<const float4*>(rowp[s]);
#pragma unroll
            for (int i = 0; i < ATT_OV; i++) {
                int ci = tid + ATT_THREADS * i;
                if (ci < c4) {
                    float4 k = k4[ci];
                    acc[i].x += pr * k.x; acc[i].y += pr * k.y; acc[i].z += pr * k.z; acc[i].w += pr * k.w;
                }
            }
        }
        m = m_new;
        __syncthreads();  // rowp/logit are rewritten by the next tile
    }

    // o = acc / den, then the inverse RoPE on the trailing rope_dim channels at the query position.
    const float inv_den = 1.f / den;
    const int r0 = c - rope_dim;  // first rope channel (even)
    const float fpos = (float)pos;
    float4* o4 = reinterpret_cast<float4*>(out + ((size_t)t * H + h) * c);
#pragma unroll
    for (int i = 0; i < ATT_OV; i++) {
        int ci = tid + ATT_THREADS * i;
        if (ci < c4) {
            float v[4] = {acc[i].x * inv_den, acc[i].y * inv_den, acc[i].z * inv_den, acc[i].w * inv_den};
#pragma unroll
            for (int pr = 0; pr < 2; pr++) {
                int d = 4 * ci + 2 * pr;  // pair (d, d+1)
                if (d >= r0) {
                    float ang = fpos * inv_freq[(d - r0) >> 1];
                    float cs = cosf(ang), sn = -sinf(ang);
                    float a = v[2 * pr], b = v[2 * pr + 1];
                    v[2 * pr] = a * cs - b * sn;
                    v[2 * pr + 1] = b * cs + a * sn;
                }
            }
            o4[ci] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
}
