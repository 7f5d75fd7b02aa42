"""Attention kernels used by the caches, each with a PyTorch twin that is its specification.

``masked_attention`` is the one entry point: it runs the Triton kernel where it can (a CUDA tensor with Triton
installed, or CPU tensors under ``TRITON_INTERPRET=1`` when asked for explicitly) and the PyTorch twin otherwise.
"""

from dlm_decode.kernels.dispatch import masked_attention
from dlm_decode.kernels.reference import attention_reference

__all__ = ["attention_reference", "masked_attention"]
