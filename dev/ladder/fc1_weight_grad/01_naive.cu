// Rung 01, naive: one thread per weight, the loop of the definition over the batch, every operand read from global
// memory; O more threads sum the bias gradient.
//   x [N,I], dy [N,O] -> dW [O,I] = dy^T x   (torch.nn.Linear's weight gradient; fc1: I = 3136, O = 128)
//
// This is the product's naive kernel, linear_backward_params_naive of kernels/naive/6_linear.cu, copied verbatim so
// that the ladder's files stand alone (tests/test_ladder.py keeps the two the same). It is the yardstick every later
// rung is checked and timed against. It also writes the bias gradient db[o] = sum_n dy[n,o], which the op leaves
// out (the step takes it from the head): here it goes to the op's scratch. What it leaves on the table: each
// thread walks the batch down a column of x and one of dy, N values each, every multiply-add two loads from memory;
// a value of x is loaded by the O threads of its column, one of dy by the I threads of its column, and whatever
// reuse there is comes from the caches. The reduction is as long as the batch, in one thread.
//
// Launch (dev/ladder/fc1_weight_grad/op.py, launch_naive): one thread per weight and one per bias, O x (I + 1)
// threads in blocks of 256; db in the op's scratch.


// dW[o,i] = sum_n dy[n,o] * x[n,i];  the last O threads also compute db[o] = sum_n dy[n,o].
extern "C" __global__ void linear_backward_params_naive(const float* x, const float* dy, float* dw, float* db, int N,
                                                        int I, int O) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < O * I) {
        int i = idx % I, o = idx / I;
        float acc = 0.0f;
        for (int n = 0; n < N; n++) acc += dy[n * O + o] * x[n * I + i];
        dw[idx] = acc;
    } else if (idx < O * I + O) {
        int o = idx - O * I;
        float acc = 0.0f;
        for (int n = 0; n < N; n++) acc += dy[n * O + o];
        db[o] = acc;
    }
}
