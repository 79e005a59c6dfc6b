"""gpuir."""
