""":mod:`gpuir.wal` under its former name (the very same module object).

The service once kept a write-ahead log of its own here; it now writes through its memory's own log
(:mod:`gpuir.memory.durable`), and :mod:`gpuir.wal` only reads the old ``service-wal-*.log`` files to
fold them in once. Code that imports ``gpuir.service.wal`` keeps working, monkeypatches included.
"""

import sys

from .. import wal as _wal

sys.modules[__name__] = _wal
