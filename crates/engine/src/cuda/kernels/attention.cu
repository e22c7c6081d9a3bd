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
//   comp_mask [T, n_entries] u8  null, or the mask path of DIRECT_INDEXER_TOPK=off (issue 6 §2): with
//                              identity lists (comp_idx null, comp_off = the visible counts) query
//                              t's compressed candidates are the visible entries e with
//                              comp_mask[t·n_entries + e] ≠ 0, ascending — the same candidates in
//                              the same order as the index lists the mask was built from, so the
//                              result is bitwise equal to the direct path
//   sinks     [H]              per-head sink logits (unscaled)
//   inv_freq  [rope_dim / 2]   RoPE inverse frequencies of the layer's rope
//   out       [T, H, c]
// Candidates of query t, in order: window rows at positions max(0, pos − window + 1) … pos, then
// compressed entries comp_idx[comp_off[t] .. comp_off[t+1]] (or the masked identity list). Window positions outside
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
// ATT_TILE·(8 + 4) + 4 bytes (row pointers, logits, the mask cursor). Limits: c % 4 == 0, c ≤ ATT_MAXC (1024), rope_dim even, ≤ c.

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_TILE 32
#define ATT_MAXC 1024
#define ATT_QV (ATT_MAXC / 4 / 32)          // float4 chunks per lane in the dot products
#define ATT_OV (ATT_MAXC / 4 / ATT_THREADS) // float4 output chunks per thread
#define ATT_NEG_INF __int_as_float(0xff800000)

// Candidate rows of one tile (att_tile_rows, both kernels): warp 0 alone calls it; lane j stores the
// row pointer of candidate base + j in rowp[j] (null: no row, weight 0). Mask mode (mrow non-null):
// the tile's compressed slots take the next set bytes of mrow[0 .. n_vis) in ascending order,
// scanned 32 at a time with a ballot from *cursor (shared, advanced here; tiles run in order).
// Rows of element type E: f32, or the bf16 copies of sparse_attention_wg.
template <class E>
__device__ __forceinline__ void att_tile_rows(const E** rowp, int lane, int base, int nt, int c, int lo, int n_win,
                                              const E* kv, int kv_base, int kv_rows, const E* entries,
                                              int n_entries, const int* comp_idx, int c_begin, const u8* mrow,
                                              int n_vis, int* cursor) {
    const E* p = nullptr;
    const int j = base + lane;
    if (lane < nt) {
        if (j < n_win) {
            const int r = lo + j - kv_base;
            if (r >= 0 && r < kv_rows) p = kv + (size_t)r * c;
        } else if (mrow == nullptr) {
            const int e = comp_idx != nullptr ? comp_idx[c_begin + (j - n_win)] : (j - n_win);
            if (e >= 0 && e < n_entries) p = entries + (size_t)e * c;
        }
    }
    rowp[lane] = p;
    if (mrow == nullptr) return;
    __syncwarp();
    const int first = max(0, n_win - base);  // first compressed slot of the tile
    const int need = max(0, nt - first);
    int got = 0, cur = *cursor;
    while (got < need && cur < n_vis) {  // warp-uniform
        const int e = cur + lane;
        const bool hit = e < n_vis && mrow[e] != 0;
        const u32 b = __ballot_sync(0xffffffffu, hit);
        const int before = __popc(b & ((1u << lane) - 1u));
        const int take = min(__popc(b), need - got);
        if (hit && before < take && e < n_entries) rowp[first + got + before] = entries + (size_t)e * c;
        if (take < __popc(b)) {
            cur += __ffs(__ballot_sync(0xffffffffu, hit && before == take - 1));  // just past the last hit taken
        } else {
            cur += 32;
        }
        got += take;
    }
    __syncwarp();
    if (lane == 0) *cursor = cur;
}

// Compressed candidates of query t in mask mode: the set bytes of mrow[0 .. n_vis) (every thread of
// the block calls it; block-uniform loop).
__device__ __forceinline__ int att_mask_count(const u8* mrow, int n_vis) {
    int n = 0;
    for (int p0 = 0; p0 < n_vis; p0 += blockDim.x) {
        const int e = p0 + (int)threadIdx.x;
        n += __syncthreads_count(e < n_vis && mrow[e] != 0);
    }
    return n;
}

// Query t's compressed candidates (both kernels): where its list starts, how many candidates it has
// and, in mask mode, its mask row and visible length (never past the row); resets the mask cursor.
// Every thread of the block calls it (it synchronizes).
struct AttComp {
    int c_begin, n_comp, n_vis;
    const u8* mrow;
};

__device__ __forceinline__ AttComp att_comp(const int* comp_off, const u8* comp_mask, int t, int n_entries, int* cursor) {
    AttComp r = {0, 0, 0, nullptr};
    if (comp_off != nullptr) {
        r.c_begin = comp_off[t];
        r.n_comp = max(0, comp_off[t + 1] - r.c_begin);
    }
    r.mrow = comp_mask != nullptr && comp_off != nullptr ? comp_mask + (size_t)t * n_entries : nullptr;
    r.n_vis = min(r.n_comp, n_entries);
    if (r.mrow != nullptr) r.n_comp = att_mask_count(r.mrow, r.n_vis);
    if (threadIdx.x == 0) *cursor = 0;
    __syncthreads();  // the cursor is read by every lane of warp 0
    return r;
}

// Query t's candidates (the streaming kernels): its position, the first window position lo and the
// window's n_win rows, its compressed list (att_comp: synchronises the block), n_cand in all.
struct AttCands {
    int pos, lo, n_win, n_cand;
    AttComp cc;
};

__device__ __forceinline__ AttCands att_cands(int t, int pos0, int window, const int* comp_off, const u8* comp_mask, int n_entries, int* cursor) {
    AttCands a;
    a.pos = pos0 + t;
    a.lo = max(0, a.pos - window + 1);
    a.n_win = a.pos - a.lo + 1;
    a.cc = att_comp(comp_off, comp_mask, t, n_entries, cursor);
    a.n_cand = a.n_win + a.cc.n_comp;
    return a;
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
sparse_attention_f32(const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ entries,
                     const int* __restrict__ comp_off, const int* __restrict__ comp_idx, const u8* __restrict__ comp_mask,
                     const float* __restrict__ sinks, const float* __restrict__ inv_freq, float* __restrict__ out,
                     int H, int c, int rope_dim, int pos0, int window, int kv_base, int kv_rows, int n_entries,
                     float scale) {
    __shared__ const float* rowp[ATT_TILE];
    __shared__ float logit[ATT_TILE];
    __shared__ int att_cursor;

    const int t = blockIdx.x / H;
    const int h = blockIdx.x - t * H;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c4 = c >> 2;
    const int pos = pos0 + t;
    const int lo = max(0, pos - window + 1);
    const int n_win = pos - lo + 1;
    const AttComp cc = att_comp(comp_off, comp_mask, t, n_entries, &att_cursor);
    const int n_cand = n_win + cc.n_comp;

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
        if (warp == 0) att_tile_rows(rowp, lane, base, nt, c, lo, n_win, kv, kv_base, kv_rows, entries, n_entries, comp_idx, cc.c_begin, cc.mrow, cc.n_vis, &att_cursor);
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
                    fs_rope_rot(v[2 * pr], v[2 * pr + 1], cosf(ang), -sinf(ang));
                }
            }
            o4[ci] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// sparse_attention_tc — the same attention (same arguments, candidates, sink and inverse RoPE as
// sparse_attention_f32) streamed on the tensor cores for H = 64 heads of c = 512 (the Flash shape;
// switch MLA_STREAM_TOPK, issue 6 §4). One block per query token; each candidate K=V row is read
// from memory once per token for all 64 heads (the f32 kernel reads it once per head).
//   Per tile of ATC_TILE = 32 candidates: the rows are converted to split bf16 (hi = bf16(x),
//   lo = bf16(x − hi)) in shared memory; S = Q·Kᵀ [64 × 32] and O += P·K [64 × 512] run on
//   mma.sync m16n8k16 with three products per fragment (hi·hi, hi·lo, lo·hi: about 16 significant
//   bits per operand, so S and O carry f32-level error, NMSE ~1e-12 against the f32 path), f32
//   accumulation. Online softmax per head row starting from m = sink, denominator 1 (the sink's
//   term), exactly as the f32 kernel; P is split the same way for the P·K product.
//   Warps: 8 = 4 head groups (16 heads) × 2 halves of the 512 channels. A warp computes the partial
//   S over its 256 channels; the two halves exchange partials through shared memory and add them
//   (a + b = b + a exactly, so both hold identical S, maxima and denominators), then each
//   accumulates O for its 16 heads × 256 channels (128 f32 registers per thread).
//   Epilogue: O / denominator, inverse RoPE on the trailing rope_dim channels (pairs held by one
//   thread; same f32 angle formula as the f32 kernel), f32 stores into out — or, in the _split
//   entry points (switch MLA_SPLIT_OUT), the output's split bf16 planes for the grouped output
//   projection (gemm.cu gemm_x_bf16's split of the same values, element e = (t·64 + h)·512 + col:
//   hi at planes[e], lo at planes[plane + e]; out unused), saving that conversion's pass.
//   Argument q_eps (before q_bf16, the last): negative = q holds normed, rotated queries (as sparse_attention_f32);
//   ≥ 0 (switch MLA_FUSED_Q_NORM) = q is the raw wq_b output and the kernel applies the per-head
//   unweighted RMSNorm with epsilon q_eps and the RoPE at the token's position while staging Q,
//   bit for bit what norm.cu rms_norm_rows_f32 writes for them (the separate pass goes). q_bf16 ≠ 0
//   (switch WQ_B_BF16_OUT, raw queries only): q holds bf16 bits [T, 64, c] (the wq_b GEMM's bf16
//   output, as DeepSeek's fp8_gemm writes it), widened exactly at the load: the bits of the f32
//   raw form given those widened values.
// Launch: grid (T), block ATC_THREADS = 256, dynamic shared memory ATC_SMEM bytes (Q hi/lo
// [64][520] bf16, K hi/lo [32][520], partials 8·32·16 f32, 32 row pointers).
// sparse_attention_tc_fast_exp (switch MLA_STREAM_FAST_EXP) is the same kernel with __expf (the
// hardware ex2 path) instead of expf in the online softmax.
// Deterministic: fixed MMA and reduction order, no atomics.

#define ATC_H 64
#define ATC_C 512
#define ATC_TILE 32
#define ATC_THREADS 256
#define ATC_PITCH 520  // bf16 per shared row (1040 B: ldmatrix rows on distinct banks)
#define ATC_LB 8       // float4 loads in flight per thread while staging Q and K rows
#define ATC_QPLANE (ATC_H * ATC_PITCH)
#define ATC_KPLANE (ATC_TILE * ATC_PITCH)
#define ATC_SMEM (2 * ATC_QPLANE * 2 + 2 * ATC_KPLANE * 2 + 8 * 32 * 16 * 4 + ATC_TILE * 8)
// SPLIT_OUT staging after the last tile (reusing Q and K): per warp hi and lo rows of its 16 heads ×
// 256 channels, pitch 264 bf16 (rows 528 bytes apart: the fragment stores of 8 rows × 4 lanes hit
// 32 distinct banks; 16-byte aligned row chunks).
#define ATC_STAGE_PITCH 264
#define ATC_STAGE_WARP (2 * 16 * ATC_STAGE_PITCH)
static_assert(8 * ATC_STAGE_WARP * 2 <= ATC_SMEM, "the SPLIT_OUT staging must fit the block's shared memory");

// f32x4 → split bf16 planes at hi[0..3], lo[0..3] (8-byte stores).
__device__ __forceinline__ void atc_split4(float4 v, u16* hi, u16* lo) {
    const u32 h0 = gm_bf16x2(v.x, v.y), h1 = gm_bf16x2(v.z, v.w);
    *reinterpret_cast<uint2*>(hi) = make_uint2(h0, h1);
    const u32 l0 = gm_bf16x2_lo(v.x, v.y, h0), l1 = gm_bf16x2_lo(v.z, v.w, h1);
    *reinterpret_cast<uint2*>(lo) = make_uint2(l0, l1);
}

// exp of the online softmax: expf (precise), or the hardware ex2-based __expf (MLA_STREAM_FAST_EXP).
template <bool FAST_EXP>
__device__ __forceinline__ float atc_exp(float x) {
    return FAST_EXP ? __expf(x) : expf(x);
}

// Q of token t (64 heads × c = 512) staged by NT = 256 threads through store(row, col, float4) (col a
// multiple of 4), both streaming kernels. q_eps < 0: q holds normed, rotated queries, loaded in
// batches of ATC_LB float4 per thread (their latencies overlap instead of adding up). q_eps ≥ 0
// (MLA_FUSED_Q_NORM): q is the raw wq_b output, f32 or (q_bf16 ≠ 0, switch WQ_B_BF16_OUT) bf16 bits
// [T, 64, c] behind the same pointer, widened exactly as loaded. Warp w takes heads w, w + 8, …, two at a time, and
// computes rms_norm_rows_f32's bits for each: lane ℓ's float4s ℓ, ℓ + 32, ℓ + 64, ℓ + 96 squared in
// that order (fs_sq4; that kernel's zero float4s past the row add +0), the same butterfly, x·r,
// then fs_rope_pair's rotation of the trailing rope_dim channels at this token's position. The
// token's rope_dim / 2 (cos, sin) pairs are computed once (the same cosf / sinf of the same f32
// angle) into cs (shared, rope_dim / 2 float2, free until the first tile); sync() joins the NT
// threads after that.
// The rope_dim / 2 (cos, sin) pairs of position pos into cs, by 256 threads (tid): the same f32
// angle pos·inv_freq[i] and functions as every RoPE here (atc_stage_q's fused q norm,
// sparse_attention_wc's epilogue table).
__device__ __forceinline__ void atc_rope_pairs(float2* cs, int pos, const float* __restrict__ inv_freq, int rope_dim, int tid) {
    for (int i = tid; i < rope_dim / 2; i += 256) {
        const float ang = (float)pos * inv_freq[i];
        cs[i] = make_float2(cosf(ang), sinf(ang));
    }
}

// Q staging's loads of normed-on-the-fly queries (atc_stage_q, q_eps ≥ 0): each warp's next pair of
// head rows loaded while it norms and stores the current one (1), or each pair loaded when its turn
// comes (0: before 41st-session). Timing only: the same values either way (FLASHSEEK_KERNEL_DEFINES).
#ifndef ATC_Q_AHEAD
#define ATC_Q_AHEAD 1
#endif

template <class Store, class Sync>
__device__ __forceinline__ void atc_stage_q(const float* __restrict__ q, int t, int c, float q_eps, int q_bf16, int rope_dim, int pos, const float* __restrict__ inv_freq,
                                            float2* cs, int tid, Store store, Sync sync) {
    constexpr int NT = 256;
    const int lane = tid & 31, warp = tid >> 5;
    const float4* q4 = reinterpret_cast<const float4*>(q + (size_t)t * ATC_H * ATC_C);
    // WQ_B_BF16_OUT: the raw queries as bf16 bits (4 per 8-byte load), widened exactly.
    const uint2* qb = reinterpret_cast<const uint2*>(reinterpret_cast<const u16*>(q) + (size_t)t * ATC_H * ATC_C);
    auto raw4 = [&](int i) {
        if (!q_bf16) return q4[i];
        return fs_bf16x4(qb[i]);
    };
    if (q_eps >= 0.f) {
        const int rs = ATC_C - rope_dim;
#if ATC_Q_AHEAD
        // The first pair of rows' loads before the table and its barrier, and each next pair's
        // before this one's norm (ATC_Q_AHEAD): four dependent round trips to memory become one
        // plus what the compute does not hide. The same values, the same bits.
        uint2 nb[2][4];
        float4 nf[2][4];
        auto issue = [&](int hb) {
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int i = (hb + 8 * u) * (ATC_C / 4) + lane + 32 * k;
                    if (q_bf16) {
                        nb[u][k] = qb[i];
                    } else {
                        nf[u][k] = q4[i];
                    }
                }
        };
        issue(warp);
#endif
        atc_rope_pairs(cs, pos, inv_freq, rope_dim, tid);
        sync();
#pragma unroll 1
        for (int hb = warp; hb < ATC_H; hb += 16) {
            float4 v[2][4];
#if ATC_Q_AHEAD
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (q_bf16) {
                        v[u][k] = fs_bf16x4(nb[u][k]);
                    } else {
                        v[u][k] = nf[u][k];
                    }
                }
            if (hb + 16 < ATC_H) issue(hb + 16);
#else
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int k = 0; k < 4; k++) v[u][k] = raw4((hb + 8 * u) * (ATC_C / 4) + lane + 32 * k);
#endif
#pragma unroll
            for (int u = 0; u < 2; u++) {
                float ss = 0.f;
#pragma unroll
                for (int k = 0; k < 4; k++) ss += fs_sq4(v[u][k]);
                ss = fs_warp_sum(ss);
                const float r = rsqrtf(ss / (float)c + q_eps);
                const int row = hb + 8 * u;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * (lane + 32 * k);
                    float4 o = make_float4(v[u][k].x * r, v[u][k].y * r, v[u][k].z * r, v[u][k].w * r);
                    if (e >= rs) {
                        const float2 r0 = cs[(e - rs) >> 1];
                        fs_rope_rot(o.x, o.y, r0.x, r0.y);
                    }
                    if (e + 2 >= rs) {
                        const float2 r1 = cs[(e + 2 - rs) >> 1];
                        fs_rope_rot(o.z, o.w, r1.x, r1.y);
                    }
                    store(row, e, o);
                }
            }
        }
    } else {
#pragma unroll 1
        for (int b = 0; b < ATC_H * ATC_C / 4 / NT; b += ATC_LB) {
            float4 v[ATC_LB];
#pragma unroll
            for (int u = 0; u < ATC_LB; u++) v[u] = q4[tid + NT * (b + u)];
#pragma unroll
            for (int u = 0; u < ATC_LB; u++) {
                const int i = tid + NT * (b + u);
                store(i >> 7, (i & 127) * 4, v[u]);
            }
        }
    }
}

// The online-softmax update of one 32-candidate tile for this thread's two head rows (both
// streaming kernels): s holds the tile's raw logits in the m16n8 accumulator layout (s[j][e]: row
// g for e < 2, else g + 8; column 8j + c2 + (e & 1)); ok(col) says whether candidate col has a row.
// Scales them, takes each row's tile max over its 4 lanes, the new running max m, the factor corr
// that rescales what was accumulated, and replaces s by P = exp(l − m) (0 for missing candidates),
// adding its row sums to den (den·corr + Σ P).
template <bool FAST_EXP, class Ok>
__device__ __forceinline__ void atc_softmax(float (&s)[4][4], float (&m)[2], float (&den)[2], float (&corr)[2], float scale, int c2, Ok ok) {
    float tmax[2] = {ATT_NEG_INF, ATT_NEG_INF};
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float l = ok(8 * j + c2 + (e & 1)) ? s[j][e] * scale : ATT_NEG_INF;
            s[j][e] = l;
            tmax[e >> 1] = fmaxf(tmax[e >> 1], l);
        }
    float psum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
        const float m_new = fmaxf(m[r], tmax[r]);
        corr[r] = (m_new == m[r]) ? 1.f : atc_exp<FAST_EXP>(m[r] - m_new);
        m[r] = m_new;
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float l = s[j][e];
            const float p = l == ATT_NEG_INF ? 0.f : atc_exp<FAST_EXP>(l - m[e >> 1]);
            s[j][e] = p;
            psum[e >> 1] += p;
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 1);
        psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 2);
        den[r] = den[r] * corr[r] + psum[r];
    }
}

// The online-softmax state of this thread's two head rows h0 and h0 + 8 (both streaming kernels):
// running maxima from the sinks, denominators 1 (the sink's term), O zero.
__device__ __forceinline__ void atc_state_init(const float* __restrict__ sinks, int h0, float (&m)[2], float (&den)[2], float (&o)[32][4]) {
    m[0] = sinks[h0];
    m[1] = sinks[h0 + 8];
    den[0] = den[1] = 1.f;
#pragma unroll
    for (int j = 0; j < 32; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.f;
}

// O rows scaled by the softmax's corr (row g: elements 0, 1; row g + 8: elements 2, 3).
__device__ __forceinline__ void atc_rescale(float (&o)[32][4], const float (&corr)[2]) {
#pragma unroll
    for (int j = 0; j < 32; j++) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        o[j][2] *= corr[1];
        o[j][3] *= corr[1];
    }
}

// This thread's output pair at column col of both its head rows (r = 0, 1: o[j][2r], o[j][2r + 1]):
// o / den (inv = 1 / den) and, from channel r0 = c − rope_dim on, the inverse RoPE at fpos — from
// the table cs (as atc_epilogue documents) or inv_freq. The one expression both epilogues store.
__device__ __forceinline__ void atc_out_pair(const float (&o)[32][4], int j, int col, int r0, float fpos, const float (&inv)[2],
                                             const float* __restrict__ inv_freq, const float2* cs_table, float (&ab)[2][2]) {
    float cs = 1.f, sn = 0.f;
    const bool rot = col >= r0;
    if (rot) {
        if (cs_table != nullptr) {
            const float2 v = cs_table[(col - r0) >> 1];
            cs = v.x;
            sn = -v.y;
        } else {
            const float ang = fpos * inv_freq[(col - r0) >> 1];
            cs = cosf(ang);
            sn = -sinf(ang);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float a = o[j][2 * r] * inv[r], b = o[j][2 * r + 1] * inv[r];
        if (rot) fs_rope_rot(a, b, cs, sn);
        ab[r][0] = a;
        ab[r][1] = b;
    }
}

// o / den, inverse RoPE on the trailing rope_dim channels, f32 stores into out (both streaming
// kernels) — or, SPLIT_OUT, the split planes staged per warp in stage (ATC_STAGE_WARP u16 of freed
// shared memory; the caller synchronises before), then stored as whole rows; with LO false the hi
// plane alone (the output rounded to bf16: sparse_attention_wg's bf16 output). This thread holds
// heads 16·wh + g (+ 8) × channels 256·wd + 8j + c2 (+ 1), j < 32, in the accumulator layout.
// With a table cs (non-null: cs[i] = (cosf, sinf) of pos·inv_freq[i], i < rope_dim / 2, the same f32
// angle and functions, computed once per block) the rotation reads it instead of evaluating them in
// every unrolled column group (sparse_attention_wc: less code, so fewer instruction-cache misses).
template <bool SPLIT_OUT, bool LO = true>
__device__ __forceinline__ void atc_epilogue(float (&o)[32][4], const float (&den)[2], int wh, int wd, int lane, int t, int pos, int rope_dim,
                                             const float* __restrict__ inv_freq, float* __restrict__ out, u16* __restrict__ planes, long long plane,
                                             u16* stage, const float2* cs_table = nullptr) {
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int h0 = 16 * wh + g;
    const float inv[2] = {1.f / den[0], 1.f / den[1]};
    const int r0 = ATC_C - rope_dim;
    const float fpos = (float)pos;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int col = 256 * wd + 8 * j + c2;
        float ab[2][2];
        atc_out_pair(o, j, col, r0, fpos, inv, inv_freq, cs_table, ab);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float a = ab[r][0], b = ab[r][1];
            if (!SPLIT_OUT) {
                *reinterpret_cast<float2*>(out + ((size_t)t * ATC_H + h0 + 8 * r) * ATC_C + col) = make_float2(a, b);
            } else {
                // gemm_x_bf16's split of the same two values, into the warp's staging rows (row
                // g + 8r of its 16 heads, column col − 256·wd of its 256).
                const u32 hh = gm_bf16x2(a, b);
                const u32 ll = gm_bf16x2_lo(a, b, hh);
                u16* s = stage + (g + 8 * r) * ATC_STAGE_PITCH + 8 * j + c2;
                *reinterpret_cast<u32*>(s) = hh;
                if (LO) *reinterpret_cast<u32*>(s + 16 * ATC_STAGE_PITCH) = ll;
            }
        }
    }
    if (SPLIT_OUT) {
        __syncwarp();
        // Each of the warp's 16 rows per plane: 32 lanes × 16 bytes = its 256 columns.
#pragma unroll 4
        for (int i = 0; i < (LO ? 32 : 16); i++) {
            const int p = i >> 4, lr = i & 15;
            const uint4 v = *reinterpret_cast<const uint4*>(stage + (p * 16 + lr) * ATC_STAGE_PITCH + 8 * lane);
            *reinterpret_cast<uint4*>(planes + p * plane + ((size_t)t * ATC_H + 16 * wh + lr) * ATC_C + 256 * wd + 8 * lane) = v;
        }
    }
}

// Bytes per staged row of atc_epilogue_fp8 (256 e4m3 values + 16: the warp's 2-byte stores of
// one column group land in distinct banks, and each 16-byte read stays aligned).
#define ATC_FP8_PITCH 272
static_assert(16 * ATC_FP8_PITCH <= 2 * ATC_STAGE_WARP, "the FP8 staging must fit a warp's staging block");

// WO_A_FP8: atc_epilogue's values (o / den, the inverse RoPE on the trailing rope_dim channels, the
// same expressions) quantized for the FP8 grouped output projection as act_quant_fp8 quantizes an
// f32 row (DeepSeek's rule, fs_q8_exp; spec §6): per head and 128 channels amax, s = 2^e, e4m3(x·2^−e)
// round to nearest even, saturating. qo [T, H, c] e4m3 bytes, sa [T, H·c/128] f32 scales (block
// 4h + col/128 of row t: act_quant_fp8's layout for a row of H·c values) — so the bytes and scales
// are those of act_quant_fp8 run on atc_epilogue's f32 output (gpu-check `sparse_attention_wc fp8
// out bits`). This thread holds 32 values of each of four (head, 128-block) pairs: heads h0, h0 + 8,
// blocks 2·wd (j < 16) and 2·wd + 1; the quad (lanes 4g … 4g + 3) holds a pair's 128. The bytes are
// staged per warp (16 rows × ATC_FP8_PITCH in stage, freed shared memory; the caller synchronises
// before) and stored as 256-byte row pieces, 16 bytes per lane. vLLM's DeepSeek-V4 path on sm_90
// quantizes the attention output the same way (1 × 128 ue8m0 groups, fused with the inverse RoPE)
// from its bf16 copy; here from the f32 values.
__device__ __forceinline__ void atc_epilogue_fp8(float (&o)[32][4], const float (&den)[2], int wh, int wd, int lane, int t, int pos, int rope_dim,
                                                 const float* __restrict__ inv_freq, float* __restrict__ sa, u8* __restrict__ qo, u8* stage,
                                                 const float2* cs_table) {
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int h0 = 16 * wh + g;
    const float inv[2] = {1.f / den[0], 1.f / den[1]};
    const int r0 = ATC_C - rope_dim;
    const float fpos = (float)pos;
    float amax[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < 32; j++) {
        float ab[2][2];
        atc_out_pair(o, j, 256 * wd + 8 * j + c2, r0, fpos, inv, inv_freq, cs_table, ab);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            o[j][2 * r] = ab[r][0];
            o[j][2 * r + 1] = ab[r][1];
            amax[r][j >> 4] = fmaxf(amax[r][j >> 4], fmaxf(fabsf(ab[r][0]), fabsf(ab[r][1])));
        }
    }
    float mul[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int hb = 0; hb < 2; hb++) {
            float m = amax[r][hb];
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            const int e = fs_q8_exp(m);
            mul[r][hb] = gq_pow2(-e);
            if ((lane & 3) == 0) sa[((size_t)t * ATC_H + h0 + 8 * r) * (ATC_C / 128) + 2 * wd + hb] = gq_pow2(e);
        }
#pragma unroll
    for (int j = 0; j < 32; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float m = mul[r][j >> 4];
            *reinterpret_cast<u16*>(stage + (g + 8 * r) * ATC_FP8_PITCH + 8 * j + c2) = (u16)gq_e4m3x2(o[j][2 * r] * m, o[j][2 * r + 1] * m);
        }
    __syncwarp();
    // Two of the warp's 16 rows per instruction: 16 lanes × 16 bytes = a row's 256 bytes.
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int lr = 2 * i + (lane >> 4), ch = lane & 15;
        const uint4 v = *reinterpret_cast<const uint4*>(stage + lr * ATC_FP8_PITCH + 16 * ch);
        *reinterpret_cast<uint4*>(qo + ((size_t)t * ATC_H + 16 * wh + lr) * ATC_C + 256 * wd + 16 * ch) = v;
    }
}

template <bool FAST_EXP, bool SPLIT_OUT>
__device__ __forceinline__ void atc_body(const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ entries,
                                         const int* __restrict__ comp_off, const int* __restrict__ comp_idx, const u8* __restrict__ comp_mask,
                                         const float* __restrict__ sinks, const float* __restrict__ inv_freq, float* __restrict__ out,
                                         int H, int c, int rope_dim, int pos0, int window, int kv_base, int kv_rows, int n_entries,
                                         float scale, u16* __restrict__ planes, long long plane, float q_eps, int q_bf16) {
    extern __shared__ __align__(16) u8 atc_sh[];
    __shared__ int att_cursor;
    {
        u32 dsz;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsz));
        if (dsz < (u32)ATC_SMEM || H != ATC_H || c != ATC_C) __trap();
    }
    u16* Qs = reinterpret_cast<u16*>(atc_sh);
    u16* Ks = Qs + 2 * ATC_QPLANE;
    float* part = reinterpret_cast<float*>(Ks + 2 * ATC_KPLANE);
    const float** rowp = reinterpret_cast<const float**>(part + 8 * 32 * 16);

    const int t = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wh = warp >> 1, wd = warp & 1;
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const AttCands ac = att_cands(t, pos0, window, comp_off, comp_mask, n_entries, &att_cursor);
    const int pos = ac.pos, lo = ac.lo, n_win = ac.n_win, n_cand = ac.n_cand;
    const AttComp cc = ac.cc;

    // Q of this token → split bf16 planes (the (cos, sin) pairs of MLA_FUSED_Q_NORM in the K tiles'
    // shared memory, unused until the first tile).
    atc_stage_q(q, t, c, q_eps, q_bf16, rope_dim, pos, inv_freq, reinterpret_cast<float2*>(Ks), tid,
                [&](int row, int e, float4 v) { atc_split4(v, Qs + row * ATC_PITCH + e, Qs + ATC_QPLANE + row * ATC_PITCH + e); },
                [] { __syncthreads(); });
    float m[2], den[2], o[32][4];
    atc_state_init(sinks, 16 * wh + g, m, den, o);

    const u32 qs = gm_smem(Qs), ks = gm_smem(Ks);
    for (int base = 0; base < n_cand; base += ATC_TILE) {  // block-uniform trip count
        const int nt = min(ATC_TILE, n_cand - base);
        if (warp == 0) att_tile_rows(rowp, lane, base, nt, ATC_C, lo, n_win, kv, kv_base, kv_rows, entries, n_entries, comp_idx, cc.c_begin, cc.mrow, cc.n_vis, &att_cursor);
        __syncthreads();  // rowp ready; Q stored (first tile)
#pragma unroll 1
        for (int b = 0; b < ATC_TILE * ATC_C / 4 / ATC_THREADS; b += ATC_LB) {  // batched loads, as Q
            float4 v[ATC_LB];
#pragma unroll
            for (int u = 0; u < ATC_LB; u++) {
                const int i = tid + ATC_THREADS * (b + u);
                const float* p = rowp[i >> 7];
                v[u] = p != nullptr ? __ldg(reinterpret_cast<const float4*>(p) + (i & 127)) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < ATC_LB; u++) {
                const int i = tid + ATC_THREADS * (b + u), r = i >> 7, col = (i & 127) * 4;
                atc_split4(v[u], Ks + r * ATC_PITCH + col, Ks + ATC_KPLANE + r * ATC_PITCH + col);
            }
        }
        __syncthreads();

        // Partial S over channels [256·wd, 256·wd + 256).
        float s[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = 0.f;
#pragma unroll 2
        for (int kk = 0; kk < 256; kk += 16) {
            const int k0 = 256 * wd + kk;
            u32 ah[4], al[4];
            const u32 qa = qs + ((16 * wh + (lane & 15)) * ATC_PITCH + k0 + (lane >> 4) * 8) * 2;
            gm_ldsm4(qa, ah[0], ah[1], ah[2], ah[3]);
            gm_ldsm4(qa + ATC_QPLANE * 2, al[0], al[1], al[2], al[3]);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                const u32 kb = ks + (row * ATC_PITCH + k0 + ((lane >> 3) & 1) * 8) * 2;
                u32 bh[4], bl[4];
                gm_ldsm4(kb, bh[0], bh[1], bh[2], bh[3]);
                gm_ldsm4(kb + ATC_KPLANE * 2, bl[0], bl[1], bl[2], bl[3]);
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    gm_mma(s[2 * np + x], ah, bh[2 * x], bh[2 * x + 1]);
                    gm_mma(s[2 * np + x], ah, bl[2 * x], bl[2 * x + 1]);
                    gm_mma(s[2 * np + x], al, bh[2 * x], bh[2 * x + 1]);
                }
            }
        }
        // Exchange partials with the other channel half (same lane ↔ same elements).
        float* mine = part + (warp * 32 + lane) * 16;
#pragma unroll
        for (int i = 0; i < 16; i++) mine[i] = s[i >> 2][i & 3];
        __syncthreads();
        const float* other = part + ((warp ^ 1) * 32 + lane) * 16;
#pragma unroll
        for (int i = 0; i < 16; i++) s[i >> 2][i & 3] += other[i];

        float corr[2];
        atc_softmax<FAST_EXP>(s, m, den, corr, scale, c2, [&](int col) { return col < nt && rowp[col] != nullptr; });
        atc_rescale(o, corr);
        // O[16 heads, 256 channels] += P · K, P as split A fragments (k = candidates 16·kc ..).
#pragma unroll
        for (int kc = 0; kc < 2; kc++) {
            u32 ph[4], pl[4];
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float a = s[2 * kc + x][2 * r], b = s[2 * kc + x][2 * r + 1];
                    const u32 hh = gm_bf16x2(a, b);
                    ph[2 * x + r] = hh;
                    pl[2 * x + r] = gm_bf16x2_lo(a, b, hh);
                }
#pragma unroll
            for (int np = 0; np < 16; np++) {
                const int row = 16 * kc + (lane & 7) + ((lane >> 3) & 1) * 8;
                const u32 kb = ks + (row * ATC_PITCH + 256 * wd + 16 * np + (lane >> 4) * 8) * 2;
                u32 bh[4], bl[4];
                gm_ldsm4_trans(kb, bh[0], bh[1], bh[2], bh[3]);
                gm_ldsm4_trans(kb + ATC_KPLANE * 2, bl[0], bl[1], bl[2], bl[3]);
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    gm_mma(o[2 * np + x], ph, bh[2 * x], bh[2 * x + 1]);
                    gm_mma(o[2 * np + x], ph, bl[2 * x], bl[2 * x + 1]);
                    gm_mma(o[2 * np + x], pl, bh[2 * x], bh[2 * x + 1]);
                }
            }
        }
        __syncthreads();  // Ks, part and rowp are rewritten by the next tile
    }

    // SPLIT_OUT stages in the freed shared memory once every warp is past its last read of Qs and Ks.
    if (SPLIT_OUT) __syncthreads();
    atc_epilogue<SPLIT_OUT>(o, den, wh, wd, lane, t, pos, rope_dim, inv_freq, out, planes, plane, reinterpret_cast<u16*>(atc_sh) + warp * ATC_STAGE_WARP);
}

#define ATC_ARGS                                                                                                  \
    const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ entries,                  \
        const int* __restrict__ comp_off, const int* __restrict__ comp_idx, const u8* __restrict__ comp_mask,      \
        const float* __restrict__ sinks, const float* __restrict__ inv_freq, float* __restrict__ out, int H, int c, \
        int rope_dim, int pos0, int window, int kv_base, int kv_rows, int n_entries, float scale, u16* __restrict__ planes, long long plane, \
        float q_eps, int q_bf16
#define ATC_PASS q, kv, entries, comp_off, comp_idx, comp_mask, sinks, inv_freq, out, H, c, rope_dim, pos0, window, kv_base, kv_rows, n_entries, scale, planes, plane, q_eps, q_bf16

extern "C" __global__ void __launch_bounds__(ATC_THREADS, 1) sparse_attention_tc(ATC_ARGS) { atc_body<false, false>(ATC_PASS); }
// MLA_STREAM_FAST_EXP: the same kernel with __expf in the online softmax.
extern "C" __global__ void __launch_bounds__(ATC_THREADS, 1) sparse_attention_tc_fast_exp(ATC_ARGS) { atc_body<true, false>(ATC_PASS); }
// MLA_SPLIT_OUT: both with the split bf16 planes as output (planes, plane; out unused).
extern "C" __global__ void __launch_bounds__(ATC_THREADS, 1) sparse_attention_tc_split(ATC_ARGS) { atc_body<false, true>(ATC_PASS); }
extern "C" __global__ void __launch_bounds__(ATC_THREADS, 1) sparse_attention_tc_fast_exp_split(ATC_ARGS) { atc_body<true, true>(ATC_PASS); }

// ---------------------------------------------------------------------------------------------
// sparse_attention_wg — switch MLA_BF16 (issue 6 §4): the streaming attention of sparse_attention_tc
// (same candidates, sink, online softmax, inverse RoPE and epilogue) in DeepSeek's own numerics for
// it — OFF-K's sparse_attn_kernel: Q and K=V in bf16, P rounded to bf16 for P·V, f32 accumulation —
// with one product per fragment on wgmma instead of three on mma.sync. Not exact: gpu-check reports
// its NMSE and max-abs error against the CPU and the split kernel.
//   kv, entries: bf16 copies of the K=V rows (the launcher rounds each f32 row once, gemm_x_bf16);
//   row r of kv is position kv_base + r; every other argument as sparse_attention_tc.
//   Block of AWG_THREADS = 384 threads per query token: warpgroups 0 and 1 multiply (channels 256w …
//   256w + 255 of O; setmaxnreg 224), warpgroup 2 copies (setmaxnreg 56).
//   Copy warpgroup, per tile of 32 candidates: its warp 0 builds the row pointers (att_tile_rows),
//   the warpgroup copies the 32 rows × 1 KB with cp.async (16 B each; zero-filled for missing rows)
//   into a stage of a ring of AWG_ST in the K-major 128-byte-swizzled layout (8 column blocks of 64
//   channels × 32 rows × 128 B), and once those copies have landed (it waits one tile later) fences
//   them for the async proxy and arrives on the stage's full barrier; the stage's candidate mask
//   (bit j: candidate j has a row) goes with it.
//   Multiply warpgroup w: S_w = Q[:, 256w ..] · K[:, 256w ..]ᵀ on 16 wgmma m64n32k16 (Q staged once
//   in the same layout, 64 rows), partial S exchanged through shared memory (two buffers, alternate
//   tiles) and added (a + b = b + a: both warpgroups hold the same S, maxima and denominators),
//   atc_softmax, P as bf16 A fragments from registers, O += P · V on 2 wgmma m64n256k16 with V = the
//   same stage read MN-major (LBO 4 KB between 64-channel column blocks, SBO 1 KB between 8-row
//   groups; PTX ISA "Shared Memory Matrix Layout"); the stage is released after the next tile's
//   wait. Tried and measured slower on H200 (T = 2,048, Flash CSA shape; this loop 0.96 ms):
//   FlashAttention-3's intra-warpgroup overlap (tile i's softmax while P · V of tile i − 1 runs)
//   1.31 ms with 3 stages, 1.12 ms with 4; this loop with 4 stages and the row pointers built
//   before the stage wait 1.00 ms. Epilogue: atc_epilogue (f32 out or, BF16_OUT, the output rounded to bf16 — the hi plane
//   of sparse_attention_tc's split planes alone, at planes[(t·64 + h)·512 + col]; OFF-K's output is
//   bf16 — for the grouped output projection's single bf16 product).
// Launch: grid (T), block 384, dynamic shared memory AwgLayout::TOTAL. sm_90a only (wgmma).
// sparse_attention_wg_fast_exp (with MLA_STREAM_FAST_EXP): __expf in the softmax; the _bf16_out
// entry points write the bf16 output (MLA_SPLIT_OUT). Deterministic: fixed MMA and reduction order.
// Learned from the PTX ISA (wgmma, matrix descriptors, cp.async, mbarrier) and the OFF-K kernel's
// numerics (spec §0); the code is ours.

#define AWG_THREADS 384
#define AWG_ST 3
struct AwgLayout {
    static constexpr int Q = 0;                                // 8 column blocks × 64 rows × 128 B
    static constexpr int STAGE = 32768;                        // 8 column blocks × 32 rows × 128 B
    static constexpr int K = 65536;                            // AWG_ST stages
    static constexpr int PART = K + AWG_ST * STAGE;            // [2 buffers][2 warpgroups][128 threads][16] f32
    static constexpr int VALID = PART + 2 * 2 * 128 * 16 * 4;  // AWG_ST candidate masks (u32)
    static constexpr int ROWP = VALID + 16;                    // [2 tiles][32] row pointers (copy warpgroup)
    static constexpr int BARS = ROWP + 2 * 32 * 8;             // full[AWG_ST], empty[AWG_ST]
    static constexpr int TOTAL = BARS + 2 * AWG_ST * 8 + 1024; // + slack to align the base to 1 KB
};
static_assert(8 * ATC_STAGE_WARP * 2 <= AwgLayout::BARS, "the BF16_OUT staging must fit below the barriers");

// Matrix descriptor of an MN-major 128-byte-swizzled bf16 tile at shared address a whose 64-element
// column blocks are lbo bytes apart (leading byte offset: 4 KB for sparse_attention_wg's 32-row
// tiles, 8 KB for sparse_attention_wc's 64-row ones) and whose 8-row groups are 1 KB apart (stride
// byte offset).
__device__ __forceinline__ unsigned long long awg_desc_mn(u32 a, u32 lbo) {
    return (unsigned long long)((a & 0x3FFFFu) >> 4) | ((unsigned long long)(lbo >> 4) << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void awg_bar_multiply() { asm volatile("bar.sync 1, 256;" ::: "memory"); }
__device__ __forceinline__ void awg_bar_copy() { asm volatile("bar.sync 2, 128;" ::: "memory"); }

template <int A, int B>
__device__ __forceinline__ void awg_fence_regs(float (&d)[A][B]) {
#pragma unroll
    for (int i = 0; i < A; i++)
#pragma unroll
        for (int j = 0; j < B; j++) asm volatile("" : "+f"(d[i][j])::"memory");
}

// S[64 × 32] += A · Bᵀ on wgmma m64n32k16 (bf16 → f32): A and B K-major 128-byte-swizzled tiles in
// shared memory (descriptors da, db); s in the accumulator layout (s[j][e]: row 16·warp + g (e < 2)
// or + 8, column 8j + c2 + (e & 1)).
__device__ __forceinline__ void awg_mma_s(float (&s)[4][4], unsigned long long da, unsigned long long db) {
    GW_ASM("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1, 0, 0;\n"
           : "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]), "+f"(s[1][2]), "+f"(s[1][3]), "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]), "+f"(s[2][3]), "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3])
           : "l"(da), "l"(db));
}

// O[64 × 256] += P · V on wgmma m64n256k16 (bf16 → f32): P from registers (a: the m16n8k16 A
// fragment of this warp's 16 rows, k = 16 candidates), V an MN-major 128-byte-swizzled tile in shared
// memory (descriptor db, transposed: imm-trans-b = 1); o in the accumulator layout (o[j][e]: row
// 16·warp + g (e < 2) or + 8, column 8j + c2 + (e & 1)).
__device__ __forceinline__ void awg_mma_o(float (&o)[32][4], const u32 (&a)[4], unsigned long long db) {
    GW_ASM("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, 1, 1, 1, 1;\n"
           : "+f"(o[0][0]), "+f"(o[0][1]), "+f"(o[0][2]), "+f"(o[0][3]), "+f"(o[1][0]), "+f"(o[1][1]), "+f"(o[1][2]), "+f"(o[1][3]), "+f"(o[2][0]), "+f"(o[2][1]), "+f"(o[2][2]), "+f"(o[2][3]), "+f"(o[3][0]), "+f"(o[3][1]), "+f"(o[3][2]), "+f"(o[3][3]), "+f"(o[4][0]), "+f"(o[4][1]), "+f"(o[4][2]), "+f"(o[4][3]), "+f"(o[5][0]), "+f"(o[5][1]), "+f"(o[5][2]), "+f"(o[5][3]), "+f"(o[6][0]), "+f"(o[6][1]), "+f"(o[6][2]), "+f"(o[6][3]), "+f"(o[7][0]), "+f"(o[7][1]), "+f"(o[7][2]), "+f"(o[7][3]), "+f"(o[8][0]), "+f"(o[8][1]), "+f"(o[8][2]), "+f"(o[8][3]), "+f"(o[9][0]), "+f"(o[9][1]), "+f"(o[9][2]), "+f"(o[9][3]), "+f"(o[10][0]), "+f"(o[10][1]), "+f"(o[10][2]), "+f"(o[10][3]), "+f"(o[11][0]), "+f"(o[11][1]), "+f"(o[11][2]), "+f"(o[11][3]), "+f"(o[12][0]), "+f"(o[12][1]), "+f"(o[12][2]), "+f"(o[12][3]), "+f"(o[13][0]), "+f"(o[13][1]), "+f"(o[13][2]), "+f"(o[13][3]), "+f"(o[14][0]), "+f"(o[14][1]), "+f"(o[14][2]), "+f"(o[14][3]), "+f"(o[15][0]), "+f"(o[15][1]), "+f"(o[15][2]), "+f"(o[15][3]), "+f"(o[16][0]), "+f"(o[16][1]), "+f"(o[16][2]), "+f"(o[16][3]), "+f"(o[17][0]), "+f"(o[17][1]), "+f"(o[17][2]), "+f"(o[17][3]), "+f"(o[18][0]), "+f"(o[18][1]), "+f"(o[18][2]), "+f"(o[18][3]), "+f"(o[19][0]), "+f"(o[19][1]), "+f"(o[19][2]), "+f"(o[19][3]), "+f"(o[20][0]), "+f"(o[20][1]), "+f"(o[20][2]), "+f"(o[20][3]), "+f"(o[21][0]), "+f"(o[21][1]), "+f"(o[21][2]), "+f"(o[21][3]), "+f"(o[22][0]), "+f"(o[22][1]), "+f"(o[22][2]), "+f"(o[22][3]), "+f"(o[23][0]), "+f"(o[23][1]), "+f"(o[23][2]), "+f"(o[23][3]), "+f"(o[24][0]), "+f"(o[24][1]), "+f"(o[24][2]), "+f"(o[24][3]), "+f"(o[25][0]), "+f"(o[25][1]), "+f"(o[25][2]), "+f"(o[25][3]), "+f"(o[26][0]), "+f"(o[26][1]), "+f"(o[26][2]), "+f"(o[26][3]), "+f"(o[27][0]), "+f"(o[27][1]), "+f"(o[27][2]), "+f"(o[27][3]), "+f"(o[28][0]), "+f"(o[28][1]), "+f"(o[28][2]), "+f"(o[28][3]), "+f"(o[29][0]), "+f"(o[29][1]), "+f"(o[29][2]), "+f"(o[29][3]), "+f"(o[30][0]), "+f"(o[30][1]), "+f"(o[30][2]), "+f"(o[30][3]), "+f"(o[31][0]), "+f"(o[31][1]), "+f"(o[31][2]), "+f"(o[31][3])
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

template <bool FAST_EXP, bool BF16_OUT>
__device__ __forceinline__ void awg_body(const float* __restrict__ q, const u16* __restrict__ kv, const u16* __restrict__ entries,
                                         const int* __restrict__ comp_off, const int* __restrict__ comp_idx, const u8* __restrict__ comp_mask,
                                         const float* __restrict__ sinks, const float* __restrict__ inv_freq, float* __restrict__ out,
                                         int H, int c, int rope_dim, int pos0, int window, int kv_base, int kv_rows, int n_entries,
                                         float scale, u16* __restrict__ planes, long long plane, float q_eps, int q_bf16) {
    typedef AwgLayout L;
    extern __shared__ __align__(16) u8 awg_sh[];
    __shared__ int att_cursor;
    if (blockDim.x != AWG_THREADS || H != ATC_H || c != ATC_C) __trap();
    u8* gbase;
    const u32 base = gw_smem_base(awg_sh, L::TOTAL, gbase);
    const u32 full0 = base + L::BARS, empty0 = full0 + AWG_ST * 8;
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < AWG_ST; s++) {
            gws_bar_init(full0 + 8 * s, 128);   // every copy thread, once its copies have landed
            gws_bar_init(empty0 + 8 * s, 256);  // every multiply thread, once its MMAs on it are done
        }
        gws_bar_init_fence();
    }
    const int t = blockIdx.x;
    const AttCands ac = att_cands(t, pos0, window, comp_off, comp_mask, n_entries, &att_cursor);  // synchronises: barriers ready
    const int pos = ac.pos, lo = ac.lo, n_win = ac.n_win, n_cand = ac.n_cand;
    const AttComp cc = ac.cc;
    const int n_tiles = (n_cand + ATC_TILE - 1) / ATC_TILE;
    u32* valid = reinterpret_cast<u32*>(gbase + L::VALID);

    if (tid >= 256) {
        GW_ASM("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
        const int p = tid - 256, lane = tid & 31;
        const int k = p & 63, r0 = p >> 6;  // this thread's 16-byte chunk of rows r0, r0 + 2, … of a tile
        for (int i = 0; i <= n_tiles; i++) {
            if (i < n_tiles) {
                const int s = i % AWG_ST;
                if (i >= AWG_ST) gws_wait(empty0 + 8 * s, ((i / AWG_ST) - 1) & 1);
                const u16** rp = reinterpret_cast<const u16**>(gbase + L::ROWP) + 32 * (i & 1);
                const int b0 = i * ATC_TILE;
                if (p < 32) att_tile_rows(rp, lane, b0, min(ATC_TILE, n_cand - b0), ATC_C, lo, n_win, kv, kv_base, kv_rows, entries, n_entries, comp_idx, cc.c_begin, cc.mrow, cc.n_vis, &att_cursor);
                awg_bar_copy();  // rp ready (read until the barrier of tile i + 1: two buffers)
                if (p == 0) {
                    u32 vm = 0;
                    for (int j = 0; j < ATC_TILE; j++) vm |= (rp[j] != nullptr ? 1u : 0u) << j;
                    valid[s] = vm;
                }
                const u32 sb = base + L::K + s * L::STAGE + (k >> 3) * 4096;
#pragma unroll
                for (int u = 0; u < ATC_TILE / 2; u++) {
                    const int r = r0 + 2 * u;
                    const u16* src = rp[r];
                    gm_cp16(sb + gw_swz(r, k & 7), src != nullptr ? src + 8 * k : kv, src != nullptr);
                }
                gm_commit();
                gm_wait<1>();  // tile i − 1's copies have landed
            } else {
                gm_wait<0>();
            }
            if (i >= 1) {
                gw_fence_proxy();
                gws_arrive(full0 + 8 * ((i - 1) % AWG_ST));
            }
        }
        return;
    }

    GW_ASM("setmaxnreg.inc.sync.aligned.u32 224;" ::: "memory");
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, c2 = (lane & 3) * 2, ct = tid & 127;
    // Q → bf16 in the K-major swizzled layout (the (cos, sin) pairs of MLA_FUSED_Q_NORM in the
    // partials' shared memory, unused until the first tile), then made visible to wgmma.
    u8* qg = gbase + L::Q;
    atc_stage_q(
        q, t, c, q_eps, q_bf16, rope_dim, pos, inv_freq, reinterpret_cast<float2*>(gbase + L::PART), tid,
        [&](int row, int e, float4 v) {
            *reinterpret_cast<uint2*>(qg + (e >> 6) * 8192 + gw_swz(row, (e & 63) >> 3) + (e & 7) * 2) = make_uint2(gm_bf16x2(v.x, v.y), gm_bf16x2(v.z, v.w));
        },
        [] { awg_bar_multiply(); });
    gw_fence_proxy();
    awg_bar_multiply();

    float m[2], den[2], o[32][4];
    atc_state_init(sinks, 16 * wq + g, m, den, o);
    float* part = reinterpret_cast<float*>(gbase + L::PART);

    for (int i = 0; i < n_tiles; i++) {  // block-uniform trip count
        const int s = i % AWG_ST;
        const u32 sb = base + L::K + s * L::STAGE;
        gws_wait(full0 + 8 * s, (i / AWG_ST) & 1);
        float sa[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sa[j][e] = 0.f;
        gw_fence();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            const u32 cb = 4 * wg + (kk >> 2), ko = (kk & 3) * 32;
            awg_mma_s(sa, gw_desc(base + L::Q + cb * 8192 + ko), gw_desc(sb + cb * 4096 + ko));
        }
        gw_commit();
        gw_wait0();  // this tile's S and the previous tile's P · V
        awg_fence_regs(sa);
        awg_fence_regs(o);
        if (i >= 1) gws_arrive(empty0 + 8 * ((i - 1) % AWG_ST));
        // Exchange partials with the other warpgroup (thread ct there holds the same elements).
        float4* mine = reinterpret_cast<float4*>(part + (((i & 1) * 2 + wg) * 128 + ct) * 16);
        const float4* other = reinterpret_cast<const float4*>(part + (((i & 1) * 2 + (wg ^ 1)) * 128 + ct) * 16);
#pragma unroll
        for (int j = 0; j < 4; j++) mine[j] = make_float4(sa[j][0], sa[j][1], sa[j][2], sa[j][3]);
        awg_bar_multiply();
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float4 v = other[j];
            sa[j][0] += v.x;
            sa[j][1] += v.y;
            sa[j][2] += v.z;
            sa[j][3] += v.w;
        }
        const u32 vm = valid[s];
        float corr[2];
        atc_softmax<FAST_EXP>(sa, m, den, corr, scale, c2, [&](int col) { return ((vm >> col) & 1u) != 0u; });
        atc_rescale(o, corr);
        // O[64 heads, this warpgroup's 256 channels] += P · V, P as bf16 A fragments (k = candidates 16·kc ..).
        gw_fence();
#pragma unroll
        for (int kc = 0; kc < 2; kc++) {
            u32 a[4];
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int r = 0; r < 2; r++) a[2 * x + r] = gm_bf16x2(sa[2 * kc + x][2 * r], sa[2 * kc + x][2 * r + 1]);
            awg_mma_o(o, a, awg_desc_mn(sb + 4 * wg * 4096 + kc * 2048, 4096));
        }
        gw_commit();
    }
    gw_wait0();
    awg_fence_regs(o);

    // BF16_OUT stages in the freed shared memory once both multiply warpgroups are past their MMAs
    // (the copy warpgroup has finished: every stage it wrote was awaited).
    if (BF16_OUT) awg_bar_multiply();
    atc_epilogue<BF16_OUT, false>(o, den, wq, wg, lane, t, pos, rope_dim, inv_freq, out, planes, plane, reinterpret_cast<u16*>(gbase) + warp * ATC_STAGE_WARP);
}

#define AWG_ARGS                                                                                                  \
    const float* __restrict__ q, const u16* __restrict__ kv, const u16* __restrict__ entries,                      \
        const int* __restrict__ comp_off, const int* __restrict__ comp_idx, const u8* __restrict__ comp_mask,      \
        const float* __restrict__ sinks, const float* __restrict__ inv_freq, float* __restrict__ out, int H, int c, \
        int rope_dim, int pos0, int window, int kv_base, int kv_rows, int n_entries, float scale, u16* __restrict__ planes, long long plane, \
        float q_eps, int q_bf16

extern "C" __global__ void __launch_bounds__(AWG_THREADS, 1) sparse_attention_wg(AWG_ARGS) { awg_body<false, false>(ATC_PASS); }
extern "C" __global__ void __launch_bounds__(AWG_THREADS, 1) sparse_attention_wg_fast_exp(AWG_ARGS) { awg_body<true, false>(ATC_PASS); }
extern "C" __global__ void __launch_bounds__(AWG_THREADS, 1) sparse_attention_wg_bf16_out(AWG_ARGS) { awg_body<false, true>(ATC_PASS); }
extern "C" __global__ void __launch_bounds__(AWG_THREADS, 1) sparse_attention_wg_fast_exp_bf16_out(AWG_ARGS) { awg_body<true, true>(ATC_PASS); }

// ---------------------------------------------------------------------------------------------
// sparse_attention_wc — switch MLA_BF16_CAND_SPLIT (with MLA_BF16): sparse_attention_wg's attention
// (the same candidates in the same numerics class: Q, K=V and P in bf16, f32 accumulation; the same
// sink, inverse RoPE and epilogue) with the two multiply warpgroups splitting each step of 128
// candidates by candidates instead of by channels, so that neither adds the other's partial logits:
//   warpgroup b (0 or 1) computes S_b = Q · K_bᵀ over all 512 channels for its own 64 candidates
//   (block b of the step: candidates 128·i + 64·b …) on 32 wgmma m64n64k16, takes the row maxima
//   through shared memory (warpgroup 0's first, max m0 with the running max, then warpgroup 1's,
//   which is the step's new running max M), and forms P_b = exp2(S_b·scale·log2 e − m) in bf16 (m:
//   m0 for warpgroup 0, M for warpgroup 1); warpgroup w owns O's channels 256·w … 256·w + 255 and
//   adds P_0 · V_0 and P_1 · V_1 for them (m64n256k16: its own P from registers, the other's from
//   shared memory). Warpgroup 0 adds its own product relative to m0, then rescales O and its
//   denominator by exp2(m0 − M) and stores its P tile times that factor, so that everything is
//   relative to M before the other block's product. Each keeps its own partial denominator; the
//   two are added at the end.
// The K=V rows of a step: four 32 KB halves (block 0 channels 0-255 "0L", 256-511 "0R", block 1
// "1L", "1R"), each 4 column blocks × 64 rows × 128 B in the 128-byte-swizzled layout (K-major for
// Q · Kᵀ, MN-major for P · V: LBO 8 KB between column blocks, SBO 1 KB between 8-row groups), each
// with its own full and empty mbarrier, refilled in the order their last reader frees them (0L:
// warpgroup 0 after its own P · V; 1R: warpgroup 1 after its own; 0R: warpgroup 1 after the other's;
// 1L: warpgroup 0 after the other's), so that the next step's copies start while this one finishes.
// Copy warpgroup: each thread computes the rows it copies itself (8 per step: rows grp + 16u of both
// blocks, 8 threads per 128 contiguous bytes; the list indices of a step loaded together; the mask
// path: warp 0 scans the mask as att_tile_rows does, the others wait), copies them with cp.async
// (16 B each; zero-filled for missing rows) and arrives on each half's full barrier when its copies
// land (cp.async.mbarrier.arrive.noinc); each copy warp's lane 0 also arrives, after writing its
// rows' bits of the step's candidate masks (warp ballots; bit j: candidate j of the block has a
// row; two steps' buffers). Q staged as in sparse_attention_wg; the epilogue's (cos, sin) from a
// per-block table. Learned from the PTX ISA (wgmma, cp.async.mbarrier.arrive, named barriers) and
// the design of DeepSeek's FlashMLA sparse prefill kernel for Hopper (csrc/sm90/prefill/sparse:
// each warpgroup's own top-k block, P exchanged through shared memory); the code is ours.
// Launch: grid (T), block 384, dynamic shared memory AwcLayout::TOTAL. sm_90a only (wgmma).
// Deterministic: fixed MMA and reduction order.

// Skipping the empty block of the last step (awc_body's tail_empty): 1 (the default); 0 computes
// it as any other (timing only, FLASHSEEK_KERNEL_DEFINES: the same values but for the sign of an
// exact zero).
#ifndef AWC_TAIL_SKIP
#define AWC_TAIL_SKIP 1
#endif

struct AwcLayout {
    static constexpr int Q = 0;                  // 8 column blocks × 64 rows × 128 B
    static constexpr int HALF = 32768;           // 4 column blocks × 64 rows × 128 B
    static constexpr int KV = 65536;             // halves 0L, 0R, 1L, 1R
    static constexpr int P = KV + 4 * HALF;      // [2] P tiles, 64 heads × 64 candidates bf16, K-major swizzled
    static constexpr int M = P + 2 * 8192;       // [2][64] f32 row maxima (warpgroup 0's, warpgroup 1's)
    static constexpr int L = M + 2 * 64 * 4;     // [2][64] f32 denominators
    static constexpr int VALID = L + 2 * 64 * 4; // [2 steps][2 blocks][4 copy warps] u64 candidate masks
    static constexpr int ROWP = VALID + 128;     // [128] row pointers (the mask path)
    static constexpr int CS = ROWP + 128 * 8;    // [ATC_C / 2] float2 (cos, sin) of the output's inverse RoPE
    static constexpr int BARS = CS + ATC_C / 2 * 8; // full[4], empty[4]
    static constexpr int TOTAL = BARS + 8 * 8 + 1024;
};
static_assert(8 * ATC_STAGE_WARP * 2 <= AwcLayout::P, "the BF16_OUT staging must fit below the P tiles");
static_assert(AwcLayout::TOTAL == 218304, "ATTENTION_WC_SMEM in ops_attention.rs launches with this many bytes");

// Named barriers of the multiply warpgroups (0: __syncthreads, 1: awg_bar_multiply, 2: awg_bar_copy).
#define AWC_M0 3  // warpgroup 0's maxima written
#define AWC_M1 4  // warpgroup 1's maxima (the step's M) written
#define AWC_P0 5  // warpgroup 0's P tile stored
#define AWC_P1 6  // warpgroup 1's P tile stored
template <int ID>
__device__ __forceinline__ void awc_arrive() { asm volatile("bar.arrive %0, 256;" ::"n"(ID) : "memory"); }
template <int ID>
__device__ __forceinline__ void awc_sync() { asm volatile("bar.sync %0, 256;" ::"n"(ID) : "memory"); }
// x, opaque to the compiler: descriptors derived from it are computed where they are used instead of
// all hoisted out of the step loop (32 + 32 + 8 64-bit values: more than the registers left).
__device__ __forceinline__ u32 awc_opaque(u32 x) {
    u32 r;
    asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}
// 2^x on the hardware unit (ex2.approx.ftz: relative error ~2^-22, far below P's bf16 rounding;
// 2^−inf = +0, large negative x flush to +0).
__device__ __forceinline__ float awc_ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// Arrives on mbarrier bar once every cp.async this thread issued before has landed (no pending-count
// increment: the arrival counts against the barrier's expected count).
__device__ __forceinline__ void awc_cp_arrive(u32 bar) { GW_ASM("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory"); }

// S[64 × 64] += A · Bᵀ on wgmma m64n64k16 (bf16 → f32), both K-major swizzled in shared memory.
__device__ __forceinline__ void awc_mma_s(float (&s)[8][4], unsigned long long da, unsigned long long db) {
    GW_ASM("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1, 0, 0;\n"
           : "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]), "+f"(s[1][2]), "+f"(s[1][3]), "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]), "+f"(s[2][3]), "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3]), "+f"(s[4][0]), "+f"(s[4][1]), "+f"(s[4][2]), "+f"(s[4][3]), "+f"(s[5][0]), "+f"(s[5][1]), "+f"(s[5][2]), "+f"(s[5][3]), "+f"(s[6][0]), "+f"(s[6][1]), "+f"(s[6][2]), "+f"(s[6][3]), "+f"(s[7][0]), "+f"(s[7][1]), "+f"(s[7][2]), "+f"(s[7][3])
           : "l"(da), "l"(db));
}

// O[64 × 256] += P · V on wgmma m64n256k16 with P (K-major) and V (MN-major, transposed) both in
// shared memory.
__device__ __forceinline__ void awc_mma_o_ss(float (&o)[32][4], unsigned long long da, unsigned long long db) {
    GW_ASM("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, 1, 1, 1, 0, 1;\n"
           : "+f"(o[0][0]), "+f"(o[0][1]), "+f"(o[0][2]), "+f"(o[0][3]), "+f"(o[1][0]), "+f"(o[1][1]), "+f"(o[1][2]), "+f"(o[1][3]), "+f"(o[2][0]), "+f"(o[2][1]), "+f"(o[2][2]), "+f"(o[2][3]), "+f"(o[3][0]), "+f"(o[3][1]), "+f"(o[3][2]), "+f"(o[3][3]), "+f"(o[4][0]), "+f"(o[4][1]), "+f"(o[4][2]), "+f"(o[4][3]), "+f"(o[5][0]), "+f"(o[5][1]), "+f"(o[5][2]), "+f"(o[5][3]), "+f"(o[6][0]), "+f"(o[6][1]), "+f"(o[6][2]), "+f"(o[6][3]), "+f"(o[7][0]), "+f"(o[7][1]), "+f"(o[7][2]), "+f"(o[7][3]), "+f"(o[8][0]), "+f"(o[8][1]), "+f"(o[8][2]), "+f"(o[8][3]), "+f"(o[9][0]), "+f"(o[9][1]), "+f"(o[9][2]), "+f"(o[9][3]), "+f"(o[10][0]), "+f"(o[10][1]), "+f"(o[10][2]), "+f"(o[10][3]), "+f"(o[11][0]), "+f"(o[11][1]), "+f"(o[11][2]), "+f"(o[11][3]), "+f"(o[12][0]), "+f"(o[12][1]), "+f"(o[12][2]), "+f"(o[12][3]), "+f"(o[13][0]), "+f"(o[13][1]), "+f"(o[13][2]), "+f"(o[13][3]), "+f"(o[14][0]), "+f"(o[14][1]), "+f"(o[14][2]), "+f"(o[14][3]), "+f"(o[15][0]), "+f"(o[15][1]), "+f"(o[15][2]), "+f"(o[15][3]), "+f"(o[16][0]), "+f"(o[16][1]), "+f"(o[16][2]), "+f"(o[16][3]), "+f"(o[17][0]), "+f"(o[17][1]), "+f"(o[17][2]), "+f"(o[17][3]), "+f"(o[18][0]), "+f"(o[18][1]), "+f"(o[18][2]), "+f"(o[18][3]), "+f"(o[19][0]), "+f"(o[19][1]), "+f"(o[19][2]), "+f"(o[19][3]), "+f"(o[20][0]), "+f"(o[20][1]), "+f"(o[20][2]), "+f"(o[20][3]), "+f"(o[21][0]), "+f"(o[21][1]), "+f"(o[21][2]), "+f"(o[21][3]), "+f"(o[22][0]), "+f"(o[22][1]), "+f"(o[22][2]), "+f"(o[22][3]), "+f"(o[23][0]), "+f"(o[23][1]), "+f"(o[23][2]), "+f"(o[23][3]), "+f"(o[24][0]), "+f"(o[24][1]), "+f"(o[24][2]), "+f"(o[24][3]), "+f"(o[25][0]), "+f"(o[25][1]), "+f"(o[25][2]), "+f"(o[25][3]), "+f"(o[26][0]), "+f"(o[26][1]), "+f"(o[26][2]), "+f"(o[26][3]), "+f"(o[27][0]), "+f"(o[27][1]), "+f"(o[27][2]), "+f"(o[27][3]), "+f"(o[28][0]), "+f"(o[28][1]), "+f"(o[28][2]), "+f"(o[28][3]), "+f"(o[29][0]), "+f"(o[29][1]), "+f"(o[29][2]), "+f"(o[29][3]), "+f"(o[30][0]), "+f"(o[30][1]), "+f"(o[30][2]), "+f"(o[30][3]), "+f"(o[31][0]), "+f"(o[31][1]), "+f"(o[31][2]), "+f"(o[31][3])
           : "l"(da), "l"(db));
}

// The arguments of sparse_attention_wg (AWG_ARGS).
template <bool BF16_OUT, bool FP8_OUT = false>
__device__ __forceinline__ void awc_body(AWG_ARGS) {
    typedef AwcLayout L;
    extern __shared__ __align__(16) u8 awc_sh[];
    __shared__ int att_cursor;
    if (blockDim.x != AWG_THREADS || H != ATC_H || c != ATC_C) __trap();
    u8* gbase;
    const u32 base = gw_smem_base(awc_sh, L::TOTAL, gbase);
    const u32 full0 = base + L::BARS, empty0 = full0 + 4 * 8;
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int h = 0; h < 4; h++) {
            gws_bar_init(full0 + 8 * h, 128 + 4);  // every copy thread's landed copies, and each copy warp's lane 0
            gws_bar_init(empty0 + 8 * h, 4);       // the 4 warps of the warpgroup that reads it last
        }
        gws_bar_init_fence();
    }
    const int t = blockIdx.x;
    const AttCands ac = att_cands(t, pos0, window, comp_off, comp_mask, n_entries, &att_cursor);  // synchronises: barriers ready
    const int pos = ac.pos, lo = ac.lo, n_win = ac.n_win, n_cand = ac.n_cand;
    const AttComp cc = ac.cc;
    const int n_steps = (n_cand + 127) / 128;
    // Block 1 of the last step holds no candidate (n_cand ≤ 128 (n_steps − 1) + 64: e.g. an HCA
    // layer below position 8,192, window 128 + ≤ 64 entries): its rows are not copied, warpgroup 1
    // multiplies nothing for its S or own P · V and warpgroup 0 skips the other block's P · V — the
    // products of P = 0 that those MMAs would add (every barrier still runs as in any step).
    const bool tail_empty = AWC_TAIL_SKIP && n_cand <= 128 * (n_steps - 1) + 64;

    if (tid >= 256) {
        GW_ASM("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
        // Thread p copies 16-byte chunk gi of every 128 bytes of rows grp + 16u (u < 4) of both
        // blocks (eight threads per 128 contiguous bytes), so it holds only its 8 rows' addresses.
        const int p = tid - 256, lane = tid & 31, pw = p >> 5;
        const int gi = p & 7, grp = p >> 3;
        const bool mask_path = cc.mrow != nullptr;
        const u16** rps = reinterpret_cast<const u16**>(gbase + L::ROWP);
        // Row 4b + u (block b, row grp + 16u of the step) as an index: entry e → 2e + 1, window row
        // r → 2r, none → ~0u (32-bit: fewer registers than pointers in the 56 this warpgroup has).
        u32 rows[8];
        int eidx[8];  // the list entries of a step's rows
        auto cand = [&](int i, int x) { return i * 128 + 64 * (x >> 2) + grp + 16 * (x & 3); };
        auto load_idx = [&](int i) {
#pragma unroll
            for (int x = 0; x < 8; x++) {
                const int j = cand(i, x);
                eidx[x] = j >= n_win && j < n_cand && comp_idx != nullptr ? __ldg(comp_idx + cc.c_begin + j - n_win) : j - n_win;
            }
        };
        auto make_rows = [&](int i) {
#pragma unroll
            for (int x = 0; x < 8; x++) {
                const int j = cand(i, x), r = lo + j - kv_base, e = eidx[x];
                rows[x] = j < n_win ? (r >= 0 && r < kv_rows ? 2u * (u32)r : ~0u) : (j < n_cand && e >= 0 && e < n_entries ? 2u * (u32)e + 1u : ~0u);
            }
        };
        auto row_src = [&](u32 rid) { return ((rid & 1u) ? entries : kv) + (size_t)(rid >> 1) * ATC_C; };
        // The mask path's rows: warp 0 scans the mask (att_tile_rows, in candidate order).
        auto mask_rows = [&](int i) {
            if (p < 32)
#pragma unroll 1
                for (int x = 0; x < 4; x++) {
                    const int b0 = i * 128 + 32 * x;
                    att_tile_rows(rps + 32 * x, lane, b0, min(32, n_cand - b0), ATC_C, lo, n_win, kv, kv_base, kv_rows, entries, n_entries, comp_idx, cc.c_begin, cc.mrow, cc.n_vis, &att_cursor);
                }
            awg_bar_copy();
#pragma unroll
            for (int x = 0; x < 8; x++) {
                const u16* q = rps[64 * (x >> 2) + grp + 16 * (x & 3)];
                // att_tile_rows points into entries only for the compressed slots, else into kv.
                rows[x] = q == nullptr ? ~0u : (cand(i, x) >= n_win ? 2u * (u32)((q - entries) / ATC_C) + 1u : 2u * (u32)((q - kv) / ATC_C));
            }
            awg_bar_copy();  // read before warp 0 rebuilds them
        };
        if (mask_path) {
            mask_rows(0);
        } else {
            load_idx(0);
            make_rows(0);
        }
        for (int i = 0; i < n_steps; i++) {
            // This step's candidate masks, per block and copy warp (its rows 4·pw + q + 16u, q < 4:
            // lanes 8q), published by each lane 0's arrival on the halves' full barriers. The last
            // readers of this buffer, step i − 2's, are done: during step i − 1 this warp awaited
            // every half's empty phase that step i − 2's readers completed (each frees a half only
            // after reading its block's mask).
            unsigned long long* vp = reinterpret_cast<unsigned long long*>(gbase + L::VALID) + (i & 1) * 8;
#pragma unroll
            for (int b = 0; b < 2; b++) {
                unsigned long long bits = 0;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const u32 bal = __ballot_sync(0xffffffffu, rows[4 * b + u] != ~0u);
#pragma unroll
                    for (int q = 0; q < 4; q++) bits |= (unsigned long long)((bal >> (8 * q)) & 1u) << (4 * pw + q + 16 * u);
                }
                if (lane == 0) vp[4 * b + pw] = bits;
            }
#pragma unroll
            for (int x = 0; x < 4; x++) {  // unrolled: rows[] stays in registers
                const int h = x == 0 ? 0 : x == 1 ? 3 : x == 2 ? 1 : 2;  // 0L, 1R, 0R, 1L
                const int b = h >> 1, sd = h & 1;
                if (i >= 1) gws_wait(empty0 + 8 * h, (i - 1) & 1);
                const u32 dst = base + L::KV + h * L::HALF;
                if (!(b == 1 && tail_empty && i == n_steps - 1)) {  // else read by no MMA
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const int r = grp + 16 * u;
                        const u32 rid = rows[4 * b + u];
                        const bool ok = rid != ~0u;
                        const u16* src = ok ? row_src(rid) + 256 * sd + 8 * gi : kv;
#pragma unroll
                        for (int tt = 0; tt < 4; tt++) gm_cp16(dst + tt * 8192 + gw_swz(r, gi), src + (ok ? 64 * tt : 0), ok);
                    }
                }
                awc_cp_arrive(full0 + 8 * h);
                if (lane == 0) gws_arrive(full0 + 8 * h);
            }
            if (i + 1 < n_steps) {
                if (mask_path) {
                    mask_rows(i + 1);
                } else {
                    // The next step's indices, all eight loads in flight at once (held across the
                    // copies above they would not fit this warpgroup's registers); the copy
                    // warpgroup runs ahead of the multiply warpgroups, so their latency is hidden.
                    load_idx(i + 1);
                    make_rows(i + 1);
                }
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }

    GW_ASM("setmaxnreg.inc.sync.aligned.u32 224;" ::: "memory");
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, c2 = (lane & 3) * 2;
    const int r0 = 16 * wq + g;  // this thread's head rows r0, r0 + 8
    u8* qg = gbase + L::Q;
    float2* cs_tab = reinterpret_cast<float2*>(gbase + L::CS);
    atc_stage_q(
        q, t, c, q_eps, q_bf16, rope_dim, pos, inv_freq, cs_tab, tid,
        [&](int row, int e, float4 v) {
            *reinterpret_cast<uint2*>(qg + (e >> 6) * 8192 + gw_swz(row, (e & 63) >> 3) + (e & 7) * 2) = make_uint2(gm_bf16x2(v.x, v.y), gm_bf16x2(v.z, v.w));
        },
        [] { awg_bar_multiply(); });
    // The epilogue's (cos, sin) pairs at this token's position (atc_epilogue's values; with raw
    // queries atc_stage_q has made the same table for their RoPE).
    if (q_eps < 0.f) atc_rope_pairs(cs_tab, pos, inv_freq, rope_dim, tid);
    gw_fence_proxy();
    awg_bar_multiply();

    const float LOG2E = 1.4426950408889634f;
    const float scale2 = scale * LOG2E;
    // Running max (log2 units, from the sink), this thread's partial denominator (the sink's term 1
    // counted once per row: warpgroup 0, first lane of the row's four), O's 256 channels of this
    // warpgroup.
    float M[2] = {sinks[r0] * LOG2E, sinks[r0 + 8] * LOG2E};
    float den[2];
    den[0] = den[1] = (wg == 0 && (lane & 3) == 0) ? 1.f : 0.f;
    float o[32][4];
#pragma unroll
    for (int j = 0; j < 32; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.f;
    float s[8][4];
    float* sM = reinterpret_cast<float*>(gbase + L::M);
    float* sL = reinterpret_cast<float*>(gbase + L::L);
    u8* sP = gbase + L::P;
    const int b = wg;  // this warpgroup's candidate block of every step
    const u32 hq = 2 * b;  // its block's left half (the right one is hq + 1)

    // S_b = Q · K_bᵀ, one half of the block's channels (x = 0: the half the copy warpgroup fills
    // first, whose 16 wgmma also start from zero), committed as one group.
    // (An empty block — tail_empty, block 1 — awaits its halves and leaves S at zero: its logits
    // are all masked.)
    auto issue_qk_half = [&](int i, int x) {
        if (x == 0) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = 0.f;
        }
        const int sd = b == 0 ? x : 1 - x;
        gws_wait(full0 + 8 * (hq + sd), i & 1);
        if (b == 1 && tail_empty && i == n_steps - 1) return;
        gw_fence_proxy();
        const u32 ob = awc_opaque(base);
        gw_fence();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            const int cb = 4 * sd + (kk >> 2);
            const u32 ko = (kk & 3) * 32;
            awc_mma_s(s, gw_desc(ob + L::Q + cb * 8192 + ko), gw_desc(ob + L::KV + (hq + sd) * L::HALF + (cb & 3) * 8192 + ko));
        }
        gw_commit();
    };
    // Masked, scaled logits (log2 units) and their row maxima over the quad.
    auto logits = [&](int i, float (&mx)[2]) {
        const volatile unsigned long long* vp = reinterpret_cast<const volatile unsigned long long*>(gbase + L::VALID) + (i & 1) * 8 + 4 * b;
        const unsigned long long vm = vp[0] | vp[1] | vp[2] | vp[3];
        mx[0] = mx[1] = ATT_NEG_INF;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float l = ((vm >> (8 * j + c2 + (e & 1))) & 1ull) ? s[j][e] * scale2 : ATT_NEG_INF;
                s[j][e] = l;
                mx[e >> 1] = fmaxf(mx[e >> 1], l);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
    };
    // P = exp2(l − m) in place, den scaled by corr and the row sums added; O scaled by corr.
    auto exponentiate = [&](const float (&m)[2], const float (&corr)[2]) {
        den[0] *= corr[0];
        den[1] *= corr[1];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float pv = awc_ex2(s[j][e] - m[e >> 1]);  // masked: ex2(−inf) = +0
                s[j][e] = pv;
                den[e >> 1] += pv;
            }
        atc_rescale(o, corr);
    };
    // O += P · V of this warpgroup's own block (P from registers, bf16 A fragments).
    auto issue_pv_own = [&] {
        u32 a[4][4];
#pragma unroll
        for (int kc = 0; kc < 4; kc++)
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int r = 0; r < 2; r++) a[kc][2 * x + r] = gm_bf16x2(s[2 * kc + x][2 * r], s[2 * kc + x][2 * r + 1]);
        const u32 ob = awc_opaque(base);
        gw_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) awg_mma_o(o, a[kc], awg_desc_mn(ob + L::KV + (2 * b + wg) * L::HALF + kc * 2048, 8192));
        gw_commit();
    };
    // O += P · V of the other block (P from the other warpgroup's tile in shared memory).
    auto issue_pv_other = [&] {
        const int bo = 1 - b;
        const u32 ob = awc_opaque(base);
        gw_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) awc_mma_o_ss(o, gw_desc(ob + L::P + bo * 8192 + kc * 32), awg_desc_mn(ob + L::KV + (2 * bo + wg) * L::HALF + kc * 2048, 8192));
        gw_commit();
    };
    // This warpgroup's P (times f per row) into its tile, for the other warpgroup's P · V.
    auto store_p = [&](const float (&f)[2]) {
        u8* tile = sP + b * 8192;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                *reinterpret_cast<u32*>(tile + gw_swz(r0 + 8 * r, j) + c2 * 2) = gm_bf16x2(s[j][2 * r] * f[r], s[j][2 * r + 1] * f[r]);
        gw_fence_proxy();
    };
    auto free_half = [&](int h) {
        __syncwarp();
        if (lane == 0) gws_arrive(empty0 + 8 * h);
    };

    if (wg == 0 && n_steps > 0) {  // n_steps ≥ 1 whenever window ≥ 1 (the host checks it)
        issue_qk_half(0, 0);
        issue_qk_half(0, 1);
        gw_wait0();
        awg_fence_regs(s);
        for (int i = 0; i < n_steps; i++) {
            float mx[2], m0[2], corr[2];
            logits(i, mx);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                m0[r] = fmaxf(M[r], mx[r]);
                corr[r] = awc_ex2(M[r] - m0[r]);
            }
            if ((lane & 3) == 0) {
                sM[r0] = m0[0];
                sM[r0 + 8] = m0[1];
            }
            awc_arrive<AWC_M0>();
            exponentiate(m0, corr);
            issue_pv_own();
            gw_wait0();
            awg_fence_regs(o);
            free_half(0);  // 0L
            awc_sync<AWC_M1>();
            float f[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float m1 = sM[64 + r0 + 8 * r];
                f[r] = awc_ex2(m0[r] - m1);
                M[r] = m1;
                den[r] *= f[r];
            }
            store_p(f);
            awc_arrive<AWC_P0>();
            atc_rescale(o, f);
            awc_sync<AWC_P1>();
            gw_fence_proxy();  // 1L was awaited by warpgroup 1: its copies, seen through the barrier, for this warpgroup's wgmma
            if (!(tail_empty && i == n_steps - 1)) issue_pv_other();
            if (i + 1 < n_steps) {
                // The next step's first half (0L, freed earliest) while P · V runs; 1L is freed
                // before awaiting 0R, whose copy follows 1R's in the copy warpgroup's order.
                issue_qk_half(i + 1, 0);
                gw_wait1();
                awg_fence_regs(o);
                free_half(2);  // 1L
                issue_qk_half(i + 1, 1);
                gw_wait0();
                awg_fence_regs(s);
            } else {
                gw_wait0();
                awg_fence_regs(o);
                free_half(2);
            }
        }
    } else if (wg == 1) {
        for (int i = 0; i < n_steps; i++) {
            issue_qk_half(i, 0);
            issue_qk_half(i, 1);
            gw_wait0();
            awg_fence_regs(s);
            float mx[2], m1[2], corr[2];
            logits(i, mx);
            awc_sync<AWC_M0>();
#pragma unroll
            for (int r = 0; r < 2; r++) {
                m1[r] = fmaxf(sM[r0 + 8 * r], mx[r]);
                corr[r] = awc_ex2(M[r] - m1[r]);
                M[r] = m1[r];
            }
            if ((lane & 3) == 0) {
                sM[64 + r0] = m1[0];
                sM[64 + r0 + 8] = m1[1];
            }
            awc_arrive<AWC_M1>();
            exponentiate(m1, corr);
            if (!(tail_empty && i == n_steps - 1)) issue_pv_own();
            const float one[2] = {1.f, 1.f};
            store_p(one);
            awc_arrive<AWC_P1>();
            awc_sync<AWC_P0>();
            gw_fence_proxy();  // likewise 0R, awaited by warpgroup 0
            issue_pv_other();
            gw_wait1();
            free_half(3);  // 1R
            gw_wait0();
            awg_fence_regs(o);
            free_half(1);  // 0R
        }
    }

    // The two partial denominators per row: over the quad, then across the warpgroups.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        den[r] += __shfl_xor_sync(0xffffffffu, den[r], 1);
        den[r] += __shfl_xor_sync(0xffffffffu, den[r], 2);
    }
    if ((lane & 3) == 0) {
        sL[64 * wg + r0] = den[0];
        sL[64 * wg + r0 + 8] = den[1];
    }
    awg_bar_multiply();  // also: both warpgroups past their last MMA (BF16_OUT stages over Q and K=V)
    const float dsum[2] = {sL[r0] + sL[64 + r0], sL[r0 + 8] + sL[64 + r0 + 8]};
    if constexpr (FP8_OUT) {
        atc_epilogue_fp8(o, dsum, wq, wg, lane, t, pos, rope_dim, inv_freq, out, reinterpret_cast<u8*>(planes), gbase + warp * (2 * ATC_STAGE_WARP), cs_tab);
    } else {
        atc_epilogue<BF16_OUT, false>(o, dsum, wq, wg, lane, t, pos, rope_dim, inv_freq, out, planes, plane, reinterpret_cast<u16*>(gbase) + warp * ATC_STAGE_WARP, cs_tab);
    }
}

extern "C" __global__ void __launch_bounds__(AWG_THREADS, 1) sparse_attention_wc(AWG_ARGS) { awc_body<false>(ATC_PASS); }
extern "C" __global__ void __launch_bounds__(AWG_THREADS, 1) sparse_attention_wc_bf16_out(AWG_ARGS) { awc_body<true>(ATC_PASS); }
// WO_A_FP8: the output quantized for the FP8 grouped output projection (atc_epilogue_fp8): e4m3
// bytes [T, H, c] into planes (as u8) and their 1 × 128 scales [T, H·c/128] into out (f32).
extern "C" __global__ void __launch_bounds__(AWG_THREADS, 1) sparse_attention_wc_fp8_out(AWG_ARGS) { awc_body<true, true>(ATC_PASS); }
