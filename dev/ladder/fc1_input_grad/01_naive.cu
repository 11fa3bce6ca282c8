// Rung 01, naive: one thread per element of dx, the loop of the definition over the outputs, every operand read
// from global memory.
//   dy [N,O], W [O,I] -> dx [N,I] = dy W   (torch.nn.Linear's input gradient; fc1: I = 3136, O = 128)
//
// This is the product's naive kernel, linear_backward_input_naive of kernels/naive/6_linear.cu, copied verbatim so
// that the ladder's files stand alone (tests/test_ladder.py keeps the two the same). It is the yardstick every later
// rung is checked and timed against. What it leaves on the table: each thread reads a row of dy and a column of W,
// O values each, every multiply-add two loads from memory; a value of dy is loaded by the I threads of its row, a
// weight by the N threads of its column, and whatever reuse there is comes from the caches. The threads of a warp
// do read adjacent weights (consecutive inputs) and one shared value of dy, so its loads are coalesced.
//
// Launch (dev/ladder/fc1_input_grad/op.py, launch_naive): one thread per element of dx, blocks of 256 threads.


// dx[n,i] = sum_o dy[n,o] * W[o,i]
extern "C" __global__ void linear_backward_input_naive(const float* dy, const float* w, float* dx, int N, int I,
                                                       int O) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * I) return;
    int i = idx % I, n = idx / I;
    float acc = 0.0f;
    for (int o = 0; o < O; o++) acc += dy[n * O + o] * w[o * I + i];
    dx[idx] = acc;
}
