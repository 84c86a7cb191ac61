"""bench/gloo_allreduce.py - PyTorch's gloo all_reduce of one fp32 tensor, the
baseline of bench/cluster.sh and bench/all.sh. Run once per host by
deploy/netns-cluster.sh -x, which sets ZPS_NETNS_RANK, ZPS_NETNS_SIZE and
ZPS_NETNS_MASTER (bench/all.sh sets them itself, with ZPS_NETNS_PORT, the
rendezvous port, default 29500, and GLOO_SOCKET_IFNAME=lo, for ranks on
one host); with -H HOSTS -g G, G times per host, each copy a rank of its
own (ZPS_NETNS_LOCAL_RANK J of ZPS_NETNS_LOCAL_SIZE G; rank 0, on host 0,
serves the rendezvous, the others only connect), the G ranks of a host
sharing its link as G zps workers do. Rank 0 prints one line: the median
seconds of an all_reduce over the timed repeats."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    floats, repeats = int(sys.argv[1]), int(sys.argv[2])
    rank = int(os.environ["ZPS_NETNS_RANK"])
    size = int(os.environ["ZPS_NETNS_SIZE"])
    master = os.environ["ZPS_NETNS_MASTER"]
    port = int(os.environ.get("ZPS_NETNS_PORT", "29500"))
    local_size = int(os.environ.get("ZPS_NETNS_LOCAL_SIZE", "1"))
    if local_size > 1:
        # G ranks share a host's cores: one thread each for the reductions.
        torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=size)
    t = torch.ones(floats, dtype=torch.float32)
    times = []
    for i in range(repeats + 1):  # the first one warms up the connections
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        if i > 0:
            times.append(time.perf_counter() - start)
    if rank == 0:
        where = (f"{size} hosts" if local_size == 1 else
                 f"{size} ranks ({size // local_size} hosts x {local_size})")
        print(f"gloo all_reduce of {floats} floats over {where}: median "
              f"{statistics.median(times):.4f} s over {repeats} repeats "
              f"({' '.join(f'{x:.4f}' for x in times)})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
