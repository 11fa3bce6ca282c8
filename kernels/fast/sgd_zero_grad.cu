// sgd_zero_grad.cu: the update and the zero-grad in one pass, four floats at a time: the fast form of
// naive/sgd.cu and the zero-grad memset (the flat buffers are padded to a multiple of 4 and 16-byte
// aligned): p -= lr * g; g = 0.
#include "common.cuh"

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
