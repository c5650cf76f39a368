"""llama.cpp's rounding routes, the kernels' `order` argument: shared by the kernel modules.

Imports nothing from the other kernel modules, so every one of them (simd.py included) can
import it.
"""
from __future__ import annotations

# How llama.cpp's CPU backend (x86 with AVX-512 VNNI, the reference build) turns a weight row's
# exact per-super-block integer sums into a float: which of its matmul routes a call takes decides
# the rounding.  The kernels take one of these as their `order` argument (see kernels.ggml_order).
ORDER_DOT = 0    # vec_dot: sum_b (dw*dx)*isum_b - (dmin*dx)*summ_b, one running sum (ggml's split
                 # of each block over 8 SIMD lanes is not reproduced)
ORDER_TILED = 1  # tiled K/IQ matmul (>= 8 tokens): acc = fma((isum_b*dw) - dmin*summ_b (fused), dx, acc)
ORDER_GEMM = 2   # Q4_K/Q2_K in ggml's repacked layouts, MUL_MAT: FMA chains over 64/128-value steps
ORDER_GEMV = 3   # repacked, one token at a time (MUL_MAT_ID, batch remainders; Q4_0/IQ4_NL/MXFP4
                 # always): one FMA per block
ORDER_LANES = 4  # SIMD lanes of FMAs, then a tree sum: tinyBLAS (F32 batches), the legacy types
