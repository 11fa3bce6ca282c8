// Rung 03, register blocking: a block computes a BM x BN tile of dx, each thread TM x TN elements held in
// registers, as outer products of TM values of dy and TN weights loaded once from shared memory for each k.
//   dy [N,O], W [O,I] -> dx [N,I] = dy W   (torch.nn.Linear's input gradient; fc1: I = 3136, O = 128)
//
// What it adds over rung 02: in rung 02 every multiply-add takes two loads from shared memory. Here, for each k of
// a staged step, a thread loads TM values of dy (its samples) and TN weights (its inputs) into registers, then
// makes their TM x TN multiply-adds: TM + TN loads for TM x TN products (with 4 and 4: 8 loads for 16, where rung
// 02 makes 32). The staged pieces are k-major: W's rows go across as they lie in memory (ws[k][input]), dy's piece
// is turned as it is stored (ds[k][sample], its rows padded by one float so that those stores spread over the
// banks), so a thread's values for one k lie in one row. A thread's samples and inputs are interleaved across the
// tile (sample ty + i x BM / TM, input tx + j x BN / TN), so that the threads of a warp read adjacent words of a row
// (or one word, broadcast) and store adjacent elements. The tile is larger than rung 02's, so a staged value serves
// more elements, and the staging loops give each thread several. Still fp32 on the CUDA cores. What it leaves: the
// staging waits on global memory at every step, and the products could run on the tensor cores; the product
// (rung 09) runs them in 3xTF32, its copies in flight in a ring of cp.async stages, and takes tiles half as wide
// where the wide ones would leave SMs idle (fc1 at a batch of 64 makes 49 blocks of 64 x 64).
//
// Launch (dev/ladder/fc1_input_grad/op.py, launch_register_blocking): grid (ceil(I / BN), ceil(N / BM)), blocks of
// (BM / TM) x (BN / TN) threads. The sizes come from there as -D options; the shared memory is sized here.
#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(TM) || !defined(TN)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif
static_assert(BM % TM == 0 && BN % TN == 0, "a tile holds whole TM x TN blocks of elements");
#define ROWS (BM / TM)  // threads down the tile (samples) and across it (inputs)
#define COLS (BN / TN)
#define THREADS (ROWS * COLS)


extern "C" __global__ void __launch_bounds__(THREADS)
    fc1_input_grad_rung03_register_blocking(const float* dy, const float* w, float* dx, int N, int I, int O) {
    __shared__ float ds[BK][BM + 1];  // ds[k][r]: dy[n0 + r, k0 + k] (turned as it is stored)
    __shared__ float ws[BK][BN];      // ws[k][c]: W[k0 + k, i0 + c]

    const int n0 = blockIdx.y * BM, i0 = blockIdx.x * BN;
    // this thread's elements: samples n0 + ty + ROWS * i (i < TM) x inputs i0 + tx + COLS * j (j < TN)
    const int tx = threadIdx.x % COLS, ty = threadIdx.x / COLS;

    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < O; k0 += BK) {
        // Stage the step: every thread takes a share of each piece, consecutive threads along a row (coalesced).
        for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
            const int r = e / BK, k = e % BK, n = n0 + r;
            ds[k][r] = n < N && k0 + k < O ? dy[(size_t)n * O + k0 + k] : 0.0f;
        }
        for (int e = threadIdx.x; e < BK * BN; e += THREADS) {
            const int k = e / BN, c = e % BN, i = i0 + c;
            ws[k][c] = k0 + k < O && i < I ? w[(size_t)(k0 + k) * I + i] : 0.0f;
        }
        __syncthreads();  // the step is staged

#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a[TM], bw[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) a[i] = ds[k][ty + ROWS * i];
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
            const int n = n0 + ty + ROWS * i, c = i0 + tx + COLS * j;
            if (n < N && c < I) dx[(size_t)n * I + c] = acc[i][j];
        }
}
