// Rung 01, naive: one thread per output, the loop of the definition, every operand read from global memory; then
// the ReLU, a second launch with a thread per element.
//   x [N,I], W [O,I], b [O] -> y [N,O] = relu(x W^T + b)   (torch.nn.Linear and its ReLU; fc1: I = 3136, O = 128)
//
// These are the product's naive kernels, linear_forward_naive of kernels/naive/6_linear.cu and relu_forward_naive of
// kernels/naive/4_relu.cu, copied verbatim so that the ladder's files stand alone (tests/test_ladder.py keeps them the
// same), with the ReLU helper of kernels/include/common.cuh that the second one calls. They are the yardstick every
// later rung is checked and timed against. What they leave on the table: each thread reads a row of x and a row of
// W, I values each, straight from memory: a value of x is loaded by the O threads of its row, a weight by the N
// threads of its column, and whatever reuse there is comes from the caches. Each multiply-add costs two loads, and
// the threads of a warp read W's rows I floats apart (one value of x, shared), so each of their loads of W touches
// as many memory sectors as the warp has threads. The pre-activation makes a round trip through memory between the two
// launches.
//
// Launch (dev/ladder/fc1_forward/op.py, launch_naive): linear_forward_naive, then relu_forward_naive, each one
// thread per element of y in blocks of 256 threads; the pre-activation in the op's scratch.


// ReLU that lets NaN through, as PyTorch's does (kernels/include/common.cuh).
__device__ __forceinline__ float relu(float v) { return (v > 0.0f || isnan(v)) ? v : 0.0f; }


extern "C" __global__ void linear_forward_naive(const float* x, const float* w, const float* b, float* y, int N, int I,
                                                int O) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * O) return;
    int o = idx % O, n = idx / O;
    float acc = b[o];
    for (int i = 0; i < I; i++) acc += x[n * I + i] * w[o * I + i];
    y[idx] = acc;
}

extern "C" __global__ void relu_forward_naive(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = relu(x[i]);
}
