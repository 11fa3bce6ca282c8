// Rung 02, shared tiles: a block computes a TILE x TILE tile of y (TILE samples x TILE outputs), one thread per
// output, reading its operands from shared memory; the bias and the ReLU in the same kernel.
//   x [N,I], W [O,I], b [O] -> y [N,O] = relu(x W^T + b)   (torch.nn.Linear and its ReLU; fc1: I = 3136, O = 128)
//
// What it adds over rung 01: the block walks along k (the I inputs) TILE at a time, and at each step stages in
// shared memory the TILE x TILE pieces of x (its TILE samples) and of W (its TILE outputs) that its outputs need,
// each thread loading one element of each. Both operands are k-contiguous, so the threads of a row load adjacent
// addresses (coalesced), where rung 01's warps read W's rows I floats apart. A value of x then comes from global
// memory once per block instead of once per output of its row, a weight once per block instead of once per
// sample; elements past N, O or I are staged as zeros, so the inner loop needs no bounds checks. The bias and the
// ReLU are applied as the result is stored: no second launch, no round trip of the pre-activation. The rows of the
// staged tiles are padded by one float, so that the threads of a warp, reading W's tile down a column, hit
// different banks. What it leaves: each multiply-add still takes two loads from shared memory, so shared memory,
// not the FMA units, sets the pace (rung 03, whose larger tiles then make too few blocks for fc1 at small batches:
// rung 04 gives them back).
//
// Launch (dev/ladder/fc1_forward/op.py, launch_shared_tiles): grid (ceil(O / TILE), ceil(N / TILE)), blocks of
// TILE x TILE threads. TILE comes from there as a -D option; the shared memory is sized here.
#if !defined(TILE)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif


__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }  // NaN passes

extern "C" __global__ void __launch_bounds__(TILE* TILE)
    fc1_forward_rung02_shared_tiles(const float* x, const float* w, const float* b, float* y, int N, int I, int O) {
    __shared__ float xs[TILE][TILE + 1];  // xs[r][k]: x[n0 + r, k0 + k]
    __shared__ float ws[TILE][TILE + 1];  // ws[c][k]: W[o0 + c, k0 + k]

    const int n0 = blockIdx.y * TILE, o0 = blockIdx.x * TILE;
    // this thread's output: sample n0 + ty, output o0 + tx (consecutive threads, consecutive outputs)
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;

    float acc = 0.0f;
    for (int k0 = 0; k0 < I; k0 += TILE) {
        // Stage the step: thread (ty, tx) loads element k0 + tx of x's row n0 + ty and of W's row o0 + ty.
        const int k = k0 + tx, n = n0 + ty, o = o0 + ty;
        xs[ty][tx] = n < N && k < I ? x[(size_t)n * I + k] : 0.0f;
        ws[ty][tx] = o < O && k < I ? w[(size_t)o * I + k] : 0.0f;
        __syncthreads();  // the step is staged

#pragma unroll
        for (int kk = 0; kk < TILE; kk++) acc += xs[ty][kk] * ws[tx][kk];
        __syncthreads();  // every thread is done with the step before the next one overwrites it
    }

    const int n = n0 + ty, o = o0 + tx;
    if (n < N && o < O) y[(size_t)n * O + o] = relu(acc + b[o]);
}
