// input.cu: the batch's images, MNIST's bytes, normalised to float32 (normalize_pixel in common.cuh) for
// the naive kernels. The fast conv1 kernels normalise as they stage an image, without this launch.
#include "common.cuh"

extern "C" __global__ void normalize_images(const unsigned char* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = normalize_pixel(x[i]);
}
