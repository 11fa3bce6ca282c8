// gemm.cuh: the tiled matrix-product core shared by the fast conv2d and linear kernels.
//
//   C[m][n] = sum_k A(m, k) * B(k, n)
//
// A block of GEMM_THREADS threads computes one TM x TN tile of C (64 x 64, or 32 x 128 where C has only
// 32 rows); each thread keeps a 4x4 sub-tile in registers. The operands pass through shared memory TILE_K steps of k at a time, so each
// element loaded from global memory is used 64 times. A and B are *loaders*: small structs whose
// operator() returns one element (0 outside the problem). The same core therefore serves dense
// matrices (Dense) and convolutions whose im2col matrix is gathered on the fly (Im2col: an "implicit
// GEMM", nothing is materialised). A_K_CONTIGUOUS / B_N_CONTIGUOUS say which index of the operand is
// adjacent in memory, so that consecutive threads load adjacent addresses (coalesced loads).
//
// Each output is a sum over k in a fixed order: results are deterministic.
#pragma once

#define TILE_M 64
#define TILE_N 64
#define TILE_K 16
#define GEMM_THREADS 256
#define TILE_PAD 4  // rows of 68 floats: column-wise stores spread over banks, rows stay 16-byte aligned

// Element (i, j) of a matrix with strides (si, sj); 0 outside rows x cols.
struct Dense {
    const float* p;
    int rows, cols, si, sj;
    __device__ float operator()(int i, int j) const {
        return (i < rows && j < cols) ? p[i * si + j * sj] : 0.0f;
    }
};

// The im2col matrix of x [N, C, S, S] for a 3x3 convolution with zero padding 1:
// element (k = c*9 + tap, q = n*S*S + h*S + w) is x[n, c, h + tap/3 - 1, w + tap%3 - 1].
// FLIPPED reads the kernel tap mirrored, x[n, c, h + 1 - tap/3, w + 1 - tap%3]: the input gradient of a
// convolution is a convolution of the output gradient with the flipped kernel.
template <int S, bool FLIPPED>
struct Im2col {
    const float* x;
    int C, npix;  // npix = N*S*S
    __device__ float operator()(int k, int q) const {
        if (k >= C * 9 || q >= npix) return 0.0f;
        const int n = q / (S * S), p = q % (S * S), h = p / S, w = p % S;
        const int c = k / 9, tap = k % 9;
        const int ih = FLIPPED ? h + 1 - tap / 3 : h + tap / 3 - 1;
        const int iw = FLIPPED ? w + 1 - tap % 3 : w + tap % 3 - 1;
        return (ih >= 0 && ih < S && iw >= 0 && iw < S) ? x[((n * C + c) * S + ih) * S + iw] : 0.0f;
    }
};

// The same matrix with its indices swapped.
template <class L>
struct Transposed {
    L inner;
    __device__ float operator()(int i, int j) const { return inner(j, i); }
};

// Accumulate the block's TM x TN tile (rows m0.., columns n0..) over k in [k_begin, k_end).
// (TM/4) x (TN/4) = GEMM_THREADS threads, each owning a 4x4 sub-tile. The next k-step's elements are
// fetched into registers before the current step's arithmetic, so global-memory latency overlaps the
// multiply-adds (one shared-memory buffer, two barriers per step).
template <int TM, int TN, bool A_K_CONTIGUOUS, bool B_N_CONTIGUOUS, class LoadA, class LoadB>
__device__ __forceinline__ void gemm_tile(const LoadA& A, const LoadB& B, int m0, int n0, int k_begin,
                                          int k_end, float acc[4][4]) {
    static_assert((TM / 4) * (TN / 4) == GEMM_THREADS, "one 4x4 sub-tile per thread");
    constexpr int A_PER_THREAD = TM * TILE_K / GEMM_THREADS, B_PER_THREAD = TN * TILE_K / GEMM_THREADS;
    __shared__ __align__(16) float As[TILE_K][TM + TILE_PAD];
    __shared__ __align__(16) float Bs[TILE_K][TN + TILE_PAD];
    const int tid = threadIdx.x, row = (tid / (TN / 4)) * 4, col = (tid % (TN / 4)) * 4;
    float a_next[A_PER_THREAD], b_next[B_PER_THREAD];

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
            a_next[r] = k0 + k < k_end ? A(m0 + m, k0 + k) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < B_PER_THREAD; r++) {
            int k, n;
            b_slot(r, &k, &n);
            b_next[r] = k0 + k < k_end ? B(k0 + k, n0 + n) : 0.0f;
        }
    };

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
        if (k0 + TILE_K < k_end) fetch(k0 + TILE_K);  // in flight during the arithmetic below
        // 4x4 outer products: per k, one float4 of A and one of B feed 16 FMAs
#pragma unroll
        for (int k = 0; k < TILE_K; k++) {
            const float4 a = *reinterpret_cast<const float4*>(&As[k][row]);
            const float4 b = *reinterpret_cast<const float4*>(&Bs[k][col]);
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
    }
}

// Hand each of this thread's accumulators to store(m, n, value) with its row and column in C; the
// store decides where (and whether: m or n past the end) the value goes.
template <int TN, class Store>
__device__ __forceinline__ void gemm_store(const float acc[4][4], int m0, int n0, Store store) {
    const int row = m0 + (threadIdx.x / (TN / 4)) * 4, col = n0 + (threadIdx.x % (TN / 4)) * 4;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) store(row + i, col + j, acc[i][j]);
}

// The k range of split `split` when k_total is cut into pieces of k_per_split (a multiple of TILE_K).
__device__ __forceinline__ void split_range(int split, int k_per_split, int k_total, int* begin, int* end) {
    *begin = split * k_per_split;
    *end = min(k_total, *begin + k_per_split);
}
