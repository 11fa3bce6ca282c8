"""The launch contracts: the only code that knows a kernel's grid, block, arguments and compile-time
constants (which reach the .cu files as NVRTC -D options from here).

    naive                  kernels/naive/*.cu: one op per file, one thread per output
    both                   kernels/both/*.cu: the kernels both nets launch (shift, schedule, accuracy count)
    conv1_bn_relu_pool     kernels/fast/1_conv1_bn_relu_pool.cu
    conv2_implicit_gemm    kernels/fast/2_conv2_implicit_gemm.cu
    bn_relu_pool           kernels/fast/3_bn_relu_pool.cu
    linear_splitk          kernels/fast/4_linear_splitk.cu
    head                   kernels/fast/5_head.cu
    splitk_reduce          kernels/fast/6_splitk_reduce.cu
    sgd_zero_grad          kernels/fast/7_sgd_zero_grad.cu

The networks (mnist_cuda/nets/), the tests and the dev/ programs all launch through these functions.
"""

from . import (
    bn_relu_pool,
    both,
    conv1_bn_relu_pool,
    conv2_implicit_gemm,
    head,
    linear_splitk,
    naive,
    sgd_zero_grad,
    splitk_reduce,
)

__all__ = [
    "bn_relu_pool",
    "both",
    "conv1_bn_relu_pool",
    "conv2_implicit_gemm",
    "head",
    "linear_splitk",
    "naive",
    "sgd_zero_grad",
    "splitk_reduce",
]
