"""``python -m gpuir.service serve|serve-keys ...`` (the same commands as ``gpuir serve``)."""

import sys

from .cli import main

sys.exit(main())
