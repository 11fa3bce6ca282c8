// 4_relu.cu: ReLU, one thread per element.
#include "common.cuh"


extern "C" __global__ void relu_forward_naive(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = relu(x[i]);
}

// y is ReLU's output: like PyTorch, the gradient passes where y > 0.
extern "C" __global__ void relu_backward_naive(const float* dy, const float* y, float* dx, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
