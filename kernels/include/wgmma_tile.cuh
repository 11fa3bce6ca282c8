// wgmma_tile.cuh: a matrix-product core for fc1's input gradient on Hopper (sm_90a), one warpgroup MMA
// (wgmma) per k-step with both operands read by the tensor cores from shared memory, in 3xTF32
// (Precision::Fp32) or bf16 (Precision::Bf16). Other GPUs use gemm_tile.cuh's mma.sync core.
//
//   C[m][n] = sum_k A(m, k) * B(k, n)
//
// A block is one warpgroup of WG_THREADS threads and computes a 64 x BN tile of C, BN / 2 values per
// thread. Operand A is k-contiguous in memory: A(m, k) = a[m * lda + k] (dy). Operand B is n-contiguous:
// B(k, n) = b[k * ldb + n] (W, whose rows are fc1's outputs, k here). wgmma reads TF32 operands only
// k-major, so B is transposed in registers while it is staged: a thread loads 4 columns of each of its
// k rows and stores them as 4 k-major lines.
//
// k passes through shared memory WG_CHUNK_K at a time, two buffers: the next chunk is fetched into
// registers and staged while the tensor cores work on this one. Staging rounds the values as the
// products read them (stage16: TF32 big and small parts in Fp32, bf16 in Bf16), so a value is split
// once per block, not once per warp that reads it as in gemm_tile.cuh. In Fp32 each k-step is three
// wgmma, the small terms first (as mma_3xtf32).
//
// Shared layout of one operand's chunk, per part: [quad][line] 16-byte values (4 k in TF32, 8 in bf16),
// wgmma's "K-major, no swizzle" core matrices of 8 lines x 16 bytes. Each quad's lines are followed by
// one unused 16-byte slot, so the 8 threads that store a 16-byte value together (8 quads of one line, or
// 8 quads of 4 lines in the transposed staging) hit 8 different bank groups.
//
// Each output is a sum over k in a fixed order: results are deterministic.
#pragma once
#include "tensor_core.cuh"

#if !defined(WG_THREADS) || !defined(WG_CHUNK_K)
#error "compile through mnist_cuda.ops, which passes the launch geometry as -D options"
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

template <Precision PR>
constexpr int wg_parts = PR == Precision::Fp32 ? 2 : 1;  // big and small parts, or one rounded value
template <Precision PR>
constexpr int wg_quads = WG_CHUNK_K / staged_values<PR>;  // 16-byte values per line per chunk

// One operand's chunk of `LINES` lines (A's rows, B's columns) of T (float, or bfloat16: the bf16 step's copies):
// fetched from global memory into registers as it is stored, then staged into shared memory. The fetched values
// are not touched before they are staged, so the loads are in flight during the products.
template <Precision PR, int LINES, bool K_CONTIGUOUS, class T = float>
struct WgmmaOperand {
    static constexpr int V = staged_values<PR>, QUADS = wg_quads<PR>;
    static constexpr int QUAD_STRIDE = LINES + 1;                // 16-byte slots from one quad to the next
    static constexpr int PART_SLOTS = QUADS * QUAD_STRIDE;       // one part of the chunk
    static constexpr int SLOTS = wg_parts<PR> * PART_SLOTS;      // the whole chunk
    static constexpr int LINES_PER_TASK = K_CONTIGUOUS ? 1 : 4;  // a task is one quad of this many lines
    static constexpr int TASKS = LINES / LINES_PER_TASK * QUADS;
    static constexpr int PER_THREAD = CEIL_DIV(TASKS, WG_THREADS);
    static constexpr int WHOLE = 16 / sizeof(T);  // values per 16-byte load
    static constexpr int WORDS = V * LINES_PER_TASK * sizeof(T) / 4;
    static_assert(LINES % 8 == 0, "whole core matrices");
    static_assert(sizeof(T) == 4 || PR == Precision::Bf16, "a bf16 operand is read by bf16 products only");
    // raw[r]: task r's values as stored, value k0 + quad * V + i of line line0 + j at index i * LINES_PER_TASK + j
    // (a float a word; bf16 two a word, the even index in the low half)
    alignas(16) unsigned raw[PER_THREAD][WORDS];  // read and written as 8- and 16-byte vectors

    // Task e: quad e % QUADS (the fastest, for the bank groups above) of the line group e / QUADS.
    __device__ static int task(int r, int* quad, int* line) {
        const int e = threadIdx.x + r * WG_THREADS;
        *quad = e % QUADS;
        *line = e / QUADS * LINES_PER_TASK;
        return e < TASKS;
    }
    __device__ static unsigned bits(const float* p) { return __float_as_uint(*p); }
    __device__ static unsigned bits(const bfloat16* p) { return p->bits; }
    __device__ void put(int r, int index, unsigned b) {  // value `index` of task r, from its bits
        if constexpr (sizeof(T) == 4) {
            raw[r][index] = b;
        } else {
            unsigned& w = raw[r][index / 2];
            w = index % 2 ? (w & 0xffffu) | b << 16 : (w & 0xffff0000u) | b;
        }
    }
    // The chunk at k0 of lines line0..: p's lines `lines` long (valid lines), ld apart (K_CONTIGUOUS) or
    // its k rows ld apart (n-contiguous). Values past k_end or past the last line are 0. Whole 16-byte loads
    // along k where ld allows (ld a multiple of WHOLE; line0 and k0 are multiples of V), and a k row's 4 lines in one
    // load (ld % 4 == 0).
    __device__ void fetch(const T* p, int lines, int ld, int line0, int k0, int k_end) {
        const bool whole = ld % (K_CONTIGUOUS ? WHOLE : 4) == 0;
#pragma unroll
        for (int r = 0; r < PER_THREAD; r++) {
            int quad, l;
            if (!task(r, &quad, &l)) continue;
            const int line = line0 + l, k = k0 + quad * V;
            if constexpr (K_CONTIGUOUS) {
                const T* src = p + (size_t)line * ld + k;
                if (whole && line < lines && k + V <= k_end) {
#pragma unroll
                    for (int i = 0; i < V; i += WHOLE)
                        *reinterpret_cast<uint4*>(&raw[r][i * sizeof(T) / 4]) =
                            *reinterpret_cast<const uint4*>(src + i);
                } else {
#pragma unroll
                    for (int i = 0; i < V; i++) put(r, i, line < lines && k + i < k_end ? bits(src + i) : 0u);
                }
            } else {
#pragma unroll
                for (int i = 0; i < V; i++) {
                    const T* src = p + (size_t)(k + i) * ld + line;
                    if (whole && k + i < k_end && line + 3 < lines) {
                        if constexpr (sizeof(T) == 4)
                            *reinterpret_cast<uint4*>(&raw[r][4 * i]) = *reinterpret_cast<const uint4*>(src);
                        else
                            *reinterpret_cast<uint2*>(&raw[r][2 * i]) = *reinterpret_cast<const uint2*>(src);
                    } else {
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            put(r, 4 * i + j, k + i < k_end && line + j < lines ? bits(src + j) : 0u);
                    }
                }
            }
        }
    }
    // The fetched values, rounded as the products read them, into the chunk at `shared`; bf16 values are staged as
    // they are (a k-major line's pairs joined from two k rows in the transposed staging).
    __device__ void stage(float4* shared) const {
#pragma unroll
        for (int r = 0; r < PER_THREAD; r++) {
            int quad, l;
            if (!task(r, &quad, &l)) continue;
#pragma unroll
            for (int j = 0; j < LINES_PER_TASK; j++) {
                float4 big, small;
                if constexpr (sizeof(T) == 4) {
                    float line_values[V];
#pragma unroll
                    for (int i = 0; i < V; i++) line_values[i] = __uint_as_float(raw[r][i * LINES_PER_TASK + j]);
                    stage16<PR>(line_values, &big, &small);
                } else if constexpr (K_CONTIGUOUS) {
                    big = *reinterpret_cast<const float4*>(&raw[r][0]);
                } else {  // pair q: k 2q and 2q + 1 of line j, each in row (2q or 2q + 1)'s word j / 2, half j % 2
                    alignas(16) unsigned pairs[4];
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        pairs[q] =
                            __byte_perm(raw[r][4 * q + j / 2], raw[r][4 * q + 2 + j / 2], j % 2 ? 0x7632 : 0x5410);
                    big = *reinterpret_cast<const float4*>(pairs);
                }
                shared[quad * QUAD_STRIDE + l + j] = big;
                if constexpr (wg_parts<PR> == 2) shared[PART_SLOTS + quad * QUAD_STRIDE + l + j] = small;
            }
        }
    }
    // wgmma's descriptor of k-step s (two quads) of part `part` of the chunk at `shared`.
    __device__ static unsigned long long descriptor(const float4* shared, int part, int s) {
        return wgmma_descriptor(shared + part * PART_SLOTS + 2 * s * QUAD_STRIDE, QUAD_STRIDE * 16, 128);
    }
};

// Shared memory of wgmma_tile: two buffers of both operands' chunks.
template <Precision PR, int BN>
constexpr int wgmma_tile_shared_bytes =
    2 * 16 * (WgmmaOperand<PR, 64, true>::SLOTS + WgmmaOperand<PR, BN, false>::SLOTS);

// Accumulate the block's 64 x BN tile (rows m0.. of A, columns n0.. of B) over k in [0, k_end). a:
// m_total rows, lda apart; b: n_total columns, its k rows ldb apart (see the top). acc[4j + r] =
// C(m0 + 16 * warp + g + 8 * (r / 2), n0 + 8j + 2t + r % 2), as wgmma_tf32 lays out d. shared:
// wgmma_tile_shared_bytes<PR, BN> of dynamic shared memory.
template <Precision PR, int BN, class TA, class TB>
__device__ __forceinline__ void wgmma_tile(const TA* a, int m_total, int lda, const TB* b, int n_total, int ldb, int m0,
                                           int n0, int k_end, float* acc, float4* shared) {
    using OpA = WgmmaOperand<PR, 64, true, TA>;
    using OpB = WgmmaOperand<PR, BN, false, TB>;
    constexpr int BUFFER = OpA::SLOTS + OpB::SLOTS;
    unsigned shared_bytes;  // a launch with too little shared memory would corrupt its neighbours': stop it
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    if (shared_bytes < wgmma_tile_shared_bytes<PR, BN>) __trap();
    OpA stage_a;
    OpB stage_b;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    const int chunks = CEIL_DIV(k_end, WG_CHUNK_K);
    if (chunks <= 0) return;
    stage_a.fetch(a, m_total, lda, m0, 0, k_end);
    stage_b.fetch(b, n_total, ldb, n0, 0, k_end);
    stage_a.stage(shared);
    stage_b.stage(shared + OpA::SLOTS);
    fence_proxy_async();  // the stores are visible to the tensor cores after the barrier
    __syncthreads();
    for (int c = 0; c < chunks; c++) {
        const bool more = c + 1 < chunks;
        if (more) {  // in flight during the products below
            const int k0 = (c + 1) * WG_CHUNK_K;
            stage_a.fetch(a, m_total, lda, m0, k0, k_end);
            stage_b.fetch(b, n_total, ldb, n0, k0, k_end);
        }
        const float4* buf = shared + (c % 2) * BUFFER;
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < wg_quads<PR> / 2; s++) {
            const unsigned long long a_big = OpA::descriptor(buf, 0, s),
                                     b_big = OpB::descriptor(buf + OpA::SLOTS, 0, s);
            if constexpr (PR == Precision::Bf16) {
                wgmma_bf16<BN>(acc, a_big, b_big);
            } else {
                static_assert(PR == Precision::Fp32, "fc1 runs in 3xTF32 or in bf16");
                wgmma_tf32<BN>(acc, OpA::descriptor(buf, 1, s), b_big);
                wgmma_tf32<BN>(acc, a_big, OpB::descriptor(buf + OpA::SLOTS, 1, s));
                wgmma_tf32<BN>(acc, a_big, b_big);
            }
        }
        wgmma_commit();
        if (more) {  // the other buffer, last read by the previous chunk's products, which have finished
            float4* next = shared + ((c + 1) % 2) * BUFFER;
            stage_a.stage(next);
            stage_b.stage(next + OpA::SLOTS);
        }
        wgmma_wait_all();
        fence_proxy_async();
        __syncthreads();
    }
}

// Hand each accumulator pair to store(m, n, first, second), as gemm_store_pairs: columns n (even) and n + 1 of row
// m in C.
template <int BN, class Store>
__device__ __forceinline__ void wgmma_store_pairs(const float* acc, int m0, int n0, Store store) {
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            store(m0 + 16 * warp + g + 8 * h, n0 + 8 * j + 2 * t, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
}

// The same a value at a time: store(m, n, value), in the same order.
template <int BN, class Store>
__device__ __forceinline__ void wgmma_store(const float* acc, int m0, int n0, Store store) {
    wgmma_store_pairs<BN>(acc, m0, n0, [&](int m, int n, float first, float second) {
        store(m, n, first);
        store(m, n + 1, second);
    });
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
