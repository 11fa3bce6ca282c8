// Rung 03, register blocking: a block computes a BM x BN tile of dW, each thread TM x TN weights held in registers,
// as outer products of TM values of dy and TN values of x loaded once from shared memory for each sample.
//   x [N,I], dy [N,O] -> dW [O,I] = dy^T x   (torch.nn.Linear's weight gradient; fc1: I = 3136, O = 128)
//
// What it adds over rung 02: in rung 02 every multiply-add takes two loads from shared memory. Here, for each
// sample of a staged step, a thread loads TM values of dy (its outputs) and TN values of x (its inputs) into
// registers, then makes their TM x TN multiply-adds: TM + TN loads for TM x TN products (with 4 and 4: 8 loads for
// 16, where rung 02 makes 32). The staged pieces are sample-major (ds[sample][output], xs[sample][input]), as the
// operands lie in memory, so the staging copies rows straight across; a thread's outputs and inputs are interleaved
// across the tile (output ty + i x BM / TM, input tx + j x BN / TN), so that the threads of a warp read adjacent
// words of a row (or one word, broadcast) and store adjacent weights. The tile is larger than rung 02's, so a
// staged value serves more weights, and the staging loops give each thread several elements. Still fp32 on the CUDA
// cores. What it leaves: fc1's weights make 98 tiles of 64 x 64 whatever the batch, fewer than one per SM, each
// walking the whole batch alone: as long as 4096 samples at the largest batches (rung 04 cuts that walk into
// splits).
//
// Launch (dev/ladder/fc1_weight_grad/op.py, launch_register_blocking): grid (ceil(I / BN), ceil(O / BM)), blocks of
// (BM / TM) x (BN / TN) threads. The sizes come from there as -D options; the shared memory is sized here.
#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(TM) || !defined(TN)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(BM % TM == 0 && BN % TN == 0, "a tile holds whole TM x TN blocks of weights");
#define ROWS (BM / TM)  // threads down the tile (outputs) and across it (inputs)
#define COLS (BN / TN)
#define THREADS (ROWS * COLS)


extern "C" __global__ void __launch_bounds__(THREADS)
    fc1_weight_grad_rung03_register_blocking(const float* x, const float* dy, float* dw, int N, int I, int O) {
    __shared__ float ds[BK][BM];  // ds[k][r]: dy[k0 + k, o0 + r]
    __shared__ float xs[BK][BN];  // xs[k][c]: x[k0 + k, i0 + c]

    const int o0 = blockIdx.y * BM, i0 = blockIdx.x * BN;
    // this thread's weights: outputs o0 + ty + ROWS * i (i < TM) x inputs i0 + tx + COLS * j (j < TN)
    const int tx = threadIdx.x % COLS, ty = threadIdx.x / COLS;

    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < N; k0 += BK) {
        // Stage the step: every thread takes a share of each piece, consecutive threads along a row (coalesced).
        for (int e = threadIdx.x; e < BK * BM; e += THREADS) {
            const int k = e / BM, r = e % BM, o = o0 + r;
            ds[k][r] = k0 + k < N && o < O ? dy[(size_t)(k0 + k) * O + o] : 0.0f;
        }
        for (int e = threadIdx.x; e < BK * BN; e += THREADS) {
            const int k = e / BN, c = e % BN, i = i0 + c;
            xs[k][c] = k0 + k < N && i < I ? x[(size_t)(k0 + k) * I + i] : 0.0f;
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

#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) {
            const int o = o0 + ty + ROWS * i, c = i0 + tx + COLS * j;
            if (o < O && c < I) dw[(size_t)o * I + c] = acc[i][j];
        }
}
