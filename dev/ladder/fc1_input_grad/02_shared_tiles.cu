// Rung 02, shared tiles: a block computes a TILE x TILE tile of dx (TILE samples x TILE inputs), one thread per
// element, reading its operands from shared memory.
//   dy [N,O], W [O,I] -> dx [N,I] = dy W   (torch.nn.Linear's input gradient; fc1: I = 3136, O = 128)
//
// What it adds over rung 01: the block walks along k (the O outputs) TILE at a time, and at each step stages in
// shared memory the TILE x TILE pieces of dy (its TILE samples) and of W (its TILE inputs) that its elements need,
// each thread loading one element of each, consecutive threads at adjacent addresses (a row of dy, a row of W). A
// value of dy then comes from global memory once per block instead of once per input of its row, a weight once per
// block instead of once per sample; elements past N, I or O are staged as zeros, so the inner loop needs no bounds
// checks. Reading ds[sample][k] (one word for the threads of a row, a broadcast) and ws[k][input] (adjacent words)
// hits no bank twice. What it leaves: each multiply-add still takes two loads from shared memory, so shared memory,
// not the FMA units, sets the pace (rung 03, whose larger tiles make fewer blocks than the GPU has SMs at batch 64,
// where it is slower than this rung; the product's narrow tiles give them back).
//
// Launch (dev/ladder/fc1_input_grad/op.py, launch_shared_tiles): grid (ceil(I / TILE), ceil(N / TILE)), blocks of
// TILE x TILE threads. TILE comes from there as a -D option; the shared memory is sized here.
#if !defined(TILE)
#error "compile through dev/ladder.py, which passes the tile sizes as -D options"
#endif


extern "C" __global__ void __launch_bounds__(TILE* TILE)
    fc1_input_grad_rung02_shared_tiles(const float* dy, const float* w, float* dx, int N, int I, int O) {
    __shared__ float ds[TILE][TILE];  // ds[r][k]: dy[n0 + r, k0 + k]
    __shared__ float ws[TILE][TILE];  // ws[k][c]: W[k0 + k, i0 + c]

    const int n0 = blockIdx.y * TILE, i0 = blockIdx.x * TILE;
    // this thread's element: sample n0 + ty, input i0 + tx (consecutive threads, consecutive inputs)
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;

    float acc = 0.0f;
    for (int k0 = 0; k0 < O; k0 += TILE) {
        // Stage the step: thread (ty, tx) loads output k0 + tx of dy's row n0 + ty, input i0 + tx of W's row k0 + ty.
        const int n = n0 + ty, i = i0 + tx;
        ds[ty][tx] = n < N && k0 + tx < O ? dy[(size_t)n * O + k0 + tx] : 0.0f;
        ws[ty][tx] = k0 + ty < O && i < I ? w[(size_t)(k0 + ty) * I + i] : 0.0f;
        __syncthreads();  // the step is staged

#pragma unroll
        for (int kk = 0; kk < TILE; kk++) acc += ds[ty][kk] * ws[kk][tx];
        __syncthreads();  // every thread is done with the step before the next one overwrites it
    }

    const int n = n0 + ty, i = i0 + tx;
    if (n < N && i < I) dx[(size_t)n * I + i] = acc;
}
