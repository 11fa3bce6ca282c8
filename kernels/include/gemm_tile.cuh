// gemm_tile.cuh: the tiled matrix-product core of fc1's kernels (fast/linear_splitk.cu), on the tensor
// cores in 3xTF32 (Precision::Fp32) or in bf16 (Precision::Bf16; tensor_core.cuh):
//
//   C[m][n] = sum_k A(m, k) * B(k, n)
//
// A block of GEMM_THREADS threads computes one 64 x 64 tile of C on the tensor cores, 16 values per
// thread in registers. The operands pass through shared memory TILE_K steps of k at a time, so each
// element loaded from global memory is used 64 times. A and B are *loaders*: small structs whose methods
// return elements (0 outside the problem), here Dense matrices with any strides. A_K_CONTIGUOUS /
// B_N_CONTIGUOUS say which index of the operand is adjacent in memory, so that consecutive threads load
// adjacent addresses (coalesced loads). (conv2's kernels stage whole images instead: fast/conv2_implicit_gemm.cu.)
//
// Each output is a sum over k in a fixed order: results are deterministic.
#pragma once
#include "tensor_core.cuh"

// TILE_M, TILE_N, TILE_K, GEMM_THREADS and GEMM_MIN_BLOCKS (blocks per SM, which caps the registers so
// that enough warps hide each other's latency) come from mnist_cuda/ops/linear_splitk.py.
#if !defined(TILE_M) || !defined(TILE_N) || !defined(TILE_K) || !defined(GEMM_THREADS) || !defined(GEMM_MIN_BLOCKS)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#define TILE_PAD 8  // rows of TM+8 floats (a multiple of 8 banks, but not of 32): the lanes of a fragment
                    // load, rows k+t and columns m+g, hit banks 8t+g, all different

// Operands. gemm_tile reads A as rows A(m, k) and B as columns B(k, n): each thread loads the same
// few rows (or columns) at every k-step, only k moves. So an operand is described by its *lines*
// (A's rows, B's columns): line(j) does the index arithmetic that depends on j once, before the
// k loop, and at(line, k) is the per-element remainder. Both return 0 outside the problem.

// Line j, element k: p[j*sj + k*sk]; lines x len elements.
struct Dense {
    const float* p;
    int lines, len, sj, sk;
    struct Line {
        const float* p;
        bool valid;
    };
    __device__ Line line(int j) const { return {p + (j < lines ? j * sj : 0), j < lines}; }
    __device__ float at(const Line& l, int k) const { return l.valid && k < len ? l.p[k * sk] : 0.0f; }
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

// Accumulate the block's TM x TN tile (rows m0.., columns n0..) over k in [k_begin, k_end).
// The operands pass through shared memory TILE_K steps of k at a time; the next step's elements are
// fetched into registers before the current step's products, so global-memory latency overlaps the
// tensor-core work (one shared-memory buffer, two barriers per step). Shared memory holds float32 in
// every precision: a warp rounds the values of its fragments as it reads them (split into TF32 parts, or
// packed as bf16 pairs).
template <Precision PR, int TM, int TN, bool A_K_CONTIGUOUS, bool B_N_CONTIGUOUS, class LoadA, class LoadB>
__device__ __forceinline__ void gemm_tile(const LoadA& A, const LoadB& B, int m0, int n0, int k_begin,
                                          int k_end, float acc[4][4]) {
    using W = WarpTiles<TM, TN>;
    constexpr int A_PER_THREAD = TM * TILE_K / GEMM_THREADS, B_PER_THREAD = TN * TILE_K / GEMM_THREADS;
    __shared__ __align__(16) float As[TILE_K][TM + TILE_PAD];
    __shared__ __align__(16) float Bs[TILE_K][TN + TILE_PAD];
    const int tid = threadIdx.x, g = tid % 32 / 4, t = tid % 4, wm = W::row0(), wn = W::col0();
    float a_next[A_PER_THREAD], b_next[B_PER_THREAD];
    typename LoadA::Line a_line[A_PER_THREAD];  // this thread's rows of A and columns of B
    typename LoadB::Line b_line[B_PER_THREAD];

    // Which element of the A (TM x TILE_K) and B (TILE_K x TN) slices is this thread's r-th:
    // consecutive threads take consecutive addresses of the operand's contiguous index.
    auto a_slot = [&](int r, int* m, int* k) {
        const int e = tid + r * GEMM_THREADS;
        *m = A_K_CONTIGUOUS ? e / TILE_K : e % TM;
        *k = A_K_CONTIGUOUS ? e % TILE_K : e / TM;
    };
    auto b_slot = [&](int r, int* k, int* n) {
        const int e = tid + r * GEMM_THREADS;
        *n = B_N_CONTIGUOUS ? e % TN : e / TILE_K;
        *k = B_N_CONTIGUOUS ? e / TN : e % TILE_K;
    };
    auto fetch = [&](int k0) {  // global memory -> registers
#pragma unroll
        for (int r = 0; r < A_PER_THREAD; r++) {
            int m, k;
            a_slot(r, &m, &k);
            a_next[r] = k0 + k < k_end ? A.at(a_line[r], k0 + k) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < B_PER_THREAD; r++) {
            int k, n;
            b_slot(r, &k, &n);
            b_next[r] = k0 + k < k_end ? B.at(b_line[r], k0 + k) : 0.0f;
        }
    };
#pragma unroll
    for (int r = 0; r < A_PER_THREAD; r++) {
        int m, k;
        a_slot(r, &m, &k);
        a_line[r] = A.line(m0 + m);
    }
#pragma unroll
    for (int r = 0; r < B_PER_THREAD; r++) {
        int k, n;
        b_slot(r, &k, &n);
        b_line[r] = B.line(n0 + n);
    }

#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    if (k_begin < k_end) fetch(k_begin);
    for (int k0 = k_begin; k0 < k_end; k0 += TILE_K) {
        __syncthreads();  // the previous step's slices have been read by everyone
#pragma unroll
        for (int r = 0; r < A_PER_THREAD; r++) {
            int m, k;
            a_slot(r, &m, &k);
            As[k][m] = a_next[r];
        }
#pragma unroll
        for (int r = 0; r < B_PER_THREAD; r++) {
            int k, n;
            b_slot(r, &k, &n);
            Bs[k][n] = b_next[r];
        }
        __syncthreads();
        if (k0 + TILE_K < k_end) fetch(k0 + TILE_K);  // in flight during the products below
        if constexpr (PR == Precision::Bf16) {
            static_assert(TILE_K % 16 == 0, "whole k16 steps");
#pragma unroll
            for (int kk = 0; kk < TILE_K; kk += 16) {
                unsigned a[W::MI][4], b[W::NI][2];
#pragma unroll
                for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int k = kk + 2 * t + 8 * (r / 2), m = wm + mi * 16 + g + 8 * (r % 2);
                        a[mi][r] = pack_bf16(As[k][m], As[k + 1][m]);
                    }
#pragma unroll
                for (int ni = 0; ni < W::NI; ni++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int k = kk + 2 * t + 8 * r, n = wn + ni * 8 + g;
                        b[ni][r] = pack_bf16(Bs[k][n], Bs[k + 1][n]);
                    }
#pragma unroll
                for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
                    for (int ni = 0; ni < W::NI; ni++) mma_bf16(acc[mi * W::NI + ni], a[mi], b[ni]);
            }
        } else {
            static_assert(PR == Precision::Fp32, "fc1 runs in 3xTF32 or in bf16");
#pragma unroll
            for (int kk = 0; kk < TILE_K; kk += 8) {
                unsigned a_big[W::MI][4], a_small[W::MI][4], b_big[W::NI][2], b_small[W::NI][2];
#pragma unroll
                for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        split_tf32(As[kk + t + 4 * (r / 2)][wm + mi * 16 + g + 8 * (r % 2)], &a_big[mi][r],
                                   &a_small[mi][r]);
#pragma unroll
                for (int ni = 0; ni < W::NI; ni++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        split_tf32(Bs[kk + t + 4 * r][wn + ni * 8 + g], &b_big[ni][r], &b_small[ni][r]);
#pragma unroll
                for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
                    for (int ni = 0; ni < W::NI; ni++)
                        mma_3xtf32(acc[mi * W::NI + ni], a_big[mi], a_small[mi], b_big[ni], b_small[ni]);
            }
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
