// Rung 04, split k: rung 03's tiles with the reduction over the batch cut into splits, a block per tile and split
// writing its partial sums, and a second kernel adding the splits in order.
//   x [N,I], dy [N,O] -> dW [O,I] = dy^T x   (torch.nn.Linear's weight gradient; fc1: I = 3136, O = 128)
//
// What it adds over rung 03: fc1's weights make 98 tiles of 64 x 64 at any batch, fewer than one per SM, and each
// block of rung 03 walks the whole batch. Here grid z cuts the batch into splits of k_per_split samples (a multiple
// of BK): block z sums the samples [z x k_per_split, (z + 1) x k_per_split) of its tile into partial [z, O, I], and
// the second kernel, a thread per weight, adds the splits in split order. The order is fixed, with no atomics, so
// the result is the same bits at every run. op.py picks the splits as the product does: tiles x splits blocks in
// one wave at 3 blocks per SM, each split at least 4 steps long; a batch too short for two splits (64) has one, and
// then the first kernel writes dW itself and the second is not launched. The price is the partial sums' round trip
// through memory (splits x O x I floats) and a second launch. What it leaves: the products are still fp32 on the
// CUDA cores, and the staging waits on global memory at every step; the product (rung 09) runs them on the tensor
// cores in 3xTF32, its copies in flight in a ring of cp.async stages.
//
// Launch (dev/ladder/fc1_weight_grad/op.py, launch_split_k): fc1_weight_grad_rung04_split_k_partial on grid
// (ceil(I / BN), ceil(O / BM), splits), blocks of (BM / TM) x (BN / TN) threads, partial in the op's scratch (dW
// itself with one split); then, with several splits, fc1_weight_grad_rung04_split_k_sum, a thread per weight in
// blocks of 256. The sizes come from there as -D options; the shared memory is sized here.
#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(TM) || !defined(TN)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(BM % TM == 0 && BN % TN == 0, "a tile holds whole TM x TN blocks of weights");
#define ROWS (BM / TM)  // threads down the tile (outputs) and across it (inputs)
#define COLS (BN / TN)
#define THREADS (ROWS * COLS)


// partial[z, o, i] = sum over the samples n of split z of dy[n, o] x[n, i]: rung 03's kernel over the split.
extern "C" __global__ void __launch_bounds__(THREADS)
    fc1_weight_grad_rung04_split_k_partial(const float* x, const float* dy, float* partial, int N, int I, int O,
                                           int k_per_split) {
    __shared__ float ds[BK][BM];  // ds[k][r]: dy[k0 + k, o0 + r]
    __shared__ float xs[BK][BN];  // xs[k][c]: x[k0 + k, i0 + c]

    const int o0 = blockIdx.y * BM, i0 = blockIdx.x * BN;
    const int k_begin = blockIdx.z * k_per_split, k_end = min(N, k_begin + k_per_split);
    const int tx = threadIdx.x % COLS, ty = threadIdx.x / COLS;

    float acc[TM][TN] = {};
    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
        for (int e = threadIdx.x; e < BK * BM; e += THREADS) {
            const int k = e / BM, r = e % BM, o = o0 + r;
            ds[k][r] = k0 + k < k_end && o < O ? dy[(size_t)(k0 + k) * O + o] : 0.0f;
        }
        for (int e = threadIdx.x; e < BK * BN; e += THREADS) {
            const int k = e / BN, c = e % BN, i = i0 + c;
            xs[k][c] = k0 + k < k_end && i < I ? x[(size_t)(k0 + k) * I + i] : 0.0f;
        }
        __syncthreads();  // the step is staged

#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a[TM], bx[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) a[i] = ds[k][ty + ROWS * i];
#pragma unroll
            for (int j = 0; j < TN; j++) bx[j] = xs[k][tx + COLS * j];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] += a[i] * bx[j];
        }
        __syncthreads();  // every thread is done with the step before the next one overwrites it
    }

    float* out = partial + (size_t)blockIdx.z * O * I;
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) {
            const int o = o0 + ty + ROWS * i, c = i0 + tx + COLS * j;
            if (o < O && c < I) out[(size_t)o * I + c] = acc[i][j];
        }
}

// dW[o, i] = sum_z partial[z, o, i], the splits added in order.
extern "C" __global__ void fc1_weight_grad_rung04_split_k_sum(const float* partial, float* dw, int splits, int N, int I,
                                                              int O) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= O * I) return;
    float s = 0.0f;
    for (int z = 0; z < splits; z++) s += partial[(size_t)z * O * I + idx];
    dw[idx] = s;
}
