// sgd.cu: plain SGD over the flat parameter buffer, p -= lr * g (no momentum, no weight decay).
#include "common.cuh"

extern "C" __global__ void sgd_naive(float* params, const float* grads, float lr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) params[i] -= lr * grads[i];
}
