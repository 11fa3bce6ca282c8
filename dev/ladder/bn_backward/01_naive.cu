// Rung 01, naive: the product's naive backward of BN2 + ReLU + max pool, three kernels that each read and write
// full [N,C,S,S] tensors: the pool's backward scatters the pooled gradient to the window's argmax, the ReLU's
// backward masks it where the ReLU's output is not positive, and BatchNorm's backward, a block per channel, sums
// dbeta and dgamma and then writes dx.
//   dz[n,c,h,w] = d_pooled[n,c,h/2,w/2] where (h,w) is its window's argmax and relu_out[n,c,h,w] > 0, else 0;
//   dbeta[c] = sum dz, dgamma[c] = sum dz xhat, xhat = (x - mean[c]) invstd[c] (sums over N x S x S = count);
//   dx = gamma[c] invstd[c] / count (count dz - dbeta[c] - xhat dgamma[c])
//
// These are the product's naive kernels, maxpool2x2_backward_naive of kernels/naive/5_maxpool.cu, relu_backward_naive
// of kernels/naive/4_relu.cu and batchnorm_backward_naive of kernels/naive/3_batchnorm.cu, copied verbatim so that the
// ladder's files stand alone (tests/test_ladder.py keeps them the same), with the two helpers BatchNorm's calls from
// kernels/include/common.cuh. They are the yardstick every later rung is checked and timed against. What they leave
// on the table: two full-size intermediate gradients written and read back (three quarters of them zeros), the
// ReLU's output read in full for a mask that matters at one element of four, x read twice, and the sums in C
// blocks, each alone with a whole channel of the batch, with a division and a remainder for every element.
//
// Launch (dev/ladder/bn_backward/op.py, launch_naive): the pool's and the ReLU's backward a thread per element of
// x, blocks of 256; BatchNorm's grid C, blocks of 256 threads. The two gradients between them go through dx.


// Sum over a warp by butterfly exchange; every lane ends with the same total (float or double).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). Every thread gets the total.
// The order of additions depends only on blockDim.x, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// dx[n,c,h,w] = dy of its window if (h,w) was that window's argmax, else 0.
extern "C" __global__ void maxpool2x2_backward_naive(const float* dy, const unsigned char* argmax, float* dx, int N,
                                                     int C, int H, int W) {
    const int Ho = H / 2, Wo = W / 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * H * W) return;
    int iw = idx % W, ih = (idx / W) % H, nc = idx / (W * H);
    int oh = ih / 2, ow = iw / 2;
    float g = 0.0f;
    if (oh < Ho && ow < Wo) {
        int out = (nc * Ho + oh) * Wo + ow;
        if (argmax[out] == (ih % 2) * 2 + iw % 2) g = dy[out];
    }
    dx[idx] = g;
}

// y is ReLU's output: like PyTorch, the gradient passes where y > 0.
extern "C" __global__ void relu_backward_naive(const float* dy, const float* y, float* dx, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// Backward through the batch statistics, one block per channel:
//   dbeta = sum dy, dgamma = sum dy*xhat,
//   dx = gamma*invstd/count * (count*dy - dbeta - xhat*dgamma),  xhat = (x - mean)*invstd.
extern "C" __global__ void batchnorm_backward_naive(const float* dy, const float* x, const float* mean,
                                                    const float* invstd, const float* gamma, float* dx, float* dgamma,
                                                    float* dbeta, int N, int C, int HW) {
    const int c = blockIdx.x, count = N * HW;
    const float m = mean[c], is = invstd[c];
    float sdy = 0.0f, sdyx = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        int at = ((i / HW) * C + c) * HW + i % HW;
        sdy += dy[at];
        sdyx += dy[at] * (x[at] - m) * is;
    }
    const float db = block_sum(sdy), dg = block_sum(sdyx);
    if (threadIdx.x == 0) {
        dbeta[c] = db;
        dgamma[c] = dg;
    }
    const float scale = gamma[c] * is / count;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        int at = ((i / HW) * C + c) * HW + i % HW;
        dx[at] = scale * (count * dy[at] - db - (x[at] - m) * is * dg);
    }
}
