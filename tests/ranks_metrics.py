"""Run under torchrun (2 ranks, gloo): ranks that log different metrics, and a rank whose
evaluation saw no batch, still reduce together. Each rank writes its result as JSON to
RESULTS_DIR/rank<N>.json (stdout lines of two ranks can interleave)."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from optimus_preflight.training.distributed import all_reduce_sum, union_of_names
from optimus_preflight.training.user_metrics import MetricCollector

dist.init_process_group("gloo")
rank = dist.get_rank()
collector = MetricCollector()
collector.start_eval()
if rank == 0:  # rank 1's shard is empty: it logs nothing
    collector.set_batch_weight(4)
    collector.log("acc", torch.tensor(0.5))
evaluated = collector.end_eval(all_reduce_sum, union_of_names)
collector.start_step()
collector.log("only_on_this_rank" if rank == 1 else "shared", 2.0 * (rank + 1))
stepped = collector.step_values(all_reduce_sum, union_of_names)
result = {"rank": rank, "eval": evaluated, "step": stepped}
(Path(os.environ["RESULTS_DIR"]) / f"rank{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
