// 6_linear.cu: fully connected layer y = x W^T + b, as torch.nn.Linear.
//   x [N,I], W [O,I], b [O] -> y [N,O]
//
// naive: one thread per output element of each product.
#include "common.cuh"


extern "C" __global__ void linear_forward_naive(const float* x, const float* w, const float* b, float* y, int N, int I,
                                                int O) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * O) return;
    int o = idx % O, n = idx / O;
    float acc = b[o];
    for (int i = 0; i < I; i++) acc += x[n * I + i] * w[o * I + i];
    y[idx] = acc;
}

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
