"""Kernels (lessons 04a-05b): the C matmul, quantization, attention kernels, torch.compile."""
