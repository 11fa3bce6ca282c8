// shift_images.cu: the augmentation's shift, one of the kernels both nets launch (the naive net and the
// fast net shift the batch's images with this same kernel, before the model): each image of the batch
// moved by its own whole-pixel offset (dx, dy), the pixels moved in from outside the image are background
// (0): one thread per output pixel. The offsets are drawn on the host and travel with the batch in its one
// copy, so the step graph stays the same.
#include "common.cuh"

#if !defined(IMAGE_SIZE)
#error "shift_images.cu needs IMAGE_SIZE (mnist_cuda/ops/both.py passes it)"
#endif

extern "C" __global__ void shift_images(const unsigned char* x, const signed char* offsets, unsigned char* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * IMAGE_SIZE * IMAGE_SIZE) return;
    const int image = i / (IMAGE_SIZE * IMAGE_SIZE), pixel = i % (IMAGE_SIZE * IMAGE_SIZE);
    const int row = pixel / IMAGE_SIZE - offsets[2 * image + 1], col = pixel % IMAGE_SIZE - offsets[2 * image];
    const bool inside = row >= 0 && row < IMAGE_SIZE && col >= 0 && col < IMAGE_SIZE;
    out[i] = inside ? x[image * IMAGE_SIZE * IMAGE_SIZE + row * IMAGE_SIZE + col] : 0;
}
