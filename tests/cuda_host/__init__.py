"""Running the CUDA kernels of ``kernels/*.cu`` on the CPU (see :mod:`cuda_host.harness`)."""

from .harness import (
    SCHEDULES,
    HostBuildError,
    HostModule,
    KernelError,
    build,
    cache_dir,
    find_compiler,
    run_sanitized,
    sanitizer_env,
)

__all__ = [
    "SCHEDULES", "HostBuildError", "HostModule", "KernelError", "build", "cache_dir", "find_compiler",
    "run_sanitized", "sanitizer_env",
]
