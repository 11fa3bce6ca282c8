// 6_splitk_reduce.cu: the second half of a split-K matrix product (fc1's, and conv2's weight gradient): the
// fast form of no naive file, since the naive products (linear_forward_naive, linear_backward_params_naive,
// conv2d_backward_weight_naive) sum over the whole k range in one pass. The k range of a product was cut into
// `splits` pieces, each block writing its own partial result; here they are summed in split order
// (deterministic), with an optional bias (indexed by column) and ReLU.
#include "common.cuh"

// out[i] = sum_z partial[z*count + i] (+ bias[i % cols]) (then relu), one thread per output element.
// K models (grid z: kernels/include/common.cuh): model m's partials [splits][count] at m * splits * count, where
// the split products write them; its out at m * out_stride (its activations' count, or the gradients'
// param_stride) and its bias at m * bias_stride (param_stride).
extern "C" __global__ void splitk_reduce_fast(const float* partial, int splits, int count, const float* bias, int cols,
                                              int has_bias, int apply_relu, float* out, int out_stride,
                                              int bias_stride) {
    const int model = model_index();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    partial = model_part(partial, (size_t)splits * count, model);
    out = model_part(out, out_stride, model);
    float s = sum_in_order(partial + i, splits, count);
    if (has_bias) s += model_part(bias, bias_stride, model)[i % cols];
    out[i] = apply_relu ? relu(s) : s;
}
