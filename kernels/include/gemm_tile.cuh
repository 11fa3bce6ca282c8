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
#include "common.cuh"
#include "tensor_core.cuh"

// TILE_M, TILE_N, TILE_K, GEMM_THREADS, GEMM_MIN_BLOCKS (blocks per SM, which caps the registers so that
// enough warps hide each other's latency) and GEMM_STAGES (the k-steps the copy ring holds) come from
// mnist_cuda/ops/linear_splitk.py.
#if !defined(TILE_M) || !defined(TILE_N) || !defined(TILE_K) || !defined(GEMM_THREADS) || !defined(GEMM_MIN_BLOCKS) || \
    !defined(GEMM_STAGES)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif
#define TILE_PAD \
    8  // an operand staged k-major has rows of lines+8 elements (float: a multiple of 8 banks, but not
       // of 32: the lanes of a fragment load, rows k+t and lines g, hit banks 8t+g, all different; bf16:
       // rows 2t apart, 4 words of lines each, banks 8t..8t+3)

// An operand: its line j (A's row m, B's column n), element k is p[j*sj + k*sk]; lines x len elements of T
// (float, or bfloat16: in --precision bf16 fc1's input as the step stores it, and the weight's and the output
// gradient's bf16 copies). dense() deduces T.
template <class T>
struct Dense {
    const T* p;
    int lines, len, sj, sk;
};
template <class T>
__device__ __forceinline__ Dense<T> dense(const T* p, int lines, int len, int sj, int sk) {
    return Dense<T>{p, lines, len, sj, sk};
}

// One k-step of an operand of T in shared memory: LINES lines x TILE_K, stored in the order of the operand's
// contiguous index, so that each copy of 16 adjacent bytes (VALUES elements) lands in 16 adjacent bytes.
template <int LINES, bool K_CONTIGUOUS, class T>
struct Staged {
    using type = T;
    static constexpr int VALUES = 16 / sizeof(T);  // elements per 16-byte copy
    // a row staged line-major is TILE_K elements and a pad: float's +4 (the lanes of a 3xTF32 fragment load hit
    // banks 20g+t, all different; bf16 pairs read from floats, k = 2t: 2-way), bf16's +8 (a fragment's pairs
    // are words 12g+t, all different); each row starts 16-byte aligned for the copies
    static constexpr int K_PAD = sizeof(T) == 4 ? 4 : 8;
    static constexpr int STRIDE = K_CONTIGUOUS ? TILE_K + K_PAD : LINES + TILE_PAD;
    static constexpr int ELEMENTS = (K_CONTIGUOUS ? LINES : TILE_K) * STRIDE;
    static constexpr int CHUNKS = LINES * TILE_K / VALUES;  // copies of VALUES adjacent elements per step
    static constexpr int PER_THREAD = (CHUNKS + GEMM_THREADS - 1) / GEMM_THREADS;
    static_assert(STRIDE * sizeof(T) % 16 == 0, "rows 16-byte aligned");
    static_assert(TILE_K % VALUES == 0 && LINES % VALUES == 0, "whole 16-byte copies along a row and a step");
    __device__ static int at(int line, int k) { return K_CONTIGUOUS ? line * STRIDE + k : k * STRIDE + line; }

    // Elements (line, k) and (line, k + 1) of a staged step, k even, as a bf16 pair (the lower k in the lower
    // half): a float operand's rounded to the nearest, a bfloat16 operand's as they are.
    __device__ static unsigned bf16_pair(const float* s, int line, int k) {
        return pack_bf16(s[at(line, k)], s[at(line, k + 1)]);
    }
    __device__ static unsigned bf16_pair(const bfloat16* s, int line, int k) {
        if (K_CONTIGUOUS) return *reinterpret_cast<const unsigned*>(s + at(line, k));  // adjacent: one word
        return (unsigned)s[at(line, k)].bits | (unsigned)s[at(line, k + 1)].bits << 16;
    }

    // A thread's copies of this operand, set up once for lines j0.. and k from k_begin: each k-step then
    // moves the source by TILE_K elements of k, and only the count of elements inside the matrix (zeros
    // past its edge or past k_end) is worked out again. j0 and k_begin are multiples of VALUES (a tile's first
    // line; split_range's multiples of TILE_K), which the 16-byte copies' alignment relies on.
    struct Copier {
        const T* src[PER_THREAD];  // chunk r's first element at k_begin (or p itself outside the matrix)
        int dst[PER_THREAD], k[PER_THREAD], lines_in[PER_THREAD];
        const T* p;
        int k_stop, adjacent, step_elements;
        bool wide;  // 16-byte copies: the contiguous index has stride 1 and the rows start 16-byte aligned

        __device__ Copier(const Dense<T>& d, int j0, int k_begin, int k_end) {
            p = d.p;
            k_stop = min(k_end, d.len);
            adjacent = K_CONTIGUOUS ? d.sk : d.sj;
            const int other = K_CONTIGUOUS ? d.sj : d.sk;
            wide = adjacent == 1 && other % VALUES == 0 && (reinterpret_cast<size_t>(d.p) & 15) == 0;
            step_elements = TILE_K * d.sk;
#pragma unroll
            for (int r = 0; r < PER_THREAD; r++) {
                const int c = threadIdx.x + r * GEMM_THREADS;
                const int line = K_CONTIGUOUS ? c / (TILE_K / VALUES) : c % (LINES / VALUES) * VALUES;
                const int kc = K_CONTIGUOUS ? c % (TILE_K / VALUES) * VALUES : c / (LINES / VALUES);
                const int j = j0 + line;
                dst[r] = at(line, kc);
                k[r] = k_begin + kc;
                // lines inside the matrix: all or none of a K-contiguous chunk's one line, up to VALUES of the others'
                lines_in[r] =
                    c < CHUNKS ? (K_CONTIGUOUS ? (j < d.lines ? VALUES : 0) : max(0, min(VALUES, d.lines - j))) : 0;
                src[r] = lines_in[r] > 0 ? d.p + (size_t)j * d.sj + (size_t)k[r] * d.sk : d.p;
            }
        }
        // Copy step s (k from k_begin + s * TILE_K) into `stage`.
        __device__ void copy(T* stage, int s) const {
#pragma unroll
            for (int r = 0; r < PER_THREAD; r++) {
                if (PER_THREAD * GEMM_THREADS > CHUNKS && threadIdx.x + r * GEMM_THREADS >= CHUNKS) continue;
                const int kk = k[r] + s * TILE_K;
                const int n = K_CONTIGUOUS ? min(lines_in[r], max(0, k_stop - kk)) : (kk < k_stop ? lines_in[r] : 0);
                const T* from = n > 0 ? src[r] + (size_t)s * step_elements : p;
                T* to = stage + dst[r];
                if (wide) {
                    // chunks start at multiples of VALUES (j0 and k0 are): aligned
                    cp_async16_fill(reinterpret_cast<float*>(to), reinterpret_cast<const float*>(from),
                                    n * (int)sizeof(T));
                } else {
                    copy_elements(to, from, n);
                }
            }
        }
        // A chunk element by element (a layout the 16-byte copies cannot take): floats by 4-byte cp.async,
        // bf16 values (2 bytes, below cp.async's smallest copy) by plain loads and stores; zeros past n.
        __device__ void copy_elements(float* to, const float* from, int n) const {
#pragma unroll
            for (int e = 0; e < 4; e++) cp_async4_fill(to + e, e < n ? from + e * adjacent : p, e < n ? 4 : 0);
        }
        __device__ void copy_elements(bfloat16* to, const bfloat16* from, int n) const {
#pragma unroll
            for (int e = 0; e < VALUES; e++) to[e].bits = e < n ? from[e * adjacent].bits : 0;
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
// of the tile: a fragment's values are read as bf16 pairs (Staged::bf16_pair: float operands rounded as they are
// read). g and t place the lane in its fragments, wm and wn are the warp's first row and column (gemm_tile works
// them out once per tile).
template <class W, class SA, class SB>
__device__ __forceinline__ void bf16_step_products(const typename SA::type* as, const typename SB::type* bs, int g,
                                                   int t, int wm, int wn, float acc[4][4]) {
    static_assert(TILE_K % 16 == 0, "whole k16 steps");
#pragma unroll
    for (int kk = 0; kk < TILE_K; kk += 16) {
        unsigned a[W::MI][4], b[W::NI][2];
#pragma unroll
        for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int k = kk + 2 * t + 8 * (r / 2), m = wm + mi * 16 + g + 8 * (r % 2);
                a[mi][r] = SA::bf16_pair(as, m, k);
            }
#pragma unroll
        for (int ni = 0; ni < W::NI; ni++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int k = kk + 2 * t + 8 * r, n = wn + ni * 8 + g;
                b[ni][r] = SB::bf16_pair(bs, n, k);
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
// memory holds each operand in its own type (TA, TB): a warp rounds float values of its fragments as it
// reads them (split into TF32 parts, or packed as bf16 pairs); bf16 values (Bf16 only) are read as they are.
template <Precision PR, int TM, int TN, bool A_K_CONTIGUOUS, bool B_N_CONTIGUOUS, class TA, class TB>
__device__ __forceinline__ void gemm_tile(const Dense<TA>& A, const Dense<TB>& B, int m0, int n0, int k_begin,
                                          int k_end, float acc[4][4]) {
    using W = WarpTiles<TM, TN>;
    using SA = Staged<TM, A_K_CONTIGUOUS, TA>;
    using SB = Staged<TN, !B_N_CONTIGUOUS, TB>;
    static_assert(GEMM_STAGES >= 2, "a ring of at least two steps");
    static_assert(GEMM_STAGES * (SA::ELEMENTS * sizeof(TA) + SB::ELEMENTS * sizeof(TB)) <= 48 * 1024,
                  "the ring fits static shared memory");
    __shared__ __align__(16) TA As[GEMM_STAGES][SA::ELEMENTS];
    __shared__ __align__(16) TB Bs[GEMM_STAGES][SB::ELEMENTS];
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
        const TA* as = As[s % GEMM_STAGES];
        const TB* bs = Bs[s % GEMM_STAGES];
        if constexpr (PR == Precision::Bf16) {
            bf16_step_products<W, SA, SB>(as, bs, g, t, wm, wn, acc);
        } else {
            static_assert(PR == Precision::Fp32, "fc1 runs in 3xTF32 or in bf16");
            static_assert(sizeof(TA) == 4 && sizeof(TB) == 4, "3xTF32 splits float operands");
            tf32x3_step_products<W, SA, SB>(as, bs, g, t, wm, wn, acc);
        }
    }
}

// Hand this thread's accumulators to store(m, n, first, second) a pair at a time: the values at columns n (even) and
// n + 1 of row m in C, which a lane's fragment holds side by side (a store of two bf16 values is then one 4-byte word).
// The store decides where (and whether: m or n past the end) the values go.
template <int TM, int TN, class Store>
__device__ __forceinline__ void gemm_store_pairs(const float acc[4][4], int m0, int n0, Store store) {
    using W = WarpTiles<TM, TN>;
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int mi = 0; mi < W::MI; mi++)
#pragma unroll
        for (int ni = 0; ni < W::NI; ni++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                store(m0 + W::row0() + mi * 16 + g + 8 * h, n0 + W::col0() + ni * 8 + 2 * t,
                      acc[mi * W::NI + ni][2 * h], acc[mi * W::NI + ni][2 * h + 1]);
}

// The same a value at a time: store(m, n, value), in the same order.
template <int TM, int TN, class Store>
__device__ __forceinline__ void gemm_store(const float acc[4][4], int m0, int n0, Store store) {
    gemm_store_pairs<TM, TN>(acc, m0, n0, [&](int m, int n, float first, float second) {
        store(m, n, first);
        store(m, n + 1, second);
    });
}

// The k range of split `split` when k_total is cut into pieces of k_per_split (a multiple of TILE_K).
__device__ __forceinline__ void split_range(int split, int k_per_split, int k_total, int* begin, int* end) {
    *begin = split * k_per_split;
    *end = min(k_total, *begin + k_per_split);
}
