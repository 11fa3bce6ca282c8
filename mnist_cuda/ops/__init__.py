"""The launch contracts: the only code that knows a kernel's grid, block, arguments and compile-time
constants (which reach the .cu files as NVRTC -D options from here).

    naive                  kernels/naive/*.cu: one op per file, one thread per output
    conv1_bn_relu_pool     kernels/fast/conv1_bn_relu_pool.cu
    conv2_implicit_gemm    kernels/fast/conv2_implicit_gemm.cu
    bn_relu_pool           kernels/fast/bn_relu_pool.cu
    linear_splitk          kernels/fast/linear_splitk.cu
    splitk_reduce          kernels/fast/splitk_reduce.cu
    head                   kernels/fast/head.cu
    sgd_zero_grad          kernels/fast/sgd_zero_grad.cu

The networks (mnist_cuda/nets/), the tests and the dev/ programs all launch through these functions.
"""

from . import (
    bn_relu_pool,
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
    "conv1_bn_relu_pool",
    "conv2_implicit_gemm",
    "head",
    "linear_splitk",
    "naive",
    "sgd_zero_grad",
    "splitk_reduce",
]
