"""Fixed numbers the kernel modules share: ggml's block shapes and llama.cpp's rounding routes.

Imports nothing from the other kernel modules, so every one of them (simd.py included) can
import it.  numba freezes module-level ints as compile-time constants: a kernel that reads
`nb * Q4_0_BYTES` compiles to the same machine code as one that reads `nb * 18`.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

# ---- block shapes (gguf.GGML_QUANT_SIZES): QK* = values per block (ggml's names), *_BYTES = bytes
# per block (ggml's sizeof(block_*)).  Offsets *inside* a block follow ggml's block structs and are
# written as numbers where they are used.

# 32-value blocks (the Q8_0 / Q8_1 activations of these types too)
QK4_0, Q4_0_BYTES = GGML_QUANT_SIZES[T.Q4_0]
QK4_1, Q4_1_BYTES = GGML_QUANT_SIZES[T.Q4_1]
QK5_0, Q5_0_BYTES = GGML_QUANT_SIZES[T.Q5_0]
QK5_1, Q5_1_BYTES = GGML_QUANT_SIZES[T.Q5_1]
QK8_0, Q8_0_BYTES = GGML_QUANT_SIZES[T.Q8_0]
QK4_NL, IQ4_NL_BYTES = GGML_QUANT_SIZES[T.IQ4_NL]
QK_MXFP4, MXFP4_BYTES = GGML_QUANT_SIZES[T.MXFP4]

# 256-value super-blocks: the K-quants, the IQ types but IQ4_NL, and the Q8_K activation
QK_K = GGML_QUANT_SIZES[T.Q8_K][0]
Q2_K_BYTES = GGML_QUANT_SIZES[T.Q2_K][1]
Q3_K_BYTES = GGML_QUANT_SIZES[T.Q3_K][1]
Q4_K_BYTES = GGML_QUANT_SIZES[T.Q4_K][1]
Q5_K_BYTES = GGML_QUANT_SIZES[T.Q5_K][1]
Q6_K_BYTES = GGML_QUANT_SIZES[T.Q6_K][1]
IQ4_XS_BYTES = GGML_QUANT_SIZES[T.IQ4_XS][1]
IQ2_XXS_BYTES = GGML_QUANT_SIZES[T.IQ2_XXS][1]
IQ2_XS_BYTES = GGML_QUANT_SIZES[T.IQ2_XS][1]
IQ2_S_BYTES = GGML_QUANT_SIZES[T.IQ2_S][1]
IQ3_XXS_BYTES = GGML_QUANT_SIZES[T.IQ3_XXS][1]
IQ3_S_BYTES = GGML_QUANT_SIZES[T.IQ3_S][1]
IQ1_S_BYTES = GGML_QUANT_SIZES[T.IQ1_S][1]
IQ1_M_BYTES = GGML_QUANT_SIZES[T.IQ1_M][1]

# ---- rounding routes
# How llama.cpp's CPU backend (x86 with AVX-512 VNNI, the reference build) turns a weight row's
# exact per-super-block integer sums into a float: which of its matmul routes a call takes decides
# the rounding.  The kernels take one of these as their `order` argument (see kernels.ggml_order).
ORDER_DOT = 0  # vec_dot: sum_b (dw*dx)*isum_b - (dmin*dx)*summ_b, one running sum (ggml's split
# of each block over 8 SIMD lanes is not reproduced)
ORDER_TILED = 1  # tiled K/IQ matmul (>= 8 tokens): acc = fma((isum_b*dw) - dmin*summ_b (fused), dx, acc)
ORDER_GEMM = 2  # Q4_K/Q2_K in ggml's repacked layouts, MUL_MAT: FMA chains over 64/128-value steps
ORDER_GEMV = 3  # repacked, one token at a time (MUL_MAT_ID, batch remainders; Q4_0/IQ4_NL/MXFP4
# always): one FMA per block
ORDER_LANES = 4  # SIMD lanes of FMAs, then a tree sum: tinyBLAS (F32 batches), the legacy types
