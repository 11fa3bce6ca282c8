// 1_normalize.cu: the batch's images, MNIST's bytes, to the float32 the network sees (normalize_pixel in
// common.cuh): one thread per pixel. (The fast conv1 kernels normalise as they stage an image.)
#include "common.cuh"

extern "C" __global__ void normalize_naive(const unsigned char* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = normalize_pixel(x[i]);
}
