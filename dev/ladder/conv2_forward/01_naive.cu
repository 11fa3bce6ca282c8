// Rung 01, naive: one thread per output, the loops of the definition, every operand read from global memory.
//   x [N,C,H,W], w [K,C,3,3] -> y [N,K,H,W]   (3x3 convolution, stride 1, zero padding 1, no bias, NCHW)
//
// This is the product's naive kernel, conv2d_forward_naive of kernels/naive/2_conv2d.cu, copied verbatim so that the
// ladder's files stand alone (tests/test_ladder.py keeps the two the same). It is the yardstick every later rung
// is checked and timed against. What it leaves on the table: each input value is read from memory (or cache) by
// up to 9 x K threads, and each weight by N x H x W threads; every multiply-add costs two loads.
//
// Launch (dev/ladder.py): one thread per element of y, blocks of 256 threads.


// y[n,k,h,w] = sum_{c,i,j} x[n,c,h+i-1,w+j-1] * w[k,c,i,j]
extern "C" __global__ void conv2d_forward_naive(const float* x, const float* w, float* y, int N, int C, int K, int H,
                                                int W) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * K * H * W) return;
    int ow = idx % W, oh = (idx / W) % H, k = (idx / (W * H)) % K, n = idx / (W * H * K);
    float acc = 0.0f;
    for (int c = 0; c < C; c++)
        for (int i = 0; i < 3; i++) {
            int ih = oh + i - 1;
            if (ih < 0 || ih >= H) continue;
            for (int j = 0; j < 3; j++) {
                int iw = ow + j - 1;
                if (iw < 0 || iw >= W) continue;
                acc += x[((n * C + c) * H + ih) * W + iw] * w[((k * C + c) * 3 + i) * 3 + j];
            }
        }
    y[idx] = acc;
}
