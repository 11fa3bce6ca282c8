// 7_sgd_zero_grad.cu: the update and the zero-grad in one pass, four floats at a time: the fast form of
// naive/8_sgd.cu and the zero-grad memset (the flat buffers are padded to a multiple of 4 and 16-byte
// aligned): p -= lr * g; g = 0.
#include "common.cuh"
#include "sgd_options.cuh"

// SGD_PLAIN: a model's kind in sgd_models_zero_grad_fast that takes plain SGD (any other takes the options);
// from mnist_cuda/ops/sgd_zero_grad.py.
#if !defined(SGD_PLAIN)
#error "compile through mnist_cuda.ops, which passes the update kinds as -D options"
#endif

// Plain SGD of the four floats at i, then their zero-grad. The single-model and the K-model kernels both call
// it, so that the compiler contracts p - lr * g alike in both and a model's bits do not depend on the launch.
__device__ __forceinline__ void sgd_plain_step(float4* params, float4* grads, float lr, int i) {
    float4 p = params[i];
    const float4 g = grads[i];
    p.x -= lr * g.x;
    p.y -= lr * g.y;
    p.z -= lr * g.z;
    p.w -= lr * g.w;
    params[i] = p;
    grads[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// torch.optim.SGD's step with its options of the four floats at i (sgd_element), then their zero-grad; the
// buffers are written only with momentum (without, they may be the gradients themselves).
__device__ __forceinline__ void sgd_options_step(float4* params, float4* grads, float4* buffers, float lr, bool first,
                                                 float momentum, float one_minus_dampening, float weight_decay,
                                                 int nesterov, int i) {
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

extern "C" __global__ void sgd_zero_grad_fast(float4* params, float4* grads, float lr, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    sgd_plain_step(params, grads, lr, i);
}

// torch.optim.SGD with its options, four floats at a time, then the zero-grad: the fast form of
// sgd_momentum_naive (naive/8_sgd.cu), with the rate and the buffers' first step from sgd_schedule.
extern "C" __global__ void sgd_momentum_zero_grad_fast(float4* params, float4* grads, float4* buffers,
                                                       const float* lr_in, const int* first_in, float momentum,
                                                       float one_minus_dampening, float weight_decay, int nesterov,
                                                       int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    sgd_options_step(params, grads, buffers, *lr_in, *first_in != 0, momentum, one_minus_dampening, weight_decay,
                     nesterov, i);
}

// K models' updates in one launch (kernels/include/common.cuh: grid z is the model), each with its own
// hyperparameters, so they come as arrays [K] on the device: model m's kind (SGD_PLAIN: sgd_zero_grad_fast's
// step at lr[m]; else sgd_momentum_zero_grad_fast's with the rest). Each model's flat buffers (params, grads,
// buffers) are n4 float4 long, model m's at m * n4. The kind is the block's model's, so a block never diverges.
extern "C" __global__ void sgd_models_zero_grad_fast(float4* params, float4* grads, float4* buffers, const float* lr,
                                                     const int* first, const float* momentum,
                                                     const float* one_minus_dampening, const float* weight_decay,
                                                     const int* nesterov, const int* kind, int n4) {
    const int model = model_index();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    params = model_part(params, n4, model);
    grads = model_part(grads, n4, model);
    if (kind[model] == SGD_PLAIN) {
        sgd_plain_step(params, grads, lr[model], i);
        return;
    }
    sgd_options_step(params, grads, model_part(buffers, n4, model), lr[model], first[model] != 0, momentum[model],
                     one_minus_dampening[model], weight_decay[model], nesterov[model], i);
}
