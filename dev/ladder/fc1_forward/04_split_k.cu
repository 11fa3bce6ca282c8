// Rung 04, split k: rung 03's tiles with the long reduction over the I inputs cut into splits, a block per tile and
// split writing its partial sums, and a second kernel adding the splits in order, the bias and the ReLU.
//   x [N,I], W [O,I], b [O] -> y [N,O] = relu(x W^T + b)   (torch.nn.Linear and its ReLU; fc1: I = 3136, O = 128)
//
// What it adds over rung 03: fc1's output is small (N x 128) and its reduction long (3136), so rung 03 makes few
// blocks (2 at a batch of 64, 16 at 512), each walking all of k while most SMs idle. Here grid z cuts k into
// splits of k_per_split (a multiple of BK): block z sums k in [z x k_per_split, (z + 1) x k_per_split) of its tile
// into partial [z, N, O], and the second kernel, a thread per element of y, adds the splits in split order, then
// the bias and the ReLU. The order is fixed, with no atomics, so the result is the same bits at every run. op.py
// picks the splits as the product does: tiles x splits blocks in one wave at 3 blocks per SM, each split at least
// 4 steps long. The price is the partial sums' round trip through memory (splits x N x O floats) and a second
// launch. What it leaves: the products are still fp32 on the CUDA cores, and the staging waits on global memory at
// every step; the product (rung 09) runs them on the tensor cores in 3xTF32, its copies in flight in a ring of
// cp.async stages.
//
// Launch (dev/ladder/fc1_forward/op.py, launch_split_k): fc1_forward_rung04_split_k_partial on grid (ceil(O / BN),
// ceil(N / BM), splits), blocks of (BM / TM) x (BN / TN) threads, partial in the op's scratch; then
// fc1_forward_rung04_split_k_sum, a thread per element of y in blocks of 256. The sizes come from there as -D
// options; the shared memory is sized here.
#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(TM) || !defined(TN)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(BM % TM == 0 && BN % TN == 0, "a tile holds whole TM x TN blocks of outputs");
#define ROWS (BM / TM)  // threads down the tile (samples) and across it (outputs)
#define COLS (BN / TN)
#define THREADS (ROWS * COLS)


__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }  // NaN passes

// partial[z, n, o] = sum over k in split z of x[n, k] W[o, k]: rung 03's kernel over the split's range of k.
extern "C" __global__ void __launch_bounds__(THREADS)
    fc1_forward_rung04_split_k_partial(const float* x, const float* w, float* partial, int N, int I, int O,
                                       int k_per_split) {
    __shared__ float xs[BK][BM + 1];  // xs[k][r]: x[n0 + r, k0 + k]
    __shared__ float ws[BK][BN + 1];  // ws[k][c]: W[o0 + c, k0 + k]

    const int n0 = blockIdx.y * BM, o0 = blockIdx.x * BN;
    const int k_begin = blockIdx.z * k_per_split, k_end = min(I, k_begin + k_per_split);
    const int tx = threadIdx.x % COLS, ty = threadIdx.x / COLS;

    float acc[TM][TN] = {};
    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
        for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
            const int r = e / BK, k = e % BK, n = n0 + r;
            xs[k][r] = n < N && k0 + k < k_end ? x[(size_t)n * I + k0 + k] : 0.0f;
        }
        for (int e = threadIdx.x; e < BN * BK; e += THREADS) {
            const int c = e / BK, k = e % BK, o = o0 + c;
            ws[k][c] = o < O && k0 + k < k_end ? w[(size_t)o * I + k0 + k] : 0.0f;
        }
        __syncthreads();  // the step is staged

#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a[TM], bw[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) a[i] = xs[k][ty + ROWS * i];
#pragma unroll
            for (int j = 0; j < TN; j++) bw[j] = ws[k][tx + COLS * j];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] += a[i] * bw[j];
        }
        __syncthreads();  // every thread is done with the step before the next one overwrites it
    }

    float* out = partial + (size_t)blockIdx.z * N * O;
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) {
            const int n = n0 + ty + ROWS * i, o = o0 + tx + COLS * j;
            if (n < N && o < O) out[(size_t)n * O + o] = acc[i][j];
        }
}

// y[n, o] = relu(sum_z partial[z, n, o] + b[o]), the splits added in order.
extern "C" __global__ void fc1_forward_rung04_split_k_sum(const float* partial, const float* b, float* y, int splits,
                                                          int N, int I, int O) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * O) return;
    float s = 0.0f;
    for (int z = 0; z < splits; z++) s += partial[(size_t)z * N * O + idx];
    y[idx] = relu(s + b[idx % O]);
}
