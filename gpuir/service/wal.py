"""The service's write-ahead log: :mod:`gpuir.wal` under its former name (the very same module object).

The log moved below the service so that :mod:`gpuir.cluster` (each shard keeps
one) never imports the service; code that imports ``gpuir.service.wal`` keeps
working, monkeypatches included.
"""

import sys

from .. import wal as _wal

sys.modules[__name__] = _wal
