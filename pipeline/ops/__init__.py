"""Two-phase operators, one family a file; ``base`` holds the contract."""

from .base import Op, OpPlan, TensorSpec
from .conv import CONV2D, Conv2d, padded_k, weights_to_matrix
from .elementwise import ADD_RELU, BIAS_ACT, AddRelu, BiasAct
from .gemm import GEMM, Gemm
from .image import NORMALIZE, Normalize
from .pool import GLOBAL_AVG_POOL, MAXPOOL2D, GlobalAvgPool, MaxPool2d
from .reshape import RESHAPE, Reshape
from .resize_crop import RESIZE_CROP, ResizeCrop
from .softmax import SOFTMAX, TOPK, Softmax, TopK

__all__ = [
    "Op",
    "OpPlan",
    "TensorSpec",
    "Conv2d",
    "CONV2D",
    "padded_k",
    "weights_to_matrix",
    "BiasAct",
    "BIAS_ACT",
    "AddRelu",
    "ADD_RELU",
    "Gemm",
    "GEMM",
    "Normalize",
    "NORMALIZE",
    "MaxPool2d",
    "MAXPOOL2D",
    "GlobalAvgPool",
    "GLOBAL_AVG_POOL",
    "ResizeCrop",
    "RESIZE_CROP",
    "Reshape",
    "RESHAPE",
    "Softmax",
    "SOFTMAX",
    "TopK",
    "TOPK",
]
