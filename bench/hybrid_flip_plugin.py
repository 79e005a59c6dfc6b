"""A pytest plugin that makes ``Memory()`` rank hybrid by default: what flipping the default would cost the tests.

Issue 37 asks for ``gpuir.Memory()`` to rank hybrid when the encoder is
installed. This plugin flips the constructor's default (``ranking="bm25"`` ->
``"hybrid"``) for one pytest run, so the cost can be measured without changing
the library::

    /usr/bin/time -f "wall %e s cpu %U+%S s" env PYTHONPATH=$PWD python -m pytest \\
        tests/test_memory_store.py tests/test_memory_scopes.py tests/test_memory_listing.py -q -p no:cacheprovider
    /usr/bin/time -f "wall %e s cpu %U+%S s" env PYTHONPATH=$PWD:$PWD/bench python -m pytest \\
        tests/test_memory_store.py tests/test_memory_scopes.py tests/test_memory_listing.py -q -p no:cacheprovider \\
        -p hybrid_flip_plugin

Figures of one such run are in ``bench/results/hybrid_default_flip_tests_vm.json``.
"""

from gpuir.memory import store

_defaults = list(store.Memory.__init__.__defaults__)
if _defaults[-1] != "bm25":  # the last parameter is ranking
    raise RuntimeError("Memory.__init__'s last default is not ranking='bm25': update this plugin")
_defaults[-1] = "hybrid"
store.Memory.__init__.__defaults__ = tuple(_defaults)
