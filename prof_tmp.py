import os, time
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import numpy as np
from gpuir import Memory
from gpuir.cluster import ShardedMemory, runtime
from gpuir.eval.records import locomo_records
from gpuir.eval.datasets import load_locomo
runtime.connect(None, num_cpus=2, num_gpus=0)
records = locomo_records(); ds = load_locomo()
qs = ds.queries[::9]; queries=[q.text for q in qs]; convs=[q.group for q in qs]
import shutil; shutil.rmtree("/tmp/rayx/p", ignore_errors=True)
T=time.time()
def t(m):
    global T; print(m, round(time.time()-T,2)); T=time.time()
one = Memory(); sm = ShardedMemory.create("/tmp/rayx/p", shards=2, route="id"); t("create")
for i in range(0, len(records), 1500):
    sm.add(records[i:i+1500]); one.add(records[i:i+1500])
t("add")
print(len(one.snapshot().views))
for kw in [{}, {"where":[{"tenant": c} for c in convs]}, {"mode":"newest"}, {"where": {"time": {"gte": "2023-06-01", "lt": "2023-09-01"}}}]:
    one.search(queries, k=10, backend="numba", **kw); t("one "+str(list(kw)))
    r=sm.search(queries, k=10, backend="numba", **kw); t("sm "+str(list(kw))); print(r.meta["timings"])
sm.close()
