// 7_sgd_zero_grad.cu: the update and the zero-grad in one pass, four floats at a time: the fast form of
// naive/8_sgd.cu and the zero-grad memset (the flat buffers are padded to a multiple of 4 and 16-byte
// aligned): p -= lr * g; g = 0.
#include "common.cuh"
#include "sgd_options.cuh"

extern "C" __global__ void sgd_zero_grad_fast(float4* params, float4* grads, float lr, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 p = params[i];
    const float4 g = grads[i];
    p.x -= lr * g.x;
    p.y -= lr * g.y;
    p.z -= lr * g.z;
    p.w -= lr * g.w;
    params[i] = p;
    grads[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// torch.optim.SGD with its options, four floats at a time, then the zero-grad: the fast form of
// sgd_momentum_naive (naive/8_sgd.cu), with the rate and the buffers' first step from sgd_schedule.
extern "C" __global__ void sgd_momentum_zero_grad_fast(float4* params, float4* grads, float4* buffers,
                                                       const float* lr_in, const int* first_in, float momentum,
                                                       float one_minus_dampening, float weight_decay, int nesterov,
                                                       int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    const float lr = *lr_in;
    const bool first = *first_in != 0;
    float4 p = params[i], b = buffers[i];
    const float4 g = grads[i];
    p.x = sgd_element(g.x, p.x, b.x, lr, first, momentum, one_minus_dampening, weight_decay, nesterov);
    p.y = sgd_element(g.y, p.y, b.y, lr, first, momentum, one_minus_dampening, weight_decay, nesterov);
    p.z = sgd_element(g.z, p.z, b.z, lr, first, momentum, one_minus_dampening, weight_decay, nesterov);
    p.w = sgd_element(g.w, p.w, b.w, lr, first, momentum, one_minus_dampening, weight_decay, nesterov);
    params[i] = p;
    if (momentum != 0.0f) buffers[i] = b;
    grads[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
