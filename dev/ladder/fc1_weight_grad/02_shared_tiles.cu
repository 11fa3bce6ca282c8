// Rung 02, shared tiles: a block computes a TILE x TILE tile of dW (TILE outputs x TILE inputs), one thread per
// weight, reading its operands from shared memory.
//   x [N,I], dy [N,O] -> dW [O,I] = dy^T x   (torch.nn.Linear's weight gradient; fc1: I = 3136, O = 128)
//
// What it adds over rung 01: the block walks the batch TILE samples at a time, and at each step stages in shared
// memory the TILE x TILE pieces of dy (its TILE outputs) and of x (its TILE inputs) that its weights need, each
// thread loading one element of each. Both operands are contiguous along the output's index (a row of dy holds the
// O outputs of a sample, a row of x its I inputs), so the threads of a row load adjacent addresses and the pieces
// go to shared memory as they are (ds[sample][output], xs[sample][input]). A value of x then comes from global
// memory once per block instead of once per output, a value of dy once per block instead of once per input, and
// elements past N, O or I are staged as zeros, so the inner loop needs no bounds checks. The bias gradient is left
// out: the op is the weight gradient alone. What it leaves: each multiply-add still takes two loads from shared
// memory, so shared memory, not the FMA units, sets the pace (rung 03).
//
// Launch (dev/ladder/fc1_weight_grad/op.py, launch_shared_tiles): grid (ceil(I / TILE), ceil(O / TILE)), blocks of
// TILE x TILE threads. TILE comes from there as a -D option; the shared memory is sized here.
#if !defined(TILE)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif


extern "C" __global__ void __launch_bounds__(TILE* TILE)
    fc1_weight_grad_rung02_shared_tiles(const float* x, const float* dy, float* dw, int N, int I, int O) {
    __shared__ float ds[TILE][TILE];  // ds[k][r]: dy[k0 + k, o0 + r]
    __shared__ float xs[TILE][TILE];  // xs[k][c]: x[k0 + k, i0 + c]

    const int o0 = blockIdx.y * TILE, i0 = blockIdx.x * TILE;
    // this thread's weight: output o0 + ty, input i0 + tx (consecutive threads, consecutive inputs)
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;

    float acc = 0.0f;
    for (int k0 = 0; k0 < N; k0 += TILE) {
        // Stage the step: thread (ty, tx) loads sample k0 + ty's output o0 + tx of dy and input i0 + tx of x.
        const int n = k0 + ty, o = o0 + tx, i = i0 + tx;
        ds[ty][tx] = n < N && o < O ? dy[(size_t)n * O + o] : 0.0f;
        xs[ty][tx] = n < N && i < I ? x[(size_t)n * I + i] : 0.0f;
        __syncthreads();  // the step is staged

#pragma unroll
        for (int kk = 0; kk < TILE; kk++) acc += ds[kk][ty] * xs[kk][tx];
        __syncthreads();  // every thread is done with the step before the next one overwrites it
    }

    const int o = o0 + ty, i = i0 + tx;
    if (o < O && i < I) dw[(size_t)o * I + i] = acc;
}
