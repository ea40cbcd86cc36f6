"""The machine presets: the papers' servers and today's GPUs, each with the source of its
figures (docs/machines.md); registered in :data:`~.machine.PRESETS` when the package is
imported."""

from __future__ import annotations

from .kernel_model import A100_FIT, H100_FIT
from .machine import PRESETS, GiB, Machine, MiB


def _disco_example() -> Machine:
    # Sized for the default matmul-chain (batch 1024, hidden 4096, 2 GPUs, float32): a weight
    # shard is 4096 x 2048 x 4 B = 32 MiB and one shard's matmul is 2*1024*4096*2048 flop.
    shard = 4096 * 2048 * 4
    return Machine(
        name="disco-example",
        source="DISCO Sec. 2 (Figs. 2-3): 2 GPUs on one host bus; a weight shard's transfer takes "
               "exactly as long as its matmul (1 time unit = 1 s), activations are exchanged for "
               "free, and a GPU holds one weight shard beside its activations",
        gpus=2, gpu_memory=80 * MiB, gpu_flops=float(2 * 1024 * 4096 * 2048),
        gpu_mem_bandwidth=1e15, kernel_latency=0.0, streams=5,
        h2d_bandwidth=float(shard), d2h_bandwidth=float(shard), link_latency=0.0,
        host_bus_bandwidth=float(shard), gpu_gpu_bandwidth=float("inf"), gpu_gpu_latency=0.0,
        cpu_flops=1e9)


H100_ALLOCATABLE = 80_000 * MiB   # h100-sxm's source: what an H100 80GB lets a process use

HOST_MEMORY: dict[str, tuple[int, str]] = {
    "p100x4": (22 * 64 * GiB, "TURNIP Sec. 8: 22 64 GB DDR4-2666 modules, 22 x 64 GiB = "
                              "1408 GiB (the text's total: '1.3TB')"),
    "a100x8": (1152 * GiB, "TURNIP Sec. 8: the p4d.24xlarge's '1.15TB of RAM'; AWS lists "
                           "1152 GiB"),
    "titan-rtx": (128 * GiB, "CoTrain's slides: 'CPU Mem 128GB 2133MHz DDR4', taken as "
                             "128 GiB"),
}
"""The presets' host RAM (``host_memory``) where a paper states it, with its source; the
other presets' is unlimited (docs/host-memory.md).  Kept out of their ``source``, which
every plan records: a plan on an unlimited host stays as it was."""

PRESETS.update({
    "disco-example": _disco_example(),
    "v100": Machine(
        name="v100", source="Beaumont et al. Sec. 7: one V100 16 GB, 12 GB/s PCIe each way; "
        "15.7 TFLOP/s fp32, 125 TFLOP/s fp16 on tensor cores (fp32 accumulate) and 900 GB/s "
        "HBM2 from NVIDIA's V100 datasheet (SXM2)",
        gpus=1, gpu_memory=16 * 10**9, gpu_flops=15.7e12, gpu_half_flops=125e12,
        gpu_mem_bandwidth=900e9, h2d_bandwidth=12e9, d2h_bandwidth=12e9),
    "p100x4": Machine(
        name="p100x4", source="TURNIP Sec. 8: 4x P100 16 GB and 1.3 TB of DDR4-2666 (a 2-socket "
        "Xeon Scalable server, PCIe 3.0); 9.3 TFLOP/s fp32, 18.7 fp16 (half2 arithmetic, no "
        "tensor cores) and 732 GB/s from NVIDIA's P100 PCIe datasheet; PCIe 3.0 x16 at 12 GB/s "
        "(bandwidthTest on a P100 PCIe: 12.2 GB/s in, 12.9 out); the paper gives no topology: "
        "assumed the common 4-GPU layout of one PCIe switch per socket, two GPUs behind each "
        "sharing its x16 uplink (12 GB/s)",
        gpus=4, gpu_memory=16 * GiB, gpu_flops=9.3e12, gpu_half_flops=18.7e12,
        gpu_mem_bandwidth=732e9, h2d_bandwidth=12e9, d2h_bandwidth=12e9,
        host_bus_bandwidth=12e9, gpus_per_bus=2, gpu_gpu_bandwidth=10e9,
        host_memory=HOST_MEMORY["p100x4"][0]),
    "a100x8": Machine(
        name="a100x8", source="TURNIP Sec. 8: AWS p4d.24xlarge, 8x A100 40 GB; 19.5 TFLOP/s fp32, "
        "312 TFLOP/s fp16 on tensor cores (dense) and 1.55 TB/s from NVIDIA's A100 datasheet; "
        "host->GPU measured at ~25 GB/s on p4d, falling to 11-13 GB/s while GPU->host runs "
        "(docs/design.md, Vocabulary); the HGX A100 8-GPU board's 4 PCIe Gen4 switches, 2 GPUs "
        "behind each, their x16 uplink taken at a GPU link's 25 GB/s",
        gpus=8, gpu_memory=40 * GiB, gpu_flops=19.5e12, gpu_half_flops=312e12,
        gpu_mem_bandwidth=1555e9, h2d_bandwidth=25e9, d2h_bandwidth=25e9, duplex=0.48,
        host_bus_bandwidth=25e9, gpus_per_bus=2, gpu_gpu_bandwidth=300e9, cpu_flops=2e12,
        cost="fitted", kernel_fit=A100_FIT, host_memory=HOST_MEMORY["a100x8"][0]),
    "titan-rtx": Machine(
        name="titan-rtx", source="CoTrain's evaluation server (its slides): one TITAN RTX, PCIe "
        "3.0, a 14-core Xeon E5-2683 at 2.0 GHz; 24 GB GDDR6 at 672 GB/s and 16.3 TFLOP/s fp32 "
        "from NVIDIA's TITAN RTX datasheet (the slides' 'HBM2' is a slip); 130 TFLOP/s fp16 on "
        "tensor cores (NVIDIA's TITAN RTX page; at full rate with fp32 accumulate, as the "
        "Quadro RTX 8000's datasheet gives for the same TU102: 130.5); PCIe 3.0 x16 at "
        "~12 GB/s each way in practice (15.75 GB/s raw); the CPU's AVX2 peak 14 x 2.0 GHz x 32 "
        "fp32 flop/cycle = 896 GFLOP/s",
        gpus=1, gpu_memory=24 * GiB, gpu_flops=16.3e12, gpu_half_flops=130e12,
        gpu_mem_bandwidth=672e9, h2d_bandwidth=12e9, d2h_bandwidth=12e9, cpu_flops=896e9,
        host_memory=HOST_MEMORY["titan-rtx"][0]),
    "h100-pcie": Machine(
        name="h100-pcie", source="one H100 PCIe 80 GB: 51 TFLOP/s fp32, 756 TFLOP/s fp16 on "
        "tensor cores (dense; 1,513 with sparsity) and 2.0 TB/s HBM2e from NVIDIA's H100 PCIe "
        "product brief (PB-11133-001); PCIe 5.0 x16, 64 GB/s raw each way, taken as 50 GB/s of "
        "pinned copies; a pair joined by an NVLink bridge at 600 GB/s (300 each way); memory: "
        "what a process can allocate, as measured on an H100 SXM (h100-sxm)",
        gpus=1, gpu_memory=H100_ALLOCATABLE, gpu_flops=51e12, gpu_half_flops=756e12,
        gpu_mem_bandwidth=2.0e12, h2d_bandwidth=50e9, d2h_bandwidth=50e9,
        gpu_gpu_bandwidth=300e9),
    "h100-sxm": Machine(
        name="h100-sxm", source="an HGX H100 board, 8x H100 SXM5 80 GB: 66.9 TFLOP/s fp32, "
        "989 TFLOP/s fp16 on tensor cores (dense; 1,979 with sparsity) and 3.35 TB/s HBM3 "
        "(NVIDIA's H100 datasheet); NVLink 4 through NVSwitch, 900 GB/s per GPU (450 each way); "
        "PCIe 5.0 x16 to the host, taken as 50 GB/s of pinned copies; memory: what a process "
        "can allocate, measured on an H100 80GB HBM3 (driver 580, CuPy 14.2): 81,079 MiB, "
        "80,552 free once the CUDA context exists, 80,512 in one cudaMalloc, less 64 MiB for "
        "each of 5 streams' cuBLAS handles and workspaces, rounded down to 80,000 MiB",
        gpus=8, gpu_memory=H100_ALLOCATABLE, gpu_flops=66.9e12, gpu_half_flops=989e12,
        gpu_mem_bandwidth=3.35e12, h2d_bandwidth=50e9, d2h_bandwidth=50e9,
        gpu_gpu_bandwidth=450e9, cost="fitted", kernel_fit=H100_FIT),
    "h200": Machine(
        name="h200", source="an HGX H200 board, 8x H200 141 GB: the H100 SXM's compute "
        "(66.9 TFLOP/s fp32, 989 fp16 on tensor cores, dense) with 141 GB of HBM3e at 4.8 TB/s "
        "(NVIDIA's H200 datasheet); NVLink 4, 900 GB/s per GPU (450 each way); PCIe 5.0 host "
        "links as h100-sxm; memory: nvidia-smi's 143,771 MiB on an H200 less what the H100 "
        "lost between nvidia-smi's total and its largest cudaMalloc (1,047 MiB) and its "
        "streams (320 MiB), rounded down to 142,000 MiB (derived, not measured on an H200)",
        gpus=8, gpu_memory=142_000 * MiB, gpu_flops=66.9e12, gpu_half_flops=989e12,
        gpu_mem_bandwidth=4.8e12, h2d_bandwidth=50e9, d2h_bandwidth=50e9,
        gpu_gpu_bandwidth=450e9),
    "rtx4090": Machine(
        name="rtx4090", source="a desktop GeForce RTX 4090 24 GB: 82.6 TFLOP/s fp32, 165.2 "
        "TFLOP/s fp16 on tensor cores with fp32 accumulate (GeForce halves it: 330.3 with fp16 "
        "accumulate) and 1008 GB/s GDDR6X (NVIDIA's Ada whitepaper, Appendix A); PCIe 4.0 x16, "
        "31.5 GB/s raw each way, taken as 25 GB/s of pinned copies; no NVLink and no peer "
        "access on GeForce, so a second card is reached through host RAM (taken as 12 GB/s)",
        gpus=1, gpu_memory=24 * GiB, gpu_flops=82.6e12, gpu_half_flops=165.2e12,
        gpu_mem_bandwidth=1008e9, h2d_bandwidth=25e9, d2h_bandwidth=25e9,
        gpu_gpu_bandwidth=12e9),
})
