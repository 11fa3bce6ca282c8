// gemm_tile.cuh: the tiled matrix-product core of fc1's kernels (fast/4_linear_splitk.cu), on the tensor
// cores in 3xTF32 (Precision::Fp32) or in bf16 (Precision::Bf16; tensor_core.cuh):
//
//   C[m][n] = sum_k A(m, k) * B(k, n)
//
// A block of GEMM_THREADS threads computes one 64 x 64 tile of C on the tensor cores, 16 values per
// thread in registers. The operands pass through shared memory TILE_K steps of k at a time, so each
// element loaded from global memory is used 64 times. A and B are Dense matrices with any strides;
// A_K_CONTIGUOUS / B_N_CONTIGUOUS say which index of the operand is adjacent in memory, so that each copy
// takes adjacent addresses. (conv2's kernels stage whole images instead: fast/2_conv2_implicit_gemm.cu.)
//
// Each output is a sum over k in a fixed order: results are deterministic.
#pragma once
#include "tensor_core.cuh"

// TILE_M, TILE_N, TILE_K, GEMM_THREADS, GEMM_MIN_BLOCKS (blocks per SM, which caps the registers so that
// enough warps hide each other's latency) and GEMM_STAGES (the k-steps the copy ring holds) come from
// mnist_cuda/ops/linear_splitk.py.
#if !defined(TILE_M) || !defined(TILE_N) || !defined(TILE_K) || !defined(GEMM_THREADS) || !defined(GEMM_MIN_BLOCKS) || \
    !defined(GEMM_STAGES)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#define TILE_PAD \
    8  // an operand staged k-major has rows of lines+8 floats (a multiple of 8 banks, but not of
       // 32): the lanes of a fragment load, rows k+t and lines g, hit banks 8t+g, all different
#define TILE_K_PAD \
    4  // an operand staged line-major has rows of TILE_K+4 floats: the lanes of a 3xTF32
       // fragment load hit banks 20g+t, all different (bf16's k = 2t pairs: 2-way), and each
       // row starts 16-byte aligned for the copies

// An operand: its line j (A's row m, B's column n), element k is p[j*sj + k*sk]; lines x len elements.
struct Dense {
    const float* p;
    int lines, len, sj, sk;
};

// One k-step of an operand in shared memory: LINES lines x TILE_K, stored in the order of the operand's
// contiguous index, so that each copy of 4 adjacent elements lands in 16 adjacent bytes.
template <int LINES, bool K_CONTIGUOUS>
struct Staged {
    static constexpr int STRIDE = K_CONTIGUOUS ? TILE_K + TILE_K_PAD : LINES + TILE_PAD;
    static constexpr int FLOATS = (K_CONTIGUOUS ? LINES : TILE_K) * STRIDE;
    static constexpr int CHUNKS = LINES * TILE_K / 4;  // copies of 4 adjacent elements per step
    static constexpr int PER_THREAD = (CHUNKS + GEMM_THREADS - 1) / GEMM_THREADS;
    __device__ static int at(int line, int k) { return K_CONTIGUOUS ? line * STRIDE + k : k * STRIDE + line; }

    // A thread's copies of this operand, set up once for lines j0.. and k from k_begin: each k-step then
    // moves the source by TILE_K elements of k, and only the count of elements inside the matrix (zeros
    // past its edge or past k_end) is worked out again. j0 and k_begin are multiples of 4 (a tile's first
    // line; split_range's multiples of TILE_K), which the 16-byte copies' alignment relies on.
    struct Copier {
        const float* src[PER_THREAD];  // chunk r's first element at k_begin (or p itself outside the matrix)
        int dst[PER_THREAD], k[PER_THREAD], lines_in[PER_THREAD];
        const float* p;
        int k_stop, adjacent, step_elements;
        bool wide;  // 16-byte copies: the contiguous index has stride 1 and the rows start 16-byte aligned

        __device__ Copier(const Dense& d, int j0, int k_begin, int k_end) {
            p = d.p;
            k_stop = min(k_end, d.len);
            adjacent = K_CONTIGUOUS ? d.sk : d.sj;
            const int other = K_CONTIGUOUS ? d.sj : d.sk;
            wide = adjacent == 1 && other % 4 == 0 && (reinterpret_cast<size_t>(d.p) & 15) == 0;
            step_elements = TILE_K * d.sk;
#pragma unroll
            for (int r = 0; r < PER_THREAD; r++) {
                const int c = threadIdx.x + r * GEMM_THREADS;
                const int line = K_CONTIGUOUS ? c / (TILE_K / 4) : c % (LINES / 4) * 4;
                const int kc = K_CONTIGUOUS ? c % (TILE_K / 4) * 4 : c / (LINES / 4);
                const int j = j0 + line;
                dst[r] = at(line, kc);
                k[r] = k_begin + kc;
                // lines inside the matrix: all or none of a K-contiguous chunk's one line, up to 4 of the others'
                lines_in[r] = c < CHUNKS ? (K_CONTIGUOUS ? (j < d.lines ? 4 : 0) : max(0, min(4, d.lines - j))) : 0;
                src[r] = lines_in[r] > 0 ? d.p + (size_t)j * d.sj + (size_t)k[r] * d.sk : d.p;
            }
        }
        // Copy step s (k from k_begin + s * TILE_K) into `stage`.
        __device__ void copy(float* stage, int s) const {
#pragma unroll
            for (int r = 0; r < PER_THREAD; r++) {
                if (PER_THREAD * GEMM_THREADS > CHUNKS && threadIdx.x + r * GEMM_THREADS >= CHUNKS) continue;
                const int kk = k[r] + s * TILE_K;
                const int n = K_CONTIGUOUS ? min(lines_in[r], max(0, k_stop - kk)) : (kk < k_stop ? lines_in[r] : 0);
                const float* from = n > 0 ? src[r] + (size_t)s * step_elements : p;
                float* to = stage + dst[r];
                if (wide) {
                    cp_async16_fill(to, from, 4 * n);  // chunks start at multiples of 4 (j0 and k0 are): aligned
                } else {
#pragma unroll
                    for (int e = 0; e < 4; e++) cp_async4_fill(to + e, e < n ? from + e * adjacent : p, e < n ? 4 : 0);
                }
            }
        }
    };
};

// The 8 warps of a block form a 2 x 4 grid over its TM x TN tile; each warp owns (TM/2) x (TN/4) of
// it as MI x NI mma tiles of 16 x 8, and each lane holds 4 values of each: acc[mi*NI + ni][r].
template <int TM, int TN>
struct WarpTiles {
    static constexpr int MI = TM / 2 / 16, NI = TN / 4 / 8;
    static_assert(MI * NI <= 4, "at most 16 accumulators per thread (acc[4][4]; a 64 x 32 tile uses 8)");
    static_assert(GEMM_THREADS == 256, "8 warps");
    __device__ static int row0() { return (threadIdx.x / 32 / 4) * (TM / 2); }  // the warp's first row
    __device__ static int col0() { return (threadIdx.x / 32 % 4) * (TN / 4); }
};

// The products of one staged k-step (as: A's, bs: B's, as SA and SB stage them) in bf16, into this warp's part
// of the tile: a fragment's values are packed as bf16 pairs as they are read. g and t place the lane in its
// fragments, wm and wn are the warp's first row and column (gemm_tile works them out once per tile).
template <class W, class SA, class SB>
__device__ __forceinline__ void bf16_step_products(const float* as, const float* bs, int g, int t, int wm, int wn,
                                                   float acc[4][4]) {
    static_assert(TILE_K % 16 == 0, "whole k16 steps");
#pragma unroll
    for (int kk = 0; kk < TILE_K; kk += 16) {
        unsigned a[W::MI][4], b[W::NI][2];
#pragma unroll
        for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int k = kk + 2 * t + 8 * (r / 2), m = wm + mi * 16 + g + 8 * (r % 2);
                a[mi][r] = pack_bf16(as[SA::at(m, k)], as[SA::at(m, k + 1)]);
            }
#pragma unroll
        for (int ni = 0; ni < W::NI; ni++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int k = kk + 2 * t + 8 * r, n = wn + ni * 8 + g;
                b[ni][r] = pack_bf16(bs[SB::at(n, k)], bs[SB::at(n, k + 1)]);
            }
#pragma unroll
        for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
            for (int ni = 0; ni < W::NI; ni++) mma_bf16(acc[mi * W::NI + ni], a[mi], b[ni]);
    }
}

// The same in 3xTF32: each value is split into its TF32 parts as it is read.
template <class W, class SA, class SB>
__device__ __forceinline__ void tf32x3_step_products(const float* as, const float* bs, int g, int t, int wm, int wn,
                                                     float acc[4][4]) {
#pragma unroll
    for (int kk = 0; kk < TILE_K; kk += 8) {
        unsigned a_big[W::MI][4], a_small[W::MI][4], b_big[W::NI][2], b_small[W::NI][2];
#pragma unroll
        for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                split_tf32(as[SA::at(wm + mi * 16 + g + 8 * (r % 2), kk + t + 4 * (r / 2))], &a_big[mi][r],
                           &a_small[mi][r]);
#pragma unroll
        for (int ni = 0; ni < W::NI; ni++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                split_tf32(bs[SB::at(wn + ni * 8 + g, kk + t + 4 * r)], &b_big[ni][r], &b_small[ni][r]);
#pragma unroll
        for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
            for (int ni = 0; ni < W::NI; ni++)
                mma_3xtf32(acc[mi * W::NI + ni], a_big[mi], a_small[mi], b_big[ni], b_small[ni]);
    }
}

// Accumulate the block's TM x TN tile (rows m0.., columns n0..) over k in [k_begin, k_end).
// The operands pass through shared memory TILE_K steps of k at a time, by cp.async into a ring of
// GEMM_STAGES steps: the copies of the next GEMM_STAGES - 1 steps are in flight while a step's products
// run, so a block waits on global memory about once, not once per step (one barrier per step). Shared
// memory holds float32 in every precision: a warp rounds the values of its fragments as it reads them
// (split into TF32 parts, or packed as bf16 pairs).
template <Precision PR, int TM, int TN, bool A_K_CONTIGUOUS, bool B_N_CONTIGUOUS>
__device__ __forceinline__ void gemm_tile(const Dense& A, const Dense& B, int m0, int n0, int k_begin, int k_end,
                                          float acc[4][4]) {
    using W = WarpTiles<TM, TN>;
    using SA = Staged<TM, A_K_CONTIGUOUS>;
    using SB = Staged<TN, !B_N_CONTIGUOUS>;
    static_assert(GEMM_STAGES >= 2, "a ring of at least two steps");
    static_assert(GEMM_STAGES * (SA::FLOATS + SB::FLOATS) * 4 <= 48 * 1024, "the ring fits static shared memory");
    __shared__ __align__(16) float As[GEMM_STAGES][SA::FLOATS];
    __shared__ __align__(16) float Bs[GEMM_STAGES][SB::FLOATS];
    const int tid = threadIdx.x, g = tid % 32 / 4, t = tid % 4, wm = W::row0(), wn = W::col0();
    const int steps = k_begin < k_end ? (k_end - k_begin + TILE_K - 1) / TILE_K : 0;

    const typename SA::Copier a_copier(A, m0, k_begin, k_end);
    const typename SB::Copier b_copier(B, n0, k_begin, k_end);
    // Issue step s's copies into its slot of the ring (none past the last step), and close the group:
    // every thread commits one group per call, so wait<GEMM_STAGES - 2> means "step s has landed".
    auto issue = [&](int s) {
        if (s < steps) {
            a_copier.copy(As[s % GEMM_STAGES], s);
            b_copier.copy(Bs[s % GEMM_STAGES], s);
        }
        cp_async_commit();
    };

#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; s++) issue(s);
    for (int s = 0; s < steps; s++) {
        cp_async_wait<GEMM_STAGES - 2>();  // this thread's copies of step s have landed
        __syncthreads();  // everyone's have, and everyone is done with step s - 1, whose slot is refilled next
        issue(s + GEMM_STAGES - 1);
        const float* as = As[s % GEMM_STAGES];
        const float* bs = Bs[s % GEMM_STAGES];
        if constexpr (PR == Precision::Bf16) {
            bf16_step_products<W, SA, SB>(as, bs, g, t, wm, wn, acc);
        } else {
            static_assert(PR == Precision::Fp32, "fc1 runs in 3xTF32 or in bf16");
            tf32x3_step_products<W, SA, SB>(as, bs, g, t, wm, wn, acc);
        }
    }
}

// Hand each of this thread's accumulators to store(m, n, value) with its row and column in C; the
// store decides where (and whether: m or n past the end) the value goes.
template <int TM, int TN, class Store>
__device__ __forceinline__ void gemm_store(const float acc[4][4], int m0, int n0, Store store) {
    using W = WarpTiles<TM, TN>;
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
        for (int ni = 0; ni < W::NI; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                store(m0 + W::row0() + mi * 16 + g + 8 * (r / 2), n0 + W::col0() + ni * 8 + 2 * t + r % 2,
                      acc[mi * W::NI + ni][r]);
}

// The k range of split `split` when k_total is cut into pieces of k_per_split (a multiple of TILE_K).
__device__ __forceinline__ void split_range(int split, int k_per_split, int k_total, int* begin, int* end) {
    *begin = split * k_per_split;
    *end = min(k_total, *begin + k_per_split);
}
