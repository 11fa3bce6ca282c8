// Rung 03, register blocking: a block computes a BM x BN tile of y, each thread TM x TN outputs held in registers,
// as outer products of TM values of x and TN weights loaded once from shared memory for each k.
//   x [N,I], W [O,I], b [O] -> y [N,O] = relu(x W^T + b)   (torch.nn.Linear and its ReLU; fc1: I = 3136, O = 128)
//
// What it adds over rung 02: in rung 02 every multiply-add takes two loads from shared memory. Here, for each k of
// a staged step, a thread loads TM values of x (its samples) and TN weights (its outputs) into registers, then makes
// their TM x TN multiply-adds: TM + TN loads for TM x TN products (with 4 and 4: 8 loads for 16, where rung 02 makes
// 32). The staged pieces are stored k-major (xs[k][sample], ws[k][output]), so a thread's values for one k lie in
// one row; a thread's samples and outputs are interleaved across the tile (sample ty + i x BM / TM, output
// tx + j x BN / TN), so that the threads of a warp read adjacent words of a row (or one word, broadcast) and store
// adjacent outputs. The tile is larger than rung 02's, so a staged element serves more outputs (BN samples' worth
// of each weight, BM outputs' worth of each x), and the staging loops give each thread several elements. Still
// fp32 on the CUDA cores. What it leaves: with 64 x 64 tiles, fc1's 128 outputs make two columns of tiles, so a
// batch of 64 makes 2 blocks and even 4096 makes 128, fewer than the GPU's SMs, each block walking all 3136 inputs
// alone (rung 04 cuts that walk into splits).
//
// Launch (dev/ladder/fc1_forward/op.py, launch_register_blocking): grid (ceil(O / BN), ceil(N / BM)), blocks of
// (BM / TM) x (BN / TN) threads. The sizes come from there as -D options; the shared memory is sized here.
#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(TM) || !defined(TN)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(BM % TM == 0 && BN % TN == 0, "a tile holds whole TM x TN blocks of outputs");
#define ROWS (BM / TM)  // threads down the tile (samples) and across it (outputs)
#define COLS (BN / TN)
#define THREADS (ROWS * COLS)


__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }  // NaN passes

extern "C" __global__ void __launch_bounds__(THREADS)
    fc1_forward_rung03_register_blocking(const float* x, const float* w, const float* b, float* y, int N, int I,
                                         int O) {
    __shared__ float xs[BK][BM + 1];  // xs[k][r]: x[n0 + r, k0 + k] (a padded row: the k-major stores spread over
    __shared__ float ws[BK][BN + 1];  // ws[k][c]: W[o0 + c, k0 + k]   the banks)

    const int n0 = blockIdx.y * BM, o0 = blockIdx.x * BN;
    // this thread's outputs: samples n0 + ty + ROWS * i (i < TM) x outputs o0 + tx + COLS * j (j < TN)
    const int tx = threadIdx.x % COLS, ty = threadIdx.x / COLS;

    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < I; k0 += BK) {
        // Stage the step: every thread takes a share of each piece, consecutive threads along k (coalesced).
        for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
            const int r = e / BK, k = e % BK, n = n0 + r;
            xs[k][r] = n < N && k0 + k < I ? x[(size_t)n * I + k0 + k] : 0.0f;
        }
        for (int e = threadIdx.x; e < BN * BK; e += THREADS) {
            const int c = e / BK, k = e % BK, o = o0 + c;
            ws[k][c] = o < O && k0 + k < I ? w[(size_t)o * I + k0 + k] : 0.0f;
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

#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) {
            const int n = n0 + ty + ROWS * i, o = o0 + tx + COLS * j;
            if (n < N && o < O) y[(size_t)n * O + o] = relu(acc[i][j] + b[o]);
        }
}
