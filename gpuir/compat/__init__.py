"""Faces of other memory libraries over :class:`gpuir.Memory`: :mod:`gpuir.compat.mem0`."""
